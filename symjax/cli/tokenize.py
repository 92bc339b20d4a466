"""Tokenizes a text file once into a memory-mapped token folder for ``--config.token_path``.

  python -m symjax.cli.tokenize --text_path=corpus.txt --out=corpus_tokens [--tokenizer=bpe --bpe_vocab_size=4096]

Streams the file (memory stays about --chunk_chars characters whatever its size) and writes
``tokens.bin`` (uint16, or uint32 above 65,536 tokens), ``vocab.json`` and ``meta.json``. Training then
reads windows from the map without loading the corpus: ``python -m symjax.main
--config=configs/token_factored.py:task=text --config.token_path=corpus_tokens``.
"""

import os
import time

from absl import flags

from symjax.cli import usage
from symjax.system import files
from symjax.system.errors import InputError
from symjax.tasks import text

_TEXT = flags.DEFINE_string('text_path', None, 'The UTF-8 text file.')
_OUT = flags.DEFINE_string('out', None, 'A new folder for tokens.bin, vocab.json and meta.json.')
_TOKENIZER = flags.DEFINE_enum('tokenizer', 'char', list(text.TOKENIZERS), 'Vocabulary type.')
_BPE_SIZE = flags.DEFINE_integer('bpe_vocab_size', 512, 'Vocabulary size of a byte-pair tokenizer.')
_CHUNK = flags.DEFINE_integer('chunk_chars', 1 << 22, 'Characters read at a time.')


def main():
  if not os.path.isfile(_TEXT.value):
    raise InputError(f'--text_path {_TEXT.value!r} is not a file')
  start = time.time()
  try:
    with files.refused_leaves_no_folder(_OUT.value):
      meta = text.write_token_file(_TEXT.value, _OUT.value, _TOKENIZER.value, _BPE_SIZE.value, _CHUNK.value)
  except OSError as e:
    if os.path.abspath(e.filename or '').startswith(os.path.abspath(_TEXT.value)):
      raise InputError(f'--text_path {_TEXT.value!r} cannot be read ({e.strerror or e})') from None
    raise usage.output_error(_OUT.value, '--out', e) from None
  print(f"{meta['count']:,} {meta['tokenizer']} tokens ({meta['dtype']}) from {meta['source_bytes']:,} bytes "
        f'in {time.time() - start:.1f} s: {_OUT.value}')


def run():
  usage.run(main, required=['text_path', 'out'], errors=(InputError,))


if __name__ == '__main__':
  run()
