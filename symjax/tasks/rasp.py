"""The RASP tasks (Weiss et al. 2021) as generated for "Learning Transformer Programs" (Friedman et al.
2023, Table 1 and Appendix B.2): per-position tagging, token accuracy over non-PAD positions.

Published setting: vocab_size = 8 (special tokens included), max_len = 8, min_len = 1; Dyck at
max_len = 16. Every input starts with ``<s>``; reverse and sort also end with ``</s>``; sequences are
right-padded with ``<pad>`` to max_len and PAD inputs are never attended to.

| task        | symbols           | content length    | tag at each position                          | attention     |
|-------------|-------------------|-------------------|-----------------------------------------------|---------------|
| reverse     | 0..4              | 1..max_len-2      | PAD, reversed(x), PAD                          | bidirectional |
| sort        | 0..4              | 1..max_len-2      | PAD, sorted(x), PAD                            | bidirectional |
| hist        | 0..5              | 1..max_len-1      | PAD, count of x_i in x                         | bidirectional |
| double_hist | 0..5              | 1..max_len-1      | PAD, #distinct symbols with count = count(x_i) | bidirectional |
| most_freq   | 0..5              | 1..max_len-1      | PAD, distinct symbols by (−count, first), <s>  | bidirectional |
| dyck1/dyck2 | ( ) / ( ) { }     | max_len-1         | PAD, P / T / F per prefix                      | causal        |

most_freq orders the distinct symbols by decreasing count, ties by first index, then ends with <s>.
Counts are tagged with their own tokens ``#1``, ``#2``, ... so that a count is never read as a symbol.
Splits: 20,000 distinct sequences, 10% test, 10% of the rest validation (16,200 / 1,800 / 2,000). reverse
and sort have only 5 + 5² + ... + 5⁶ = 19,530 distinct inputs at this setting; they use all of them
(15,819 / 1,758 / 1,953). Length generalisation (train at 8, evaluate at 12 and 16) is defined for every
task but Dyck, whose length is fixed: splits ``length_12`` and ``length_16`` of up to 2,000 sequences.
"""

from __future__ import annotations

import itertools

import numpy as np

from symjax.system.errors import InputError
from symjax.tasks import base

TASKS = ('reverse', 'sort', 'hist', 'double_hist', 'most_freq', 'dyck1', 'dyck2')
PUBLISHED = {'reverse': 99.79, 'hist': 100.0, 'double_hist': 98.40, 'sort': 99.83, 'most_freq': 75.69,
             'dyck1': 99.30, 'dyck2': 99.09}  # Transformer Programs, test token accuracy (%), Table 1
GENERALISATION_LENGTHS = (12, 16)
NUM_SEQUENCES = 20_000
BRACKETS = {'dyck1': ('()',), 'dyck2': ('()', '{}')}


def symbols(task: str, vocab_size: int = 8) -> list[str]:
  if task.startswith('dyck'):
    return [c for pair in BRACKETS[task] for c in pair]
  n = vocab_size - 3 if task in ('reverse', 'sort') else vocab_size - 2
  return [str(i) for i in range(n)]


def content_lengths(task: str, max_len: int) -> tuple[int, int]:
  if task.startswith('dyck'):
    return max_len - 1, max_len - 1
  return 1, max_len - 2 if task in ('reverse', 'sort') else max_len - 1


def count_token(n: int) -> str:
  return f'#{n}'


def tags(task: str, x: list[str]) -> list[str]:
  """Tags for the content x (without ``<s>``/``</s>``); one per content position."""
  if task == 'reverse':
    return x[::-1]
  if task == 'sort':
    return sorted(x)
  counts = {s: x.count(s) for s in x}
  if task == 'hist':
    return [count_token(counts[s]) for s in x]
  if task == 'double_hist':
    return [count_token(sum(1 for c in counts.values() if c == counts[s])) for s in x]
  if task == 'most_freq':
    order = sorted(counts, key=lambda s: (-counts[s], x.index(s)))
    return order + [base.BOS] * (len(x) - len(order))
  if task.startswith('dyck'):
    return dyck_tags(x, BRACKETS[task])
  raise InputError(f'unknown RASP task {task!r}; known: {list(TASKS)}')


def reverse_source_positions(inputs: np.ndarray, v: base.Vocab) -> np.ndarray:
  """``[n, time, time]`` bool for ``reverse``: [i, q, t] when the tag at q is the input at t. The content
  x_1..x_l sits at positions 1..l (after ``<s>``), and the tag at q is x_{l+1-q}."""
  n, t = inputs.shape
  length = (np.isin(inputs, [v.id(s) for s in base.SPECIALS]) == 0).sum(-1)        # l per example
  q = np.arange(t)[None, :]
  source = length[:, None] + 1 - q                                                  # [n, q]
  valid = (q >= 1) & (q <= length[:, None])
  out = np.zeros((n, t, t), bool)
  ii, qq = np.nonzero(valid)
  out[ii, qq, source[ii, qq]] = True
  return out


def dyck_tags(x: list[str], pairs: tuple[str, ...]) -> list[str]:
  """Per prefix: T if balanced, P if a valid unfinished prefix, F from the first error on."""
  closing = {close: open_ for open_, close in pairs}
  stack: list[str] = []
  out, failed = [], False
  for c in x:
    if not failed:
      if c in closing:
        if stack and stack[-1] == closing[c]:
          stack.pop()
        else:
          failed = True
      else:
        stack.append(c)
    out.append('F' if failed else ('T' if not stack else 'P'))
  return out


def balanced(rng: np.random.Generator, pairs: tuple[str, ...], max_depth: int, target_len: int) -> list[str]:
  """A random balanced string built by randomly wrapping or appending, nesting depth <= max_depth."""
  s: list[str] = []
  depth = 0
  while len(s) + 2 <= target_len:
    pair = pairs[rng.integers(len(pairs))]
    if s and depth < max_depth and rng.random() < 0.5:
      s, depth = [pair[0], *s, pair[1]], depth + 1
    else:
      s, depth = s + [pair[0], pair[1]], max(depth, 1)
  return s


def sample_content(task: str, rng: np.random.Generator, max_len: int, vocab_size: int) -> list[str]:
  syms = symbols(task, vocab_size)
  lo, hi = content_lengths(task, max_len)
  if task.startswith('dyck'):
    n = max_len - 1
    if rng.random() < 0.5:
      s = balanced(rng, BRACKETS[task], max_len // 2, int(rng.integers(2, n + 2)))
      s = s[:n] + [syms[i] for i in rng.integers(len(syms), size=max(0, n - len(s)))]
      return s
    return [syms[i] for i in rng.integers(len(syms), size=n)]
  length = int(rng.integers(lo, hi + 1))
  return [syms[i] for i in rng.integers(len(syms), size=length)]


def vocab(task: str, vocab_size: int = 8, max_len: int = 16) -> base.Vocab:
  extra = []
  if task in ('hist', 'double_hist'):
    extra = [count_token(n) for n in range(1, max_len + 1)]
  elif task.startswith('dyck'):
    extra = ['P', 'T', 'F']
  return base.Vocab([*base.SPECIALS, *symbols(task, vocab_size), *extra])


def encode(task: str, content: list[str], max_len: int, v: base.Vocab) -> tuple[np.ndarray, np.ndarray]:
  inputs = [base.BOS, *content] + ([base.EOS] if task in ('reverse', 'sort') else [])
  targets = [base.PAD, *tags(task, content)] + ([base.PAD] if task in ('reverse', 'sort') else [])
  pad = [base.PAD] * (max_len - len(inputs))
  return v.encode(inputs + pad), v.encode(targets + pad)


def possible_sequences(task: str, max_len: int, vocab_size: int) -> int:
  n = len(symbols(task, vocab_size))
  lo, hi = content_lengths(task, max_len)
  return sum(n ** l for l in range(lo, hi + 1))


def distinct_contents(task, rng, max_len, vocab_size, count) -> list[tuple[str, ...]]:
  """``count`` distinct contents sampled as the task samples them — or, when no more than ``count``
  exist, all of them (sampling would take ever longer to find the last few)."""
  if possible_sequences(task, max_len, vocab_size) <= count:
    syms = symbols(task, vocab_size)
    lo, hi = content_lengths(task, max_len)
    return [c for l in range(lo, hi + 1) for c in itertools.product(syms, repeat=l)]
  seen: set[tuple[str, ...]] = set()
  order: list[tuple[str, ...]] = []
  while len(order) < count:
    s = tuple(sample_content(task, rng, max_len, vocab_size))
    if s not in seen:
      seen.add(s)
      order.append(s)
  return order


def all_inputs(task: str, max_len: int, vocab_size: int, v: base.Vocab) -> np.ndarray:
  """Every input the task generates at ``max_len`` (token ids ``[n, max_len]``, right-padded), by content
  length, then in lexicographic order of the symbols."""
  ids = np.array([v.id(s) for s in symbols(task, vocab_size)])
  lo, hi = content_lengths(task, max_len)
  eos = task in ('reverse', 'sort')
  rows = []
  for length in range(lo, hi + 1):
    content = ids[np.indices((len(ids),) * length).reshape(length, -1).T]
    row = np.full((len(content), max_len), v.id(base.PAD))
    row[:, 0] = v.id(base.BOS)
    row[:, 1:length + 1] = content
    if eos:
      row[:, length + 1] = v.id(base.EOS)
    rows.append(row)
  return np.concatenate(rows)


def _generate(name: str, v: base.Vocab, data_seed: int, seq_len: int, vocab_size: int, num_sequences: int
              ) -> base.SequenceDataset:
  """Task ``name``'s ``num_sequences`` distinct sequences drawn from ``data_seed``, split; for a task whose
  attention is bidirectional, also 2,000 longer ones of each of ``GENERALISATION_LENGTHS`` (``length_<n>``),
  none with a content the others hold."""
  rng = base.rng_for(data_seed, 'rasp', name)
  contents = distinct_contents(name, rng, seq_len, vocab_size, num_sequences)
  arrays = [encode(name, list(c), seq_len, v) for c in contents]
  data = base.split_distinct(np.stack([a for a, _ in arrays]), np.stack([b for _, b in arrays]), rng)
  if not name.startswith('dyck'):
    train = set(contents)
    for length in GENERALISATION_LENGTHS:
      longer = [c for c in distinct_contents(name, base.rng_for(data_seed, 'rasp', name, length), length,
                                             vocab_size, 2_000 + len(train)) if c not in train][:2_000]
      arrays = [encode(name, list(c), length, v) for c in longer]
      data.inputs[f'length_{length}'] = np.stack([a for a, _ in arrays])
      data.targets[f'length_{length}'] = np.stack([b for _, b in arrays])
  return data


class RaspTask(base.FixedSetTask):
  """One RASP task; ``split`` ``length_12`` / ``length_16`` exist for the length-generalisation tasks."""

  def __init__(self, name: str, data_seed: int = 0, max_len: int | None = None, vocab_size: int = 8,
               num_sequences: int = NUM_SEQUENCES):
    if name not in TASKS:
      raise InputError(f'config.task must name a RASP task {list(TASKS)}, got {name!r}')
    self.name, self.vocab_size = name, vocab_size
    self.symbols = tuple(symbols(name, vocab_size))
    self.causal = name.startswith('dyck')
    self.seq_len = max_len or (16 if self.causal else 8)
    longest = self.seq_len if self.causal else max(GENERALISATION_LENGTHS)
    self.vocab = vocab(name, vocab_size, longest)
    self.pad_id = self.vocab.id(base.PAD)
    self.data = base.generated_once(
        ('rasp', name, data_seed, self.seq_len, vocab_size, num_sequences),
        lambda: _generate(name, self.vocab, data_seed, self.seq_len, vocab_size, num_sequences))
    self.eval_splits = () if self.causal else tuple(f'length_{n}' for n in GENERALISATION_LENGTHS)

  def uniform_length_batches(self, count: int = 2_000, batch_size: int = 500, seed: int = 0
                             ) -> list[dict[str, np.ndarray]]:
    """Batches of ``count`` inputs drawn as the task defines them, each on its own: the content length uniform
    over the task's lengths, then the symbols. The splits hold every input at most once, so most of them have
    the longest content (there are few short ones); here a short input is as likely as a long one. Empty for
    the Dyck tasks, whose content always has one length."""
    lo, hi = content_lengths(self.name, self.seq_len)
    if lo == hi:
      return []
    rng = base.rng_for(seed, 'rasp', self.name, 'uniform')
    arrays = [encode(self.name, sample_content(self.name, rng, self.seq_len, self.vocab_size), self.seq_len,
                     self.vocab) for _ in range(count)]
    inputs, targets = np.stack([a for a, _ in arrays]), np.stack([b for _, b in arrays])
    return [self._make(inputs[i:i + batch_size], targets[i:i + batch_size]) for i in range(0, count, batch_size)]

  def input_space(self, limit: int = 1_000_000) -> tuple[np.ndarray, bool]:
    """The inputs a decompiled program is pruned on: every input the task generates at its length when there
    are at most ``limit`` (exhaustive: True), else those of the train and validation splits (False)."""
    if possible_sequences(self.name, self.seq_len, self.vocab_size) > limit:
      return np.concatenate([self.data.inputs['train'], self.data.inputs['validation']]), False
    return all_inputs(self.name, self.seq_len, self.vocab_size, self.vocab), True
