"""The decompiled programs of trained Transformer Program runs, written by this checkout and by another commit,
side by side in one session: seconds to decompile, lines, classifier entries, what the simplifier left, and
whether both programs give every input of the task the same tags.

  python -m benchmarks.speed.decompile_ab --against=REV --runs=RUN,RUN,... [--rounds=2]
      [--json=benchmarks/results/decompile_against_REV.json]

The other commit is checked out in a temporary git worktree. Each (round, run, version) is one fresh process
that loads the run's best checkpoint, reads its plan once (the model's argmaxes compile), then times
``program_code.decompile``; the second round takes the versions in the other order. Seconds are the median
over rounds; every other field is the same in every round.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

from benchmarks.lib import results as result_files

_AGAINST = flags.DEFINE_string('against', None, 'The commit to compare this checkout with.', required=True)
_RUNS = flags.DEFINE_list('runs', None, 'Run folders of model kind program on an enumerable task.', required=True)
_ROUNDS = flags.DEFINE_integer('rounds', 2, 'Rounds; each even one takes the versions in the other order.',
                               lower_bound=1)
_JSON = flags.DEFINE_string('json', None, 'Output (default benchmarks/results/decompile_against_<REV>.json).')

WORKER = r'''
import hashlib, json, sys, time
import numpy as np
from symjax import tasks
from symjax.proj import program_code
from symjax.run import workdir
loaded = workdir.load(sys.argv[1], workdir.checkpoint_choice('best', '--which'))
program_code.plan_of(loaded.params, loaded.model_config)
start = time.perf_counter()
program = program_code.decompile(loaded)
seconds = time.perf_counter() - start
task = tasks.get_task(loaded.config)
inputs, _ = task.input_space()
lengths = (inputs != task.pad_id).sum(1)
got = program_code._load(program.source, program.tables, 'program.npz').predict_ids(inputs, lengths)
print(json.dumps(dict(seconds=seconds, lines=program.lines, model_lines=program.model_lines,
                      entries=program.entries, data_file=bool(program.tables),
                      left=sum(len(v) for v in program.left.values()),
                      source_sha1=hashlib.sha1(program.source.encode()).hexdigest(),
                      tags_sha1=hashlib.sha1(np.ascontiguousarray(got).tobytes()).hexdigest())))
'''


def measure(tree: str, run: str) -> dict:
  env = dict(os.environ, PYTHONPATH=tree)
  out = subprocess.run([sys.executable, '-c', WORKER, run], cwd=tree, env=env, capture_output=True, text=True)
  if out.returncode:
    raise RuntimeError(f'decompiling {run} at {tree} failed:\n{out.stderr[-2000:]}')
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv):
  del argv
  here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  against = subprocess.run(['git', 'rev-parse', '--short', _AGAINST.value], cwd=here, capture_output=True,
                           text=True, check=True).stdout.strip()
  with tempfile.TemporaryDirectory(prefix='symjax_ab_') as folder:
    other = os.path.join(folder, against)
    subprocess.run(['git', 'worktree', 'add', '--detach', other, against], cwd=here, check=True,
                   capture_output=True)
    try:
      rows = {run: {'before': [], 'after': []} for run in _RUNS.value}
      for r in range(_ROUNDS.value):
        for run in _RUNS.value:
          for version in (('before', 'after') if r % 2 == 0 else ('after', 'before')):
            rows[run][version].append(measure(other if version == 'before' else here, run))
            print(run, version, rows[run][version][-1], flush=True)
    finally:
      subprocess.run(['git', 'worktree', 'remove', '--force', other], cwd=here, check=True)
  per_run = {}
  for run, got in rows.items():
    per_run[run] = {}
    for version, records in got.items():
      fields = {k: v for k, v in records[0].items() if k != 'seconds'}
      if any({k: v for k, v in rec.items() if k != 'seconds'} != fields for rec in records):
        raise RuntimeError(f'{run} ({version}): the rounds wrote different programs')
      per_run[run][version] = {**fields, 'seconds': statistics.median(rec['seconds'] for rec in records),
                               'seconds_per_round': [rec['seconds'] for rec in records]}
    per_run[run]['same_tags_on_every_input'] = got['before'][0]['tags_sha1'] == got['after'][0]['tags_sha1']
  print("| run | lines | entries | left | seconds | same tags |\n|---|---:|---:|---:|---:|---|")
  for run, r in per_run.items():
    b, a = r['before'], r['after']
    print(f"| {os.path.basename(run)} | {b['lines']} → {a['lines']} | {b['entries']:,} → {a['entries']:,} | "
          f"{b['left']} → {a['left']} | {b['seconds']:.1f} → {a['seconds']:.1f} | {r['same_tags_on_every_input']} |")
  result_files.write(_JSON.value or f'benchmarks/results/decompile_against_{against}.json', {
      'against': against, 'rounds': _ROUNDS.value, 'runs': per_run,
      'what': 'decompiled Transformer Programs of the same checkpoints, written at the commit `against` (before) '
              'and at this checkout (after): lines, classifier entries, modules left that the simplifier '
              'removes, seconds to decompile in process (median over rounds, the versions alternated), and '
              'whether both programs tag every input of the task alike',
      'intervals': 'none: one decompile a round of one checkpoint each; the programs are deterministic, and the '
                   'seconds are a side-by-side timing on one machine, not a result over seeds'})


if __name__ == '__main__':
  app.run(main)
