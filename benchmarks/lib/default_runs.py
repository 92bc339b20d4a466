"""The default job of a model kind, trained by the command a user types, for the analyses that read trained
induction models (``benchmarks/analysis/``)."""

from __future__ import annotations

import os
import subprocess
import sys


def train(kind: str, seed: int, workdir: str) -> list[str]:
  """Trains ``python -m symjax.main --config=<kind> --config.seed=<seed>`` into ``workdir`` unless it holds a
  finished run, and returns that command as a user would type it."""
  command = [sys.executable, '-m', 'symjax.main', f'--config={kind}', f'--config.seed={seed}',
             '--config.progress_bar=false', f'--workdir={workdir}']
  if not os.path.exists(os.path.join(workdir, 'final_metrics.json')):
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode:
      raise RuntimeError(f'training {kind} seed {seed} failed:\n{proc.stderr[-2000:]}')
  return ['python', *command[1:]]
