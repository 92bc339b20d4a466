"""Whether a sweep's clean run computed from the first position where the prompts differ
(``symjax.interpret.suffix.CLEAN_FROM_DIFFERENCE``) saves more at warm calls than its larger program costs
to compile: the sweeps of ``sweep_starts`` whose prompts share a prefix, each setting in a fresh process.

  python -m benchmarks.speed.clean_from_difference [--json=benchmarks/results/clean_from_difference_cpu.json]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import jax
import numpy as np
from absl import app

from benchmarks.lib import cli
from benchmarks.lib import lens_pair as pair
from benchmarks.lib import results as result_files

_JSON = cli.json_output('benchmarks/results/clean_from_difference_cpu.json')
_REPEATS = cli.repeats(25, 'Warm calls timed per sweep (the median is reported).')
SWEEPS = ('heads_sweep_16', 'resid_pre_sweep_256', 'heads_by_position_sweep_1024')
_CHILD = 'SYMJAX_CLEAN_FROM_DIFFERENCE_CHILD'  # "kind sweep setting"


def main(argv):
  del argv
  if os.environ.get(_CHILD):
    from symjax.interpret import suffix
    kind, sweep, setting = os.environ[_CHILD].split()
    suffix.CLEAN_FROM_DIFFERENCE = setting == 'from_difference'
    call = pair.symjax_workloads(pair.symjax_model(kind), *pair.prompts())[sweep]
    first = pair.seconds(call)
    values = np.asarray(call())
    warm = statistics.median(pair.seconds(call) for _ in range(_REPEATS.value))
    print(json.dumps({'first_call_s': first, 'warm_s': warm, 'values': values.tolist()}))
    return
  table, largest = {}, 0.0
  for kind in ('standard', 'symbolic'):
    for sweep in SWEEPS:
      row = {}
      for setting in ('from_difference', 'whole'):
        env = dict(os.environ, **{_CHILD: f'{kind} {sweep} {setting}'})
        out = subprocess.run([sys.executable, '-m', 'benchmarks.speed.clean_from_difference',
                              f'--repeats={_REPEATS.value}'], env=env, capture_output=True, text=True)
        if out.returncode:
          raise SystemExit(f'{kind} {sweep} {setting} failed:\n{out.stderr[-2000:]}')
        row[setting] = json.loads(out.stdout.strip().splitlines()[-1])
      a, b = (np.asarray(r.pop('values')) for r in row.values())
      largest = max(largest, float(np.abs(a - b).max()))
      table[f'{kind}/{sweep}'] = row
      print(f'{kind:9s} {sweep:30s} ' + '  '.join(f'{s}: first {r["first_call_s"]:.2f} s, warm '
                                                   f'{r["warm_s"] * 1e3:.1f} ms' for s, r in row.items()))
  print(f'largest difference of the values between the settings: {largest:.3g}')
  result_files.write(_JSON.value, {
      'what': 'patching sweeps of benchmarks.speed.vs_transformer_lens whose prompts share their first half, with '
              'the clean run computed from the first differing position (from_difference) or whole; each in a '
              'fresh process: first call (compilation included) and the median of warm calls',
      'repeats': _REPEATS.value, 'jax': jax.__version__, 'largest_difference': largest, 'sweeps': table})


if __name__ == '__main__':
  app.run(main)
