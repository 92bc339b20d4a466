"""The default job of a model kind, trained by the command a user types, for the analyses that read trained
induction models (``benchmarks/analysis/``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import symjax


def train(kind: str, seed: int, workdir: str, *flags: str) -> tuple[list[str], float | None]:
  """Trains ``python -m symjax.main --config=<kind> --config.seed=<seed> [flags]`` into ``workdir`` unless it
  holds a finished run. Returns that command as a user would type it, and its wall time in seconds (None
  where the run was already there)."""
  command = [sys.executable, '-m', 'symjax.main', f'--config={kind}', f'--config.seed={seed}', *flags,
             '--config.progress_bar=false', f'--workdir={workdir}']
  seconds = None
  if not os.path.exists(os.path.join(workdir, 'final_metrics.json')):
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
      raise RuntimeError(f'training {kind} seed {seed} failed:\n{proc.stderr[-2000:]}')
  return ['python', *command[1:]], seconds


def induction_run(kind: str, seed: int, runs: str):
  """The default induction job of ``kind`` and ``seed`` under ``runs`` (trained where missing): the command
  and the loaded run."""
  workdir = os.path.join(runs, f'{kind}_seed{seed}')
  command, _ = train(kind, seed, workdir)
  run = symjax.load(workdir)
  if run.task != 'induction':
    raise ValueError(f'{workdir} trained task {run.task!r}, not induction')
  return ' '.join(command), run
