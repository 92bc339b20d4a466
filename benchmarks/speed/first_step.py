"""The time from the training command to its first finished step, with a warm compilation cache, for one or
more source trees of symjax side by side (a change against the commit before it, each checked out with
``git worktree add``).

  python -m benchmarks.speed.first_step --trees=before:/tmp/base,after:. [--kinds=standard] [--runs=7] \
      [--json=benchmarks/results/first_step_cpu.json]

Each run is the text recipe's command as a user types it (``python -m symjax.main --config=KIND:task=text,
size=medium``) started in the tree's folder, so that tree's ``symjax`` is the one imported, in a fresh work
directory, timed from its start to the trainer's ``first step done`` line, and stopped there. Every tree
and kind runs once to fill a compilation cache made for the benchmark, then ``--runs`` times, the trees
alternated and their order reversed every other run, on the otherwise idle machine. It prints the median
and range per tree and kind and writes every run's seconds with each tree's commit to ``--json``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from benchmarks.lib import results as result_files

_TREES = flags.DEFINE_list('trees', ['this:.'], 'NAME:FOLDER pairs: the source trees to compare.')
_KINDS = flags.DEFINE_list('kinds', ['standard'], 'symjax model kinds.')
_RUNS = flags.DEFINE_integer('runs', 7, 'Timed runs per tree and kind (after one that fills the cache).')
_TEXT = flags.DEFINE_string('text_path', '../shared/data/tinyshakespeare.txt', 'The corpus (Tiny Shakespeare).')
_JSON = flags.DEFINE_string('json', 'benchmarks/results/first_step_cpu.json', 'Where to write the results.')

FIRST_LINE = 'first step done'


def seconds_to_first_step(folder: str, kind: str, cache: str, workdir: str) -> float:
  """Runs the recipe's command in ``folder`` until its first step; the seconds from its start to that line."""
  shutil.rmtree(workdir, ignore_errors=True)
  argv = [sys.executable, '-m', 'symjax.main', f'--config={kind}:task=text,size=medium',
          f'--config.text_path={os.path.abspath(_TEXT.value)}', f'--workdir={workdir}',
          f'--config.compilation_cache_dir={cache}']
  start = time.perf_counter()
  proc = subprocess.Popen(argv, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, 'PYTHONUNBUFFERED': '1'})
  tail = []
  for line in proc.stdout:
    if line.startswith(FIRST_LINE):
      seconds = time.perf_counter() - start
      proc.kill()
      proc.wait()
      return seconds
    tail = (tail + [line])[-20:]
  proc.wait()
  raise RuntimeError(f'{" ".join(argv)} (in {folder}) ended without a first step:\n{"".join(tail)}')


def tree_commit(folder: str) -> str:
  def git(*args):
    return subprocess.run(['git', *args], cwd=folder, capture_output=True, text=True).stdout.strip()
  sha = git('rev-parse', 'HEAD') or 'unknown'
  return sha + ('+changes' if git('status', '--porcelain', '--untracked-files=no') else '')


def main(argv):
  del argv
  if not os.path.isfile(_TEXT.value):
    raise app.UsageError(f'--text_path {_TEXT.value!r} is not a file; give the Tiny Shakespeare corpus')
  trees = {}
  for pair in _TREES.value:
    name, sep, folder = pair.partition(':')
    if not sep or not os.path.isdir(os.path.join(folder, 'symjax')):
      raise app.UsageError(f'--trees entry {pair!r} is not NAME:FOLDER with a symjax package in FOLDER')
    trees[name] = os.path.abspath(folder)
  seconds = {kind: {name: [] for name in trees} for kind in _KINDS.value}
  with tempfile.TemporaryDirectory() as scratch:
    cache, workdir = os.path.join(scratch, 'cache'), os.path.join(scratch, 'work')
    for kind in _KINDS.value:
      for folder in trees.values():
        seconds_to_first_step(folder, kind, cache, workdir)  # fills the cache
      for i in range(_RUNS.value):
        order = list(trees) if i % 2 == 0 else list(trees)[::-1]
        for name in order:
          seconds[kind][name].append(round(seconds_to_first_step(trees[name], kind, cache, workdir), 3))
  summary = {kind: {name: {'median_s': statistics.median(v), 'min_s': min(v), 'max_s': max(v)}
                    for name, v in per.items()} for kind, per in seconds.items()}
  print('| kind | tree | first step, median | range |')
  print('|---|---|---:|---:|')
  for kind, per in summary.items():
    for name, s in per.items():
      print(f"| {kind} | {name} | {s['median_s']:.2f} s | {s['min_s']:.2f}–{s['max_s']:.2f} s |")
  result_files.write(_JSON.value, {
      'trees': {name: {'folder': folder, 'commit': tree_commit(folder)} for name, folder in trees.items()},
      'runs': _RUNS.value, 'seconds_to_first_step': seconds, 'summary': summary})


if __name__ == '__main__':
  app.run(main)
