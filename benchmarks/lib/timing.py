"""Shared by the benchmark scripts: the median time of a compiled function over timed rounds."""

import statistics
import time

import jax


def median_seconds(fn, *args, steps: int, repeats: int, warmup: int = 2) -> float:
  """Median seconds per call over ``repeats`` rounds of ``steps`` calls, after ``warmup`` calls (which
  include compilation)."""
  for _ in range(warmup):
    out = fn(*args)
  jax.block_until_ready(out)
  rounds = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(steps):
      out = fn(*args)
    jax.block_until_ready(out)
    rounds.append((time.perf_counter() - start) / steps)
  return statistics.median(rounds)
