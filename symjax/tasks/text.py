"""Language modelling on any UTF-8 text file: character-level or byte-pair vocabulary.

The first 90% of the token stream is for training (nanoGPT's split, so results stay comparable); of the
last 10%, the first half is for validation (model selection, tuning) and the second half for test, so the
test text is never read while choosing a model. Training batches are random windows drawn from
(seed, step); evaluation reads a fixed set of windows.
"""

from __future__ import annotations

import json
import os

import numpy as np

from symjax.tasks import base


class CharTokenizer:
  """One token per distinct character of the corpus (sorted), as nanoGPT's shakespeare_char."""

  kind = 'char'

  def __init__(self, chars: list[str]):
    self.vocab = base.Vocab(chars)

  @classmethod
  def train(cls, text: str, vocab_size: int = 0) -> CharTokenizer:
    del vocab_size
    return cls(sorted(set(text)))

  def encode(self, text: str) -> np.ndarray:
    missing = sorted(set(text) - set(self.vocab.index))
    if missing:
      raise ValueError(f'characters not in the vocabulary: {missing[:10]}')
    return np.fromiter((self.vocab.index[c] for c in text), np.int32, len(text))

  def decode(self, ids) -> str:
    return ''.join(self.vocab.decode(ids))

  def to_json(self) -> dict:
    return {'type': 'char', 'tokens': self.vocab.tokens}


class BPETokenizer:
  """A byte-level byte-pair vocabulary trained on the corpus with HuggingFace ``tokenizers``."""

  kind = 'bpe'

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer
    size = tokenizer.get_vocab_size()
    self.vocab = base.Vocab([tokenizer.id_to_token(i) for i in range(size)])

  @classmethod
  def train(cls, text: str, vocab_size: int) -> BPETokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text[i:i + 100_000] for i in range(0, len(text), 100_000)], trainer)
    return cls(tok)

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self.tokenizer.encode(text).ids, np.int32)

  def decode(self, ids) -> str:
    return self.tokenizer.decode([int(i) for i in ids])

  def to_json(self) -> dict:
    return {'type': 'bpe', 'tokenizer': self.tokenizer.to_str()}


TOKENIZERS = {'char': CharTokenizer, 'bpe': BPETokenizer}


def tokenizer_from_json(d: dict):
  if d.get('type') == 'char':
    return CharTokenizer(d['tokens'])
  if d.get('type') == 'bpe':
    from tokenizers import Tokenizer
    return BPETokenizer(Tokenizer.from_str(d['tokenizer']))
  raise ValueError(f"unknown tokenizer type {d.get('type')!r} in vocabulary file; known: {list(TOKENIZERS)}")


def read_corpus(path: str) -> str:
  if not path:
    raise ValueError("config.text_path is empty: task 'text' needs the path of a UTF-8 text file")
  if not os.path.isfile(path):
    raise ValueError(f'config.text_path {path!r} does not exist or is not a file')
  try:
    with open(path, encoding='utf-8') as f:
      return f.read()
  except UnicodeDecodeError as e:
    raise ValueError(f'config.text_path {path!r} is not UTF-8 text: {e}') from None


class TextTask(base.Task):
  """Next-token prediction on windows of ``seq_len`` tokens."""

  name = 'text'
  causal = True
  language_model = True

  def __init__(self, path: str, seq_len: int, tokenizer: str = 'char', bpe_vocab_size: int = 512,
               eval_windows: int = 256, vocab_file: str | None = None):
    """``vocab_file``: a saved vocabulary (JSON) to reuse instead of training one on the corpus."""
    if tokenizer not in TOKENIZERS:
      raise ValueError(f'config.tokenizer must be one of {list(TOKENIZERS)}, got {tokenizer!r}')
    text = read_corpus(path)
    if not text.strip():
      raise ValueError(f'config.text_path {path!r} is empty')
    if vocab_file and os.path.exists(vocab_file):
      with open(vocab_file) as f:
        self.tokenizer = tokenizer_from_json(json.load(f))
    else:
      self.tokenizer = TOKENIZERS[tokenizer].train(text, bpe_vocab_size)
    self.vocab = self.tokenizer.vocab
    ids = self.tokenizer.encode(text)
    self.seq_len = seq_len
    cut, held_out = int(0.9 * len(ids)), int(0.95 * len(ids))
    self.streams = {'train': ids[:cut], 'validation': ids[cut:held_out], 'test': ids[held_out:]}
    for split in base.SPLITS:
      if len(self.streams[split]) < seq_len + 2:
        raise ValueError(
            f'config.text_path {path!r} is too short: its {split} part has {len(self.streams[split])} '
            f'tokens, fewer than seq_len + 2 = {seq_len + 2}; use a longer text or a smaller seq_len')
    self.eval_windows = eval_windows

  def _windows(self, split: str, starts: np.ndarray) -> dict[str, np.ndarray]:
    stream = self.streams[split]
    windows = np.stack([stream[s:s + self.seq_len + 1] for s in starts])
    return {'inputs': windows[:, :-1], 'targets': windows[:, 1:],
            'weights': np.ones((len(starts), self.seq_len), np.float32),
            'key_mask': np.ones((len(starts), self.seq_len), bool)}

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

  def describe(self, example, i=0):
    return repr(self.tokenizer.decode(example['inputs'][i]))
