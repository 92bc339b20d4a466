"""Scoring a split, in one place: per-token statistics' weighted sums over a batch (loss, correct, top-k
correct, whole sequences), their totals over batches and the summary of a split (loss, perplexity,
accuracy, top-k, sequence accuracy). The trainer's evaluation and ``symjax.load``'s ``evaluate`` both score
with these, so that they give the same numbers."""

from __future__ import annotations

import math
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np


def in_top_k(above: jax.Array, tied: jax.Array, k: int) -> jax.Array:
  """Probability that the target is among the k best under uniformly random tie-breaking: 1 or 0 when no
  logit ties the target's, fractional for tied baselines such as a uniform predictor. A target logit that
  is NaN equals nothing, not even itself (``tied == 0``), and counts as wrong: otherwise a diverged model
  would report an accuracy of 1 beside its NaN loss."""
  return jnp.where(tied > 0, jnp.clip((k - above) / jnp.maximum(tied, 1), 0.0, 1.0), 0.0)


def weighted_metrics(loss: jax.Array, above: jax.Array, tied: jax.Array, batch, top_ks
                     ) -> dict[str, jax.Array]:
  """Sums over the batch (divide by 'weight' for means): loss, correct, top-k correct, whole sequences."""
  weights = batch['weights']
  correct = in_top_k(above, tied, 1)
  has_targets = weights.sum(-1) > 0
  sequence_correct = jnp.all((correct == 1.0) | (weights == 0), -1) & has_targets
  out = {'loss': jnp.sum(loss * weights), 'correct': jnp.sum(correct * weights), 'weight': jnp.sum(weights),
         'sequence_correct': jnp.sum(sequence_correct), 'sequences': jnp.sum(has_targets)}
  for k in top_ks:
    out[f'top{k}_correct'] = jnp.sum(in_top_k(above, tied, k) * weights)
  return out


def summarize(sums: dict[str, float], top_ks) -> dict[str, float]:
  weight = max(sums['weight'], 1e-9)
  loss = sums['loss'] / weight
  out = {'loss': loss, 'perplexity': math.exp(min(loss, 700.0)), 'accuracy': sums['correct'] / weight,
         **{f'top{k}_accuracy': sums[f'top{k}_correct'] / weight for k in top_ks},
         'sequence_accuracy': sums['sequence_correct'] / max(sums['sequences'], 1e-9)}
  return out


def total(per_batch: Iterable[dict]) -> dict[str, Any]:
  """The metric sums of every batch added up, in float64 on the host (arrays of sums, e.g. one per seed,
  add element-wise)."""
  sums: dict[str, Any] = {}
  for batch_sums in per_batch:
    for k, v in jax.device_get(batch_sums).items():
      v = float(v) if np.ndim(v) == 0 else np.asarray(v, np.float64)
      sums[k] = sums.get(k, 0.0) + v
  return sums


def evaluate(eval_step, params, batches: Iterable[dict], top_ks, put=lambda batch: batch) -> dict[str, float]:
  """The summary of ``eval_step``'s metric sums over ``batches``."""
  return summarize(total(eval_step(params, put(batch)) for batch in batches), top_ks)
