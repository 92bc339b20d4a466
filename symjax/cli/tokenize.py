"""Tokenizes a text file once into a memory-mapped token folder for ``--config.token_path``.

  python -m symjax.cli.tokenize --text_path=corpus.txt --out=corpus_tokens [--tokenizer=bpe --bpe_vocab_size=4096]

Streams the file (memory stays about --chunk_chars characters whatever its size) and writes
``tokens.bin`` (uint16, or uint32 above 65,536 tokens), ``vocab.json`` and ``meta.json``. Training then
reads windows from the map without loading the corpus: ``python -m symjax.main
--config=configs/token_factored.py:task=text --config.token_path=corpus_tokens``.
"""

import sys
import time

from absl import app, flags

from symjax.system.errors import InputError
from symjax.tasks import text

_TEXT = flags.DEFINE_string('text_path', None, 'The UTF-8 text file.')
_OUT = flags.DEFINE_string('out', None, 'A new folder for tokens.bin, vocab.json and meta.json.')
_TOKENIZER = flags.DEFINE_enum('tokenizer', 'char', list(text.TOKENIZERS), 'Vocabulary type.')
_BPE_SIZE = flags.DEFINE_integer('bpe_vocab_size', 512, 'Vocabulary size of a byte-pair tokenizer.')
_CHUNK = flags.DEFINE_integer('chunk_chars', 1 << 22, 'Characters read at a time.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not _TEXT.value or not _OUT.value:
    raise app.UsageError('--text_path and --out are required')
  start = time.time()
  try:
    meta = text.write_token_file(_TEXT.value, _OUT.value, _TOKENIZER.value, _BPE_SIZE.value, _CHUNK.value)
  except InputError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)
  print(f"{meta['count']:,} {meta['tokenizer']} tokens ({meta['dtype']}) from {meta['source_bytes']:,} bytes "
        f'in {time.time() - start:.1f} s: {_OUT.value}')


if __name__ == '__main__':
  app.run(main)
