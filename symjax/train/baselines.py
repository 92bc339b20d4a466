"""Baselines scored by the same metric code as the transformers: uniform, and an n-gram model with
Witten–Bell interpolation computed exactly from the training data. (The LSTM baseline is a model kind,
``model.kind='lstm'``, trained by the ordinary trainer.)"""

from __future__ import annotations

import collections

import jax.numpy as jnp
import numpy as np

from symjax.train import metrics


class NGram:
  """P(w | h) for contexts h of the previous n-1 input tokens, Witten–Bell interpolated down to a
  unigram and then the uniform distribution:

    P(w | h) = (c(h, w) + T(h) · P(w | h')) / (c(h) + T(h)),

  with c the training counts, T(h) the number of distinct tokens seen after h, and h' the context
  without its oldest token. Only positions with weight > 0 are counted and scored.
  """

  def __init__(self, order: int, vocab_size: int):
    self.order, self.vocab_size = order, vocab_size
    self.counts: dict[tuple[int, ...], collections.Counter] = collections.defaultdict(collections.Counter)
    self._cache: dict[tuple[int, ...], np.ndarray] = {}

  def contexts(self, row: np.ndarray, t: int):
    """The contexts of position t, longest first: inputs t-n+2..t, ..., inputs t..t, ()."""
    return [tuple(row[max(0, t - k + 1):t + 1]) for k in range(self.order - 1, 0, -1)
            if t - k + 1 >= 0] + [()]

  def fit(self, inputs: np.ndarray, targets: np.ndarray, weights: np.ndarray) -> NGram:
    for row, tgt, w in zip(inputs, targets, weights):
      for t in np.flatnonzero(w > 0):
        for h in self.contexts(row, t):
          self.counts[h][int(tgt[t])] += 1
    return self

  def distribution(self, contexts: list[tuple[int, ...]]) -> np.ndarray:
    key = contexts[0]
    if key in self._cache:
      return self._cache[key]
    lower = (self.distribution(contexts[1:]) if len(contexts) > 1
             else np.full(self.vocab_size, 1.0 / self.vocab_size))
    c = self.counts.get(key)
    if not c:
      p = lower
    else:
      total, types = sum(c.values()), len(c)
      p = lower * types
      ids = np.fromiter(c.keys(), int, len(c))
      p[ids] += np.fromiter(c.values(), float, len(c))
      p = p / (total + types)
    self._cache[key] = p
    return p

  def log_probs(self, inputs: np.ndarray) -> np.ndarray:
    out = np.zeros((*inputs.shape, self.vocab_size), np.float32)
    for b, row in enumerate(inputs):
      for t in range(len(row)):
        out[b, t] = np.log(self.distribution(self.contexts(row, t)))
    return out


def score(logits_fn, task, split: str, batch_size: int, top_ks) -> dict[str, float]:
  """Metrics of a predictor ``inputs -> logits [batch, time, vocab]`` on a split, through the trainer's
  own metric code (``metrics.logit_stats`` and ``metrics.weighted_metrics``)."""
  def batch_sums(batch):
    loss, _, above, tied = metrics.logit_stats(jnp.asarray(logits_fn(batch['inputs'])), jnp.asarray(batch['targets']))
    return metrics.weighted_metrics(loss, above, tied, batch, top_ks)
  sums = metrics.total(batch_sums(batch) for batch in task.eval_batches(split, batch_size, 0))
  return metrics.summarize(sums, top_ks)


def uniform(vocab_size: int):
  return lambda inputs: np.zeros((*inputs.shape, vocab_size), np.float32)
