"""The task interface: every task owns its vocabulary, yields batches, and says how attention is masked.

A batch is a dict of NumPy arrays:
  ``inputs``  [batch, time] int32 token ids
  ``targets`` [batch, time] int32 token ids of the same vocabulary (tags are vocabulary tokens too, so
              every readout stays a mixture of vocabulary tokens)
  ``weights`` [batch, time] float32, 0 where the target is ignored (PAD tags)
  ``key_mask`` [batch, time] bool, False on padding inputs (attention never reads them)
  ``edges``   [batch, time, time] int32, graph tasks only (``Task.has_edges``): the token id of the edge
              i -> j, -1 where there is none (what relational attention reads)

Batches are pure functions of (seed, split, step): resuming a run at step k replays exactly the batches an
uninterrupted run would have seen.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from symjax.system.errors import InputError

PAD, BOS, EOS, UNK = '<pad>', '<s>', '</s>', '<unk>'
SPECIALS = (PAD, BOS, EOS, UNK)
SPLITS = ('train', 'validation', 'test')
# The training split is scored on this many fixed batches (the same ones every time), to compare with
# validation without a pass over the whole training set.
TRAIN_SAMPLE_BATCHES = 4


class Vocab:
  """A list of token strings; id i is ``tokens[i]``."""

  def __init__(self, tokens: Sequence[str]):
    self.tokens = list(tokens)
    if len(set(self.tokens)) != len(self.tokens):
      raise InputError('vocabulary tokens must be distinct')
    self.index = {t: i for i, t in enumerate(self.tokens)}

  def __len__(self) -> int:
    return len(self.tokens)

  def encode(self, tokens: Sequence[str]) -> np.ndarray:
    unknown = [t for t in tokens if t not in self.index]
    if unknown:
      raise InputError(f'tokens not in the vocabulary: {unknown[:5]}; vocabulary: {self.tokens[:20]}')
    return np.asarray([self.index[t] for t in tokens], np.int32)

  def decode(self, ids: int | Sequence[int]) -> list[str]:
    """The tokens of ``ids``: one id or a sequence of them."""
    ids = [int(i) for i in np.atleast_1d(np.asarray(ids)).ravel()]
    bad = [i for i in ids if not 0 <= i < len(self.tokens)]
    if bad:
      raise InputError(f'token ids must be in [0, {len(self.tokens)}) (the vocabulary), got {bad[:5]}')
    return [self.tokens[i] for i in ids]

  def id(self, token: str) -> int:
    return self.index[token]

  def to_json(self) -> dict:
    return {'type': 'tokens', 'tokens': self.tokens}


def rng_for(seed: int, *words: int | str) -> np.random.Generator:
  """An independent NumPy generator for (seed, words...), e.g. (seed, 'train', epoch)."""
  ints = [w if isinstance(w, int) else int.from_bytes(w.encode()[:8].ljust(8, b'\0'), 'little')
          for w in words]
  return np.random.default_rng([seed, *ints])


class Task(abc.ABC):
  """A supervised sequence task."""

  name: str
  vocab: Vocab
  causal: bool
  seq_len: int
  language_model: bool = False  # targets are the next input token: sampling text makes sense
  eval_splits: tuple[str, ...] = ()  # extra splits evaluated at the end (e.g. longer sequences)
  has_edges: bool = False  # batches carry ``edges`` (graph tasks), which relational attention reads
  # Whether a batch's key_mask can hold False (padding inputs). A task whose inputs are never padding (text
  # windows) says False: the step functions then give attention no key mask, so a fused kernel is not
  # handed an all-true mask to add as a [batch, time, time] bias.
  pads_inputs: bool = True
  # What identifies data read from files (text: the token stream's length and hash), recorded in run.json
  # so that a resume on changed data is refused; None for tasks generated from config.data_seed.
  data_fingerprint: dict | None = None
  # The symbols an input's content is drawn from, for a model that starts counting each of them
  # (``model.symbol_counts``); empty where the task names none.
  symbols: tuple[str, ...] = ()

  @abc.abstractmethod
  def batch(self, split: str, step: int, batch_size: int, seed: int) -> dict[str, np.ndarray]:
    """The training-order batch number ``step`` of ``split``."""

  def symbol_ids(self) -> tuple[int, ...]:
    """The token ids of ``symbols``."""
    return tuple(self.vocab.id(s) for s in self.symbols)

  def initial_params(self, params, model_config):
    """The task's changes to freshly initialised parameters (traced under jit), or None for none."""
    del params, model_config
    return None

  @abc.abstractmethod
  def eval_batches(self, split: str, batch_size: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
    """A fixed pass over ``split`` for evaluation."""

  def scored_batches(self, split: str, batch_size: int, data_seed: int) -> Iterable[dict[str, np.ndarray]]:
    """The batches a run scores ``split`` on: every evaluation batch of ``split`` (they depend on
    ``data_seed`` only, so every training seed is scored on the same examples), or for 'train' a fixed
    sample of ``TRAIN_SAMPLE_BATCHES`` training batches."""
    if split == 'train':
      return (self.batch('train', i, batch_size, data_seed + 1) for i in range(TRAIN_SAMPLE_BATCHES))
    return self.eval_batches(split, batch_size, data_seed)

  def split_length(self, split: str) -> int:
    """The tokens per sequence of ``split``."""
    del split
    return self.seq_len


@dataclasses.dataclass
class SequenceDataset:
  """Fixed arrays of examples, split into train/validation/test. ``extras`` holds further per-example
  arrays that batches carry under their own name (e.g. a graph task's ``edges``), and ``extra_fill`` the
  value that pads each of them."""

  inputs: dict[str, np.ndarray]
  targets: dict[str, np.ndarray]
  extras: dict[str, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)
  extra_fill: dict[str, int] = dataclasses.field(default_factory=dict)


# Generating a task's sequences runs in Python, one to three seconds a task; a process that builds the same task
# again (a run and then its loads, a notebook, a sweep, the tests) generates them once. The arrays are shared and
# read-only (writing into one raises); the dictionaries are each task's own.
_GENERATED: dict[tuple, SequenceDataset] = {}


def generated_once(key: tuple, build: Callable[[], SequenceDataset]) -> SequenceDataset:
  """``build()``'s dataset, built once per process for each ``key`` (the task and every argument its data
  depends on)."""
  if key not in _GENERATED:
    data = build()
    for arrays in (data.inputs, data.targets, *data.extras.values()):
      for x in arrays.values():
        x.flags.writeable = False
    _GENERATED[key] = data
  data = _GENERATED[key]
  return SequenceDataset(dict(data.inputs), dict(data.targets), {k: dict(v) for k, v in data.extras.items()},
                         dict(data.extra_fill))


def split_distinct(inputs: np.ndarray, targets: np.ndarray, rng: np.random.Generator,
                   test_fraction: float = 0.1, validation_fraction: float = 0.1,
                   extras: dict[str, np.ndarray] | None = None,
                   extra_fill: dict[str, int] | None = None) -> SequenceDataset:
  """Shuffles and splits: ``test_fraction`` of all for test, then ``validation_fraction`` of the rest.
  ``extras`` (per-example arrays) are shuffled and split with the inputs."""
  order = rng.permutation(len(inputs))
  inputs, targets = inputs[order], targets[order]
  extras = {name: x[order] for name, x in (extras or {}).items()}
  n_test = int(round(test_fraction * len(inputs)))
  n_val = int(round(validation_fraction * (len(inputs) - n_test)))
  cuts = {'test': slice(0, n_test), 'validation': slice(n_test, n_test + n_val),
          'train': slice(n_test + n_val, None)}
  return SequenceDataset({k: inputs[s] for k, s in cuts.items()}, {k: targets[s] for k, s in cuts.items()},
                         {name: {k: x[s] for k, s in cuts.items()} for name, x in extras.items()},
                         dict(extra_fill or {}))


class FixedSetTask(Task):
  """A task over a fixed, pre-generated dataset; training walks through shuffled epochs, or, with
  ``length_balance`` = a > 0, draws each batch's rows with probability proportional to n_L^(-a), n_L the
  training sequences of the row's length (its non-PAD inputs): where nearly every sequence has the longest
  length, the short ones otherwise hardly weigh in the loss (``config.length_balance``)."""

  pad_id: int
  data: SequenceDataset
  length_balance: float = 0.0

  def _make(self, inputs: np.ndarray, targets: np.ndarray, **extras: np.ndarray) -> dict[str, np.ndarray]:
    return {'inputs': inputs.astype(np.int32), 'targets': targets.astype(np.int32),
            'weights': (targets != self.pad_id).astype(np.float32),
            'key_mask': inputs != self.pad_id, **{k: v.astype(np.int32) for k, v in extras.items()}}

  def _extras(self, split: str, rows) -> dict[str, np.ndarray]:
    return {name: x[split][rows] for name, x in self.data.extras.items()}

  def split_size(self, split: str) -> int:
    if split not in self.data.inputs:
      raise InputError(f'split must be one of {list(self.data.inputs)}, got {split!r}')
    return len(self.data.inputs[split])

  def split_length(self, split: str) -> int:
    self.split_size(split)  # the one-line error for an unknown split
    return self.data.inputs[split].shape[1]

  def row_probabilities(self, split: str) -> np.ndarray:
    """What ``length_balance`` draws each row of ``split`` with: n_L^(-a), normalised (computed once per split
    and a, since every training step draws from it)."""
    cache = self.__dict__.setdefault('_row_probabilities', {})
    if (split, self.length_balance) not in cache:
      lengths = (self.data.inputs[split] != self.pad_id).sum(-1)
      _, inverse, counts = np.unique(lengths, return_inverse=True, return_counts=True)
      weights = counts[inverse].astype(np.float64) ** -self.length_balance
      cache[split, self.length_balance] = weights / weights.sum()
    return cache[split, self.length_balance]

  def batch(self, split, step, batch_size, seed):
    n = self.split_size(split)
    if self.length_balance and split == 'train':  # the same rows for the same step: resumes stay exact
      idx = rng_for(seed, split, 'balanced', step).choice(n, batch_size, p=self.row_probabilities(split))
      return self._make(self.data.inputs[split][idx], self.data.targets[split][idx], **self._extras(split, idx))
    per_epoch = max(n // batch_size, 1)
    epoch, k = divmod(step, per_epoch)
    order = rng_for(seed, split, epoch).permutation(n)
    idx = order[(k * batch_size) % n:][:batch_size]
    if len(idx) < batch_size:  # split smaller than a batch: wrap around
      idx = np.resize(order, batch_size)
    return self._make(self.data.inputs[split][idx], self.data.targets[split][idx], **self._extras(split, idx))

  def eval_batches(self, split, batch_size, seed):
    del seed
    n = self.split_size(split)
    for start in range(0, n, batch_size):
      stop = min(start + batch_size, n)
      inputs, targets = self.data.inputs[split][start:stop], self.data.targets[split][start:stop]
      extras = self._extras(split, slice(start, stop))
      if stop - start < batch_size:  # pad the last batch with ignored rows to keep one compiled shape
        fill = batch_size - (stop - start)
        inputs = np.concatenate([inputs, np.full((fill, inputs.shape[1]), self.pad_id)])
        targets = np.concatenate([targets, np.full((fill, targets.shape[1]), self.pad_id)])
        extras = {name: np.concatenate([x, np.full((fill, *x.shape[1:]), self.data.extra_fill.get(name, 0))])
                  for name, x in extras.items()}
      yield self._make(inputs, targets, **extras)


def check_split(split: str) -> None:
  if split not in SPLITS:
    raise InputError(f'split must be one of {list(SPLITS)}, got {split!r}')
