"""Metrics for the trainer: the scoring of a split (``symjax.ops.scoring``: per-token statistics' weighted
sums over a batch, the summary of a split, the evaluation loop; re-exported here), the printed table, and
the NumPy metrics the interpretability tools score ablated logits with."""

from __future__ import annotations

import numpy as np

from symjax.ops.readout import logit_stats  # noqa: F401  (re-exported: scored with weighted_metrics)
from symjax.ops.scoring import evaluate, in_top_k, summarize, total, weighted_metrics  # noqa: F401 (re-exported)


def print_table(title: str, rows: dict[str, dict[str, float]]) -> None:
  columns = sorted({k for r in rows.values() for k in r})
  print(f'\n{title}')
  print(' | '.join(['split'.ljust(10)] + [c.rjust(12) for c in columns]))
  for name, r in rows.items():
    print(' | '.join([name.ljust(10)] + [f'{r[c]:12.4f}' if c in r else ' ' * 12 for c in columns]))


def token_metrics(logits: np.ndarray, targets: np.ndarray, weights: np.ndarray) -> dict[str, float]:
  """Weighted mean cross-entropy and argmax accuracy over the positions with weight > 0."""
  logits = np.asarray(logits, np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
  correct = (logits.argmax(-1) == targets).astype(np.float64)
  w = np.asarray(weights, np.float64)
  weight = max(w.sum(), 1e-12)
  return {'loss': float((nll * w).sum() / weight), 'accuracy': float((correct * w).sum() / weight),
          'count': float(w.sum())}
