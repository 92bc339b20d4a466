"""What the number of starts a patching sweep recomputes from (``symjax.interpret.suffix.BUCKETS``) costs at the
first call and saves at the next: each start is a program to compile, and more starts recompute fewer
positions.

  python -m benchmarks.speed.sweep_starts [--buckets=1,2,4] [--json=benchmarks/results/sweep_starts_cpu.json]

The sweeps of ``vs_transformer_lens`` (nanoGPT's CPU shape, one prompt pair of 64 tokens; the middle token
corrupted, or the first for ``…_from_0``), on the standard and the symbolic kind. Every (kind, sweep, starts)
runs in a fresh process, so its first call compiles everything it needs, as a researcher's first sweep of a
session does (``vs_transformer_lens`` times its first calls one after another in one process, where a
sweep reuses what an earlier one compiled); then the median of ``--repeats`` warm calls. The sweep values
of every bucket count are checked against each other. Run it on an idle machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import jax
import numpy as np
from absl import app, flags

from benchmarks.lib import cli
from benchmarks.lib import lens_pair as pair
from benchmarks.lib import results as result_files

_JSON = cli.json_output('benchmarks/results/sweep_starts_cpu.json')
_REPEATS = cli.repeats(15, 'Warm calls timed per sweep (the median is reported).')
_BUCKETS = flags.DEFINE_list('buckets', ['1', '2', '4'], 'Starts per input (suffix.BUCKETS) to compare.')
_KINDS = cli.kinds(('standard', 'symbolic'))
_CHILD = 'SYMJAX_SWEEP_STARTS_CHILD'  # "kind sweep buckets", set in the processes the first one starts


def one_sweep(kind: str, sweep: str, buckets: int) -> dict:
  """This process's first call, warm median and values of one sweep."""
  from symjax.interpret import suffix
  suffix.BUCKETS = buckets
  hm = pair.symjax_model(kind)
  call = pair.symjax_workloads(hm, *pair.prompts())[sweep]
  first = pair.seconds(call)
  values = np.asarray(call())
  warm = statistics.median(pair.seconds(call) for _ in range(_REPEATS.value))
  return {'first_call_s': first, 'warm_s': warm, 'values': values.tolist()}


def main(argv):
  del argv
  if os.environ.get(_CHILD):
    kind, sweep, buckets = os.environ[_CHILD].split()
    print(json.dumps(one_sweep(kind, sweep, int(buckets))))
    return
  buckets = [int(b) for b in _BUCKETS.value]
  table, largest = {}, 0.0
  print(f'{"kind":9s} {"sweep":36s} ' + ' '.join(f'{f"first s, B={b}":>13s} {f"warm s, B={b}":>12s}'
                                                  for b in buckets))
  for kind in _KINDS.value:
    for sweep in pair.SWEEPS:
      row = {}
      for b in buckets:
        env = dict(os.environ, **{_CHILD: f'{kind} {sweep} {b}'})
        out = subprocess.run([sys.executable, '-m', 'benchmarks.speed.sweep_starts', f'--repeats={_REPEATS.value}'],
                             env=env, capture_output=True, text=True)
        if out.returncode:
          raise SystemExit(f'{kind} {sweep} with {b} starts failed:\n{out.stderr[-2000:]}')
        row[b] = json.loads(out.stdout.strip().splitlines()[-1])
      values = [np.asarray(r.pop('values')) for r in row.values()]
      largest = max(largest, *(float(np.abs(v - values[0]).max()) for v in values))
      table[f'{kind}/{sweep}'] = {str(b): r for b, r in row.items()}
      print(f'{kind:9s} {sweep:36s} ' + ' '.join(f'{r["first_call_s"]:13.2f} {r["warm_s"]:12.4f}'
                                                 for r in row.values()))
  if largest > 1e-5:
    raise SystemExit(f'the sweeps differ between bucket counts by {largest:.3g}')
  print(f'largest difference of the sweep values between bucket counts: {largest:.3g}')
  result_files.write(_JSON.value, {
      'what': 'patching sweeps of benchmarks.speed.vs_transformer_lens (nanoGPT CPU shape, one prompt pair of 64 '
              'tokens) by the number of starts they recompute from (symjax.interpret.suffix.BUCKETS): each '
              '(kind, sweep, starts) in a fresh process, its first call (compilation included) and the median '
              'of its warm calls',
      'shape': {'layers': pair.LAYERS, 'heads': pair.HEADS, 'head_dim': pair.HEAD_DIM, 'mlp': pair.MLP,
                'vocab': pair.VOCAB, 'context': pair.CONTEXT, 'sweep_batch': 1},
      'repeats': _REPEATS.value, 'jax': jax.__version__, 'largest_difference': largest, 'sweeps': table})


if __name__ == '__main__':
  app.run(main)
