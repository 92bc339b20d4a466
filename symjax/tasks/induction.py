"""The in-context learning (induction) task of "Learning Transformer Programs" (Friedman et al. 2023, §4.1).

Letters {a, b, c, d}, numbers {0, 1, 2, 3}; each sequence draws its own letter -> number map (many-to-one
allowed). After ``<s>`` come 4 letter-number pairs; then with probability ½ a random number is inserted
right after ``<s>``, otherwise a final query letter is appended: 10 tokens in all. The tag at each letter
is the number mapped to it if that letter appeared earlier in the sequence, else ``<unk>`` (a real
class); ``<s>`` and number positions are PAD (ignored). Attention is causal.

Solving it needs an induction circuit: a previous-token head writes each number's preceding letter, and a
second head matches the current letter against it and copies the number.
"""

from __future__ import annotations

import itertools

import numpy as np

from symjax.tasks import base

LETTERS = ('a', 'b', 'c', 'd')
NUMBERS = ('0', '1', '2', '3')
SEQ_LEN = 10
NUM_SEQUENCES = 20_000


def vocab() -> base.Vocab:
  return base.Vocab([*base.SPECIALS, *LETTERS, *NUMBERS])


def tag_sequence(tokens: list[str]) -> list[str]:
  """Tags of one sequence: at each letter the number that followed its earlier occurrence, else <unk>."""
  seen: dict[str, str] = {}
  tags = []
  for i, tok in enumerate(tokens):
    if tok in LETTERS:
      tags.append(seen.get(tok, base.UNK))
      if i + 1 < len(tokens) and tokens[i + 1] in NUMBERS:
        seen.setdefault(tok, tokens[i + 1])
    else:
      tags.append(base.PAD)
  return tags


def source_positions(inputs: np.ndarray, v: base.Vocab) -> np.ndarray:
  """``[n, time, time]`` bool: [i, q, t] when position t holds the number a letter at q copies — the one
  after the letter's first earlier occurrence that a number followed (what ``tag_sequence`` reads)."""
  letters = np.isin(inputs, [v.id(x) for x in LETTERS])
  numbers = np.isin(inputs, [v.id(x) for x in NUMBERS])
  n, t = inputs.shape
  out = np.zeros((n, t, t), bool)
  # An earlier letter p < q equal to the one at q, followed by a number at p + 1.
  same = (inputs[:, :, None] == inputs[:, None, :]) & letters[:, :, None]     # [n, q, p]
  followed = np.concatenate([numbers[:, 1:], np.zeros((n, 1), bool)], axis=1)  # number at p + 1
  earlier = np.tril(np.ones((t, t), bool), -1)                                 # p < q
  candidates = same & followed[:, None, :] & earlier[None]
  has = candidates.any(-1)
  first = candidates.argmax(-1)
  qi, qq = np.nonzero(has)
  out[qi, qq, first[qi, qq] + 1] = True
  return out


def sample_sequence(rng: np.random.Generator) -> list[str]:
  mapping = {letter: NUMBERS[rng.integers(len(NUMBERS))] for letter in LETTERS}
  letters = [LETTERS[i] for i in rng.integers(len(LETTERS), size=4)]
  pairs = [t for letter in letters for t in (letter, mapping[letter])]
  if rng.random() < 0.5:
    return [base.BOS, NUMBERS[rng.integers(len(NUMBERS))], *pairs]
  return [base.BOS, *pairs, LETTERS[rng.integers(len(LETTERS))]]


def all_inputs(v: base.Vocab) -> np.ndarray:
  """Every sequence the task generates (133,760): each run of 4 letters, each map of its distinct letters to
  numbers, then a number inserted after ``<s>`` or a query letter appended."""
  rows = []
  for letters in itertools.product(LETTERS, repeat=4):
    distinct = sorted(set(letters))
    for numbers in itertools.product(NUMBERS, repeat=len(distinct)):
      mapping = dict(zip(distinct, numbers))
      pairs = [t for letter in letters for t in (letter, mapping[letter])]
      rows += [[base.BOS, n, *pairs] for n in NUMBERS] + [[base.BOS, *pairs, q] for q in LETTERS]
  ids = {token: v.id(token) for token in (base.BOS, *LETTERS, *NUMBERS)}
  return np.array([[ids[t] for t in row] for row in rows], dtype=np.int32)


def _generate(v: base.Vocab, data_seed: int, num_sequences: int) -> base.SequenceDataset:
  """``num_sequences`` distinct sequences drawn from ``data_seed``, split."""
  rng = base.rng_for(data_seed, 'induction')
  seen: set[tuple[str, ...]] = set()
  while len(seen) < num_sequences:
    seen.add(tuple(sample_sequence(rng)))
  sequences = sorted(seen)
  inputs = np.stack([v.encode(s) for s in sequences])
  targets = np.stack([v.encode(tag_sequence(list(s))) for s in sequences])
  return base.split_distinct(inputs, targets, rng)


class InductionTask(base.FixedSetTask):
  name = 'induction'
  causal = True
  seq_len = SEQ_LEN

  def __init__(self, data_seed: int = 0, num_sequences: int = NUM_SEQUENCES):
    self.vocab = vocab()
    self.pad_id = self.vocab.id(base.PAD)
    self.data = base.generated_once(('induction', data_seed, num_sequences),
                                    lambda: _generate(self.vocab, data_seed, num_sequences))

  def input_space(self, limit: int = 1_000_000) -> tuple[np.ndarray, bool]:
    """The inputs a decompiled program is pruned on: all of them (``all_inputs``), exhaustive."""
    del limit  # the whole space is 133,760 sequences
    return all_inputs(self.vocab), True
