"""A trained tagging run's hits grouped by input length, for the analyses that score by length."""

from __future__ import annotations

import numpy as np

import symjax
from symjax import tasks


def hits_by_length(workdir: str, split: str) -> dict[int, np.ndarray]:
  """Whether a trained tagging run tags each tagged position of ``split`` right, [sequences, positions] per
  length (the number of tagged positions)."""
  run = symjax.load(workdir)
  task = tasks.get_task(run.config)
  hits: dict[int, list[np.ndarray]] = {}
  for batch in task.eval_batches(split, 256, run.config.data_seed):
    logits = run.model.apply({'params': run.params}, batch['inputs'], batch['key_mask'])
    correct = np.asarray(logits).argmax(-1) == batch['targets']
    for row, weight in zip(correct, batch['weights'] > 0):
      if weight.any():
        hits.setdefault(int(weight.sum()), []).append(row[weight])
  return {length: np.stack(rows) for length, rows in hits.items()}
