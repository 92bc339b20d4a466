"""Language modelling on any UTF-8 text file: character-level or byte-pair vocabulary.

The first 90% of the token stream is for training (nanoGPT's split, so results stay comparable); of the
last 10%, the first half is for validation (model selection, tuning) and the second half for test, so the
test text is never read while choosing a model. Training batches are random windows drawn from
(seed, step); evaluation reads a fixed set of windows.

Corpora larger than memory: ``python -m symjax.cli.tokenize --text_path=corpus.txt --out=corpus_tokens``
tokenizes the file once, streaming it, into ``tokens.bin`` (a flat uint16/uint32 array) with its
``vocab.json`` and ``meta.json`` beside it; ``--config.token_path=corpus_tokens`` then reads that array
through ``numpy.memmap``, so a batch touches only the pages of its own windows. The vocabulary, the token
ids, the splits and the windows of every (seed, step) are the same as from the text itself, so resume stays
exact (``_safe_cut``: where the file may be cut into pieces that tokenize as the whole does).
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from symjax.system import files
from symjax.system.errors import InputError
from symjax.tasks import base


class CharTokenizer:
  """One token per distinct character of the corpus (sorted), as nanoGPT's shakespeare_char."""

  kind = 'char'

  def __init__(self, chars: list[str]):
    self.vocab = base.Vocab(chars)
    # Code point -> id (-1: none), its last entry standing for every code point above the vocabulary's: the
    # corpus is encoded with one array lookup, where a Python loop over its characters held up every start.
    points = [ord(c) for c in self.vocab.tokens if len(c) == 1]
    self._ids = np.full(max(points, default=-1) + 2, -1, np.int32)
    self._ids[points] = [self.vocab.index[chr(p)] for p in points]

  @classmethod
  def train(cls, text: str, vocab_size: int = 0) -> CharTokenizer:
    del vocab_size
    return cls(sorted(set(text)))

  def encode(self, text: str) -> np.ndarray:
    points = np.frombuffer(text.encode('utf-32-le', 'surrogatepass'), np.uint32)
    ids = self._ids[np.minimum(points, len(self._ids) - 1)]
    if (ids < 0).any():
      missing = sorted({chr(p) for p in np.unique(points[ids < 0]).tolist()})
      raise InputError(f'characters not in the vocabulary: {missing[:10]}')
    return ids

  def decode(self, ids) -> str:
    return ''.join(self.vocab.decode(ids))

  def to_json(self) -> dict:
    return {'type': 'char', 'tokens': self.vocab.tokens}


# A byte-level BPE vocabulary holds every byte as a token before it learns any merge; a smaller size asked
# of the trainer would silently give 256.
BPE_MIN_VOCAB = 256


class BPETokenizer:
  """A byte-level byte-pair vocabulary trained on the corpus with HuggingFace ``tokenizers``."""

  kind = 'bpe'

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer
    size = tokenizer.get_vocab_size()
    self.vocab = base.Vocab([tokenizer.id_to_token(i) for i in range(size)])

  @classmethod
  def train(cls, text: str, vocab_size: int) -> BPETokenizer:
    return cls.train_from_chunks(_string_chunks(text), vocab_size)

  @classmethod
  def train_from_chunks(cls, chunks, vocab_size: int) -> BPETokenizer:
    if vocab_size < BPE_MIN_VOCAB:
      raise InputError(f'bpe_vocab_size must be >= {BPE_MIN_VOCAB} (a byte-level BPE vocabulary starts from '
                       f'the {BPE_MIN_VOCAB} bytes), got {vocab_size}')
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(chunks, trainer)
    return cls(tok)

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self.tokenizer.encode(text).ids, np.int32)

  def decode(self, ids) -> str:
    """The text of ``ids``: one id or a sequence of them."""
    ids = [int(i) for i in np.atleast_1d(np.asarray(ids)).ravel()]
    self.vocab.decode(ids)  # an id outside the vocabulary is an InputError, not a silent empty string
    return self.tokenizer.decode(ids)

  def to_json(self) -> dict:
    return {'type': 'bpe', 'tokenizer': self.tokenizer.to_str()}


TOKENIZERS = {'char': CharTokenizer, 'bpe': BPETokenizer}


def tokenizer_from_json(d: dict):
  if d.get('type') == 'char':
    return CharTokenizer(d['tokens'])
  if d.get('type') == 'bpe':
    from tokenizers import Tokenizer
    return BPETokenizer(Tokenizer.from_str(d['tokenizer']))
  raise InputError(f"unknown tokenizer type {d.get('type')!r} in vocabulary file; known: {list(TOKENIZERS)}")


TOKEN_FILE, TOKEN_META, TOKEN_VOCAB = 'tokens.bin', 'meta.json', 'vocab.json'
# Characters of text tokenized at a time, from a file or from memory.
CHUNK_CHARS = 1 << 22


def _hash_ids(digest, ids) -> None:
  """Feeds ``ids`` to ``digest`` as little-endian uint32, in blocks (a memory map stays unloaded)."""
  block = 1 << 22
  for i in range(0, len(ids), block):
    digest.update(np.asarray(ids[i:i + block], '<u4').tobytes())


def token_fingerprint(ids) -> dict:
  """``{'tokens', 'sha256'}`` of a token stream: the same for the same ids whatever their dtype (int32 in
  memory, uint16 or uint32 in a token folder) or storage. A token folder records its own when it is
  written (meta.json), so that opening a large one does not read it all."""
  digest = hashlib.sha256()
  _hash_ids(digest, ids)
  return {'tokens': int(len(ids)), 'sha256': digest.hexdigest()}


def _safe_cut(block: str) -> int:
  r"""The last place in ``block`` where it can be cut so that the pieces tokenize as the whole does: before
  a line end that is followed by a character that is not whitespace ("...|\nc..."); 0 if there is none.

  Why that is safe for the byte-level pre-tokenizer (GPT-2's pattern, which every tokenizer here splits
  words with): no word extends into whitespace, so a word ends before the cut; a run of whitespace W that
  ends at the cut is, inside the text, matched as W by ``\s+(?!\S)`` (the \n after it is whitespace), as
  at the end of a piece; and from the \n on, matching reads the same characters in the piece as in the
  text. (Cutting after the \n would not be safe: " \n" at a piece's end is one word, inside the text two.)
  The character after the \n must not be whitespace for ``str.isspace``, which is true of every character
  of Unicode's White_Space that the pattern's \s matches."""
  i = len(block) - 1  # the character after the line end must be in this block
  while True:
    i = block.rfind('\n', 0, i)
    if i <= 0:
      return 0
    if not block[i + 1].isspace():
      return i


def _line_chunks(blocks):
  """Joins and splits text ``blocks`` into pieces that each end before a line end (``_safe_cut``), so that
  each tokenizes as it does inside the whole text. Text without such a line end stays in one piece."""
  carry = ''
  for block in blocks:
    block = carry + block
    cut = _safe_cut(block)
    carry = block[cut:]
    if cut:
      yield block[:cut]
  if carry:
    yield carry


def _text_chunks(path: str, chunk_chars: int):
  """The file's text (read as ``read_corpus`` reads it: UTF-8, line ends as \\n) in pieces of about
  ``chunk_chars`` characters that tokenize, one by one, as the whole text does (``_line_chunks``)."""
  check_corpus_path(path)

  def blocks():
    with open(path, encoding='utf-8') as f:
      while True:
        try:
          block = f.read(chunk_chars)
        except UnicodeDecodeError as e:
          raise InputError(f'config.text_path {path!r} is not UTF-8 text: {e}') from None
        if not block:
          return
        yield block
  return _line_chunks(blocks())


def _string_chunks(text: str, chunk_chars: int = CHUNK_CHARS):
  """``text`` in the pieces ``_text_chunks`` gives for a file holding it."""
  return _line_chunks(text[i:i + chunk_chars] for i in range(0, len(text), chunk_chars))


def write_token_file(text_path: str, out_dir: str, tokenizer: str = 'char', bpe_vocab_size: int = 512,
                     chunk_chars: int = CHUNK_CHARS) -> dict:
  """Tokenizes ``text_path`` once into ``out_dir``/tokens.bin, streaming: memory stays O(chunk_chars).

  The char vocabulary is every distinct character of the file (a first pass); a BPE vocabulary is trained
  on the whole file as a stream of chunks. Returns the metadata written to meta.json.
  """
  if tokenizer not in TOKENIZERS:
    raise InputError(f'tokenizer must be one of {list(TOKENIZERS)}, got {tokenizer!r}')
  if os.path.exists(os.path.join(out_dir, TOKEN_FILE)):
    raise InputError(f'{out_dir!r} already holds a token file; choose a new folder (nothing was overwritten)')
  if tokenizer == 'char':
    chars = set()
    for chunk in _text_chunks(text_path, chunk_chars):
      chars.update(chunk)
    tok = CharTokenizer(sorted(chars))
  else:
    tok = BPETokenizer.train_from_chunks(_text_chunks(text_path, chunk_chars), bpe_vocab_size)
  if not len(tok.vocab):
    raise InputError(f'config.text_path {text_path!r} is empty')
  dtype = np.uint16 if len(tok.vocab) <= np.iinfo(np.uint16).max + 1 else np.uint32
  os.makedirs(out_dir, exist_ok=True)
  partial = os.path.join(out_dir, TOKEN_FILE + '.partial')
  count, digest = 0, hashlib.sha256()
  with open(partial, 'wb') as f:
    for chunk in _text_chunks(text_path, chunk_chars):
      ids = tok.encode(chunk).astype(dtype)
      f.write(ids.tobytes())
      _hash_ids(digest, ids)
      count += len(ids)
  meta = {'dtype': np.dtype(dtype).name, 'count': count, 'tokenizer': tok.kind,
          'source': os.path.abspath(text_path), 'source_bytes': os.path.getsize(text_path),
          'sha256': digest.hexdigest()}  # token_fingerprint of the ids
  with open(os.path.join(out_dir, TOKEN_VOCAB), 'w') as f:
    json.dump(tok.to_json(), f)
  with open(os.path.join(out_dir, TOKEN_META), 'w') as f:
    json.dump(meta, f, indent=1)
  os.replace(partial, os.path.join(out_dir, TOKEN_FILE))  # complete files only
  return meta


def open_token_file(token_path: str):
  """(tokenizer, read-only memory map of the token ids) of a folder written by ``write_token_file``."""
  names = [os.path.join(token_path, n) for n in (TOKEN_FILE, TOKEN_META, TOKEN_VOCAB)]
  missing = [os.path.basename(n) for n in names if not os.path.isfile(n)]
  if missing:
    raise InputError(f'config.token_path {token_path!r} lacks {missing}: write it with '
                     f'`python -m symjax.cli.tokenize --text_path=... --out={token_path}`')
  try:
    with open(names[1]) as f:
      meta = json.load(f)
    with open(names[2]) as f:
      tok = tokenizer_from_json(json.load(f))
    dtype, count = np.dtype(meta['dtype']), int(meta['count'])
  except (ValueError, KeyError, TypeError) as e:
    raise InputError(f'config.token_path {token_path!r}: unreadable meta.json or vocab.json ({e})') from None
  size = os.path.getsize(names[0])
  if size != count * dtype.itemsize:
    raise InputError(f'config.token_path {token_path!r}: tokens.bin has {size} bytes, meta.json says '
                     f'{count} tokens of {dtype.name} ({count * dtype.itemsize} bytes); rewrite the folder')
  if count == 0:
    raise InputError(f'config.token_path {token_path!r} holds no tokens')
  return tok, np.memmap(names[0], dtype=dtype, mode='r', shape=(count,))


def check_corpus_path(path: str) -> None:
  if not path:
    raise InputError("config.text_path is empty: task 'text' needs the path of a UTF-8 text file")
  if not os.path.isfile(path):
    raise InputError(f'config.text_path {path!r} does not exist or is not a file')


def read_corpus(path: str) -> str:
  check_corpus_path(path)
  try:
    with open(path, encoding='utf-8') as f:
      return f.read()
  except UnicodeDecodeError as e:
    raise InputError(f'config.text_path {path!r} is not UTF-8 text: {e}') from None


class Windows:
  """``[rows, seq_len]`` int32 windows of a token stream, read only where indexed.

  The trainer places a batch with ``jax.make_array_from_callback``, which asks each process only for the
  rows of its own devices; a batch of ``Windows`` over a memory-mapped token file therefore makes each
  process read its own rows of the file and no others. ``np.asarray`` reads every row."""

  dtype = np.dtype(np.int32)
  ndim = 2

  def __init__(self, stream, starts: np.ndarray, seq_len: int, shift: int):
    self.stream, self.starts, self.seq_len, self.shift = stream, np.asarray(starts), seq_len, shift
    self.shape = (len(self.starts), seq_len)

  def __len__(self) -> int:
    return self.shape[0]

  def __getitem__(self, index) -> np.ndarray:
    index = index if isinstance(index, tuple) else (index,)
    rows = np.arange(len(self.starts))[index[0]]
    starts = self.starts[np.atleast_1d(rows)] + self.shift
    out = np.stack([np.asarray(self.stream[s:s + self.seq_len]) for s in starts]).astype(np.int32)
    out = out[(slice(None), *index[1:])]
    return out[0] if np.ndim(rows) == 0 else out

  def __array__(self, dtype=None, copy=None) -> np.ndarray:
    del copy
    out = self[:]
    return out if dtype is None else out.astype(dtype)


class TextTask(base.Task):
  """Next-token prediction on windows of ``seq_len`` tokens."""

  name = 'text'
  causal = True
  language_model = True
  pads_inputs = False  # every window is full: its key_mask is all True

  def __init__(self, path: str, seq_len: int, tokenizer: str = 'char', bpe_vocab_size: int = 512,
               eval_windows: int = 256, vocab_file: str | None = None, token_path: str = ''):
    """``vocab_file``: a saved vocabulary (JSON) to reuse instead of training one on the corpus.
    ``token_path``: a folder of ``write_token_file``, read memory-mapped instead of ``path``."""
    if tokenizer not in TOKENIZERS:
      raise InputError(f'config.tokenizer must be one of {list(TOKENIZERS)}, got {tokenizer!r}')
    if token_path:
      self.tokenizer, ids = open_token_file(token_path)
      if vocab_file and os.path.exists(vocab_file):
        saved = files.read_json(vocab_file)
        if saved != self.tokenizer.to_json():
          raise InputError(f'config.token_path {token_path!r} has another vocabulary than the one this '
                           f'work directory was trained with ({vocab_file})')
      path = token_path
    else:
      text = read_corpus(path)
      if not text.strip():
        raise InputError(f'config.text_path {path!r} is empty')
      if vocab_file and os.path.exists(vocab_file):
        self.tokenizer = tokenizer_from_json(files.read_json(vocab_file))
      else:
        self.tokenizer = TOKENIZERS[tokenizer].train(text, bpe_vocab_size)
      ids = self.tokenizer.encode(text)
    self.vocab = self.tokenizer.vocab
    self.seq_len = seq_len
    self.mapped = bool(token_path)  # batches of Windows, read row by row from the map
    meta = files.read_json(os.path.join(token_path, TOKEN_META)) if token_path else {}
    self.data_fingerprint = ({'tokens': int(meta['count']), 'sha256': meta['sha256']} if 'sha256' in meta
                             else token_fingerprint(ids))  # folders written before meta.json held it
    cut, held_out = int(0.9 * len(ids)), int(0.95 * len(ids))
    self.streams = {'train': ids[:cut], 'validation': ids[cut:held_out], 'test': ids[held_out:]}
    for split in base.SPLITS:
      if len(self.streams[split]) < seq_len + 2:
        raise InputError(
            f'config.text_path {path!r} is too short: its {split} part has {len(self.streams[split])} '
            f'tokens, fewer than seq_len + 2 = {seq_len + 2}; use a longer text or a smaller seq_len')
    self.eval_windows = eval_windows

  def _windows(self, split: str, starts: np.ndarray) -> dict[str, np.ndarray]:
    stream = self.streams[split]
    ones = np.ones((len(starts), self.seq_len), np.float32)
    if self.mapped:  # read where placed: each process its own rows (Windows)
      return {'inputs': Windows(stream, starts, self.seq_len, 0), 'targets': Windows(stream, starts, self.seq_len, 1),
              'weights': ones, 'key_mask': ones.astype(bool)}
    windows = np.stack([stream[s:s + self.seq_len + 1] for s in starts]).astype(np.int32)
    return {'inputs': windows[:, :-1], 'targets': windows[:, 1:], 'weights': ones, 'key_mask': ones.astype(bool)}

  def batch(self, split, step, batch_size, seed):
    base.check_split(split)
    high = len(self.streams[split]) - self.seq_len - 1
    return self._windows(split, base.rng_for(seed, split, step).integers(0, high + 1, batch_size))

  def eval_batches(self, split, batch_size, seed):
    base.check_split(split)
    high = len(self.streams[split]) - self.seq_len - 1
    count = -(-self.eval_windows // batch_size) * batch_size  # whole batches: one compiled shape
    starts = base.rng_for(seed, 'eval', split).integers(0, high + 1, count)
    for i in range(0, count, batch_size):
      yield self._windows(split, starts[i:i + batch_size])
