"""Where a compiled step's time goes: jax.profiler's trace of a few steps, summed by op name.

``profile_ops(step, log_dir, process)`` runs ``step()`` a few times under ``jax.profiler.trace`` (which
writes a Perfetto JSON trace beside its own files), then sums the duration of every complete event of the
processes whose name holds ``process`` ('GPU' for a GPU's streams, 'CPU' for XLA:CPU's host threads), per
line (thread) of the trace and per event name. A line's busy time can exceed the step on a multi-threaded
host (lines run side by side) and its events nest (a module holds its ops), so compare names within one
line. ``by_op`` sums the numbered copies of an op (every ``dot.N`` as ``dot``), and is what is printed.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re

import jax


def profile_ops(step, log_dir: str, process: str, steps: int = 3, top: int = 25) -> dict:
  """``{line: {'busy_ms_per_step': ..., 'top': {name: ms per step}}}`` over ``steps`` traced calls."""
  with jax.profiler.trace(log_dir, create_perfetto_trace=True):
    for _ in range(steps):
      jax.block_until_ready(step())
  path = sorted(glob.glob(os.path.join(log_dir, '**', 'perfetto_trace.json.gz'), recursive=True))[-1]
  with gzip.open(path, 'rt') as f:
    events = json.load(f)['traceEvents']
  meta = lambda kind: {(e['pid'], e.get('tid')) if kind == 'thread_name' else e['pid']: e['args']['name']
                       for e in events if e.get('ph') == 'M' and e.get('name') == kind}
  processes, threads = meta('process_name'), meta('thread_name')
  lines: dict[str, dict[str, float]] = {}
  for e in events:
    if e.get('ph') == 'X' and process in str(processes.get(e.get('pid'), '')):
      line = lines.setdefault(str(threads.get((e['pid'], e.get('tid')), e.get('tid'))), {})
      line[e['name']] = line.get(e['name'], 0.0) + e.get('dur', 0.0) / 1e3 / steps
  ranked = lambda t: dict(sorted(t.items(), key=lambda kv: -kv[1])[:top])
  return {line: {'busy_ms_per_step': sum(t.values()), 'top': ranked(t), 'by_op': ranked(by_op(t))}
          for line, t in lines.items()}


def by_op(times: dict[str, float]) -> dict[str, float]:
  """Times summed over the numbered copies of one op (``dot.28``, ``dot.3`` -> ``dot``)."""
  out: dict[str, float] = {}
  for name, ms in times.items():
    base = re.sub(r'\.\d+$', '', name)
    out[base] = out.get(base, 0.0) + ms
  return out


def print_profile(label: str, step_ms: float, profile: dict, lines_with=('XLA Ops',)) -> None:
  for line, t in profile.items():
    print(f"\n{label}, {line}: busy {t['busy_ms_per_step']:.1f} ms of a {step_ms:.1f} ms step")
    if any(s in line for s in lines_with) or len(profile) == 1:
      for name, ms in t['by_op'].items():
        print(f'  {ms:7.2f} ms  {name[:110]}')
