"""Shared by the benchmark scripts: the median time of a compiled function over timed rounds, two trees
(this one and a commit's) to time side by side, and the order their processes take turns in."""

import contextlib
import os
import statistics
import subprocess
import tempfile
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


@contextlib.contextmanager
def two_trees(commit: str):
  """(a scratch folder, ((name, root) of this tree and of ``commit``'s, checked out in a temporary worktree))."""
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  with tempfile.TemporaryDirectory() as folder:
    other = os.path.join(folder, 'tree')
    subprocess.run(['git', 'worktree', 'add', '--detach', other, commit], cwd=repo, check=True, capture_output=True)
    # The installed symjax maps symjax.configs to this tree's configs/; the other tree's own, found first on
    # its PYTHONPATH, keeps its recipes with its code.
    os.symlink(os.path.join(other, 'configs'), os.path.join(other, 'symjax', 'configs'))
    try:
      yield folder, (('this tree', repo), (commit, other))
    finally:
      subprocess.run(['git', 'worktree', 'remove', '--force', other], cwd=repo, capture_output=True)


def in_turn(pair: tuple, r: int) -> tuple:
  """``pair`` in round ``r``'s order: A B, then B A, and so on. Over an even number of rounds each side runs
  first as often and sits as early in the run on average, so a machine that speeds up or slows down as the run
  goes on weighs on both alike; over an odd number one side runs first once more."""
  return pair if r % 2 == 0 else pair[::-1]


def round_ratios(a: list[float], b: list[float]) -> list[float]:
  """Each round's ``a`` over its ``b``: the two ran next to each other, so what drifts between rounds cancels."""
  return [x / y for x, y in zip(a, b)]
