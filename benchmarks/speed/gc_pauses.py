"""Python's garbage collector in the training command: every collection's generation and duration, before the
first step and after it, with the collector held off until the first step (symjax's default,
``host.defer_garbage_collection``) and with Python's default (``SYMJAX_KEEP_GC=1``), run alternately.

  python -m benchmarks.speed.gc_pauses [--kinds=standard] [--steps=600] [--runs=2] \
      [--json=benchmarks/results/gc_pauses_cpu.json]

Each run is the text recipe's command (``python -m symjax.main --config=KIND:task=text,size=medium``) in a fresh
work directory, started through a small driver that adds a callback to ``gc.callbacks`` before anything is
imported; the compilation cache is made for the benchmark and filled by one run first, so the timed runs are
warm starts. A collection of the oldest generation walks every object the collector tracks, so its duration is
the pause the loop sees. It prints, per setting, the count, total and longest collection of each generation
before and after the first step, and writes them with every run's list to ``--json``. Tests time nothing.
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
from benchmarks.lib.profiling import collections_by_phase

_KINDS = flags.DEFINE_list('kinds', ['standard'], 'symjax model kinds.')
_STEPS = flags.DEFINE_integer('steps', 600, 'Training steps of every run.')
_RUNS = flags.DEFINE_integer('runs', 2, 'Timed runs per setting and kind (after one that fills the cache).')
_TEXT = flags.DEFINE_string('text_path', '../shared/data/tinyshakespeare.txt', 'The corpus (Tiny Shakespeare).')
_JSON = flags.DEFINE_string('json', 'benchmarks/results/gc_pauses_cpu.json', 'Where to write the results.')

SETTINGS = {'deferred': {}, 'python_default': {'SYMJAX_KEEP_GC': '1'}}
FIRST_LINE = 'first step done'

# Records (seconds since start, duration, generation) of every collection, and the moment the trainer prints its
# first-step line, then runs the training command as ``python -m symjax.main`` would.
_DRIVER = """
import builtins, gc, json, runpy, sys, time
start, events, first, began = time.perf_counter(), [], [None], [0.0]
def watch(phase, info):
  now = time.perf_counter()
  if phase == 'start':
    began[0] = now
  else:
    events.append((round(began[0] - start, 4), round(now - began[0], 5), info['generation']))
gc.callbacks.append(watch)
say = builtins.print
def print_(*args, **kw):
  if first[0] is None and args and str(args[0]).startswith(%(first)r):
    first[0] = time.perf_counter() - start
  return say(*args, **kw)
builtins.print = print_
sys.argv = ['symjax.main'] + sys.argv[2:]
try:
  runpy.run_module('symjax.main', run_name='__main__')
finally:
  with open(%(out)r, 'w') as f:
    json.dump({'first_step_s': first[0], 'collections': events}, f)
"""


def one_run(kind: str, env_extra: dict[str, str], cache: str, workdir: str, out: str) -> dict:
  argv = [f'--config={kind}:task=text,size=medium', f'--config.text_path={os.path.abspath(_TEXT.value)}',
          f'--config.total_steps={_STEPS.value}', f'--workdir={workdir}', f'--config.compilation_cache_dir={cache}',
          '--config.progress_bar=false']
  env = {k: v for k, v in os.environ.items() if k != 'SYMJAX_KEEP_GC'}
  driver = _DRIVER % {'first': FIRST_LINE, 'out': out}
  proc = subprocess.run([sys.executable, '-c', driver, '-', *argv], env={**env, **env_extra},
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  if proc.returncode:
    raise RuntimeError(f'the {kind} run failed ({proc.returncode}):\n{proc.stderr[-3000:]}')
  with open(out) as f:
    return json.load(f)


def main(argv):
  del argv
  if not os.path.isfile(_TEXT.value):
    raise app.UsageError(f'--text_path {_TEXT.value!r} is not a file; give the Tiny Shakespeare corpus')
  runs: dict[str, dict[str, list]] = {kind: {name: [] for name in SETTINGS} for kind in _KINDS.value}
  with tempfile.TemporaryDirectory() as scratch:
    cache, out = os.path.join(scratch, 'cache'), os.path.join(scratch, 'gc.json')
    for kind in _KINDS.value:
      one_run(kind, {}, cache, os.path.join(scratch, f'fill_{kind}'), out)  # fills the cache
      for i in range(_RUNS.value):
        order = list(SETTINGS) if i % 2 == 0 else list(SETTINGS)[::-1]
        for name in order:
          workdir = os.path.join(scratch, f'{kind}_{name}_{i}')
          run = one_run(kind, SETTINGS[name], cache, workdir, out)
          runs[kind][name].append({**run, 'summary': collections_by_phase(run['collections'], run['first_step_s'])})
  print('| kind | setting | phase / generation | collections | total | longest |')
  print('|---|---|---|---:|---:|---:|')
  summary = {}
  for kind, per in runs.items():
    for name, items in per.items():
      keys = items[0]['summary']
      summary.setdefault(kind, {})[name] = {
          k: {field: statistics.median(r['summary'][k][field] for r in items) for field in keys[k]} for k in keys}
      summary[kind][name]['first_step_s'] = statistics.median(r['first_step_s'] for r in items)
      for k, s in summary[kind][name].items():
        if k != 'first_step_s' and s['count']:
          print(f"| {kind} | {name} | {k} | {s['count']:.0f} | {s['total_s']:.3f} s | {s['longest_s']:.3f} s |")
  result_files.write(_JSON.value, {'steps': _STEPS.value, 'runs': _RUNS.value, 'per_run': runs, 'summary': summary})


if __name__ == '__main__':
  app.run(main)
