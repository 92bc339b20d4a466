"""The default job of each model kind as a new user runs it: parameters, test accuracy and wall time, over seeds.

  python -m benchmarks.analysis.default_jobs [--kinds=standard,token_factored,symbolic] [--seeds=0,1,2]
      [--runs=/tmp/symjax_default_jobs] [--json=benchmarks/results/default_jobs.json]

  python -m benchmarks.analysis.default_jobs --quickstart [--json=benchmarks/results/quickstart_output.json]

``--quickstart``: the README's quick-start command as a new user types it, in a fresh work directory, and
the lines it prints in a log (the README and the training page show them, generated from the JSON).

Each (kind, seed) runs ``python -m symjax.main --config=<kind> --config.seed=<seed>`` (the induction task)
in a fresh work directory with a compilation cache of its own, empty at the start, so the wall
time is a first run's, compilation included. Runs one job at a time: on a shared machine the wall times
measure the machine as much as the job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import jax
import numpy as np
from absl import app, flags

import symjax
from benchmarks.lib import cli, default_runs
from benchmarks.lib import results as result_files
from symjax.train import sweep

_KINDS = cli.kinds()
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Training seeds (config.seed).')
_RUNS = flags.DEFINE_string('runs', '/tmp/symjax_default_jobs', 'Where the runs are trained; must not hold '
                            'finished runs, whose wall time would be unknown.')
_JSON = cli.json_output('benchmarks/results/default_jobs.json', 'Output ("" prints).')
_QUICKSTART = flags.DEFINE_bool('quickstart', False, "Record the quick start's output instead (see above).")
QUICKSTART = ['python', '-m', 'symjax.main', '--config=symbolic']


def quickstart() -> None:
  """The quick start, run as the README gives it, in a fresh work directory named as its default is
  (runs/symbolic), its printed lines kept."""
  with tempfile.TemporaryDirectory() as folder:
    proc = subprocess.run([sys.executable, *QUICKSTART[1:]], cwd=folder, capture_output=True, text=True)
  if proc.returncode:
    raise SystemExit(f'the quick start failed:\n{proc.stderr[-2000:]}')
  lines = proc.stdout.splitlines()
  print('\n'.join(lines))
  result_files.write(_JSON.value, {'what': 'the lines the quick start prints in a log, run once in a fresh '
                                           'work directory', 'quickstart': ' '.join(QUICKSTART), 'lines': lines})


def main(_):
  if _QUICKSTART.value:
    return quickstart()
  per_run, commands = {}, {}
  for kind in _KINDS.value:
    for seed in map(int, _SEEDS.value):
      workdir = os.path.join(_RUNS.value, f'{kind}_seed{seed}')
      command, seconds = default_runs.train(
          kind, seed, workdir, f'--config.compilation_cache_dir={os.path.join(_RUNS.value, f"cache_{kind}_{seed}")}')
      if seconds is None:
        raise SystemExit(f'{workdir} already holds a finished run; pass an empty --runs to time the jobs')
      commands[f'{kind}/{seed}'] = ' '.join(command)
      with open(os.path.join(workdir, 'final_metrics.json')) as f:
        test = json.load(f)['test']
      run = symjax.load(workdir)
      per_run.setdefault(kind, {})[str(seed)] = row = {
          'parameters': int(sum(np.size(x) for x in jax.tree.leaves(run.params))), 'wall_s': seconds,
          'steps': int(run.config.total_steps), 'batch_size': int(run.config.batch_size),
          'test_token_accuracy': 100 * test['accuracy'], 'test_sequence_accuracy': 100 * test['sequence_accuracy']}
      print(kind, seed, row, flush=True)

  summary = {}
  print('\n| kind | parameters | test token accuracy | test sequence accuracy | wall time |\n|---|---:|---:|---:|---:|')
  for kind, seeds in per_run.items():
    rows = list(seeds.values())
    summary[kind] = {**{k: rows[0][k] for k in ('parameters', 'steps', 'batch_size')},
                     **{k: sweep.stat([r[k] for r in rows])
                        for k in ('test_token_accuracy', 'test_sequence_accuracy', 'wall_s')}}
    s = summary[kind]
    print(f"| {kind} | {s['parameters']:,} | {s['test_token_accuracy']['mean']:.2f} | "
          f"{s['test_sequence_accuracy']['mean']:.2f} | {s['wall_s']['mean']:.0f} s |")
  if _JSON.value:
    result_files.write(_JSON.value, {
        'what': 'the default induction job of each kind, one at a time, each with an empty '
                'compilation cache of its own; mean and 95% t-interval over seeds',
        'train_commands': commands, 'summary': summary, 'per_seed': per_run})


if __name__ == '__main__':
  app.run(main)
