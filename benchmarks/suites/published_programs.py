"""The published Transformer Programs run on symjax's test splits: whether the accuracies "Learning Transformer
Programs" reports (Table 1) carry over to the task data here, so that a program trained here can be compared
with the published one on the same inputs.

  git clone https://github.com/princeton-nlp/TransformerPrograms   # read at run time, never imported by symjax
  pip install -e '.[bench]'                                        # pandas: the programs read their classifiers
  python -m benchmarks.suites.published_programs --programs=TransformerPrograms
      [--tasks=reverse,...] [--jobs=2] [--split=test] [--json=benchmarks/results/published_programs.json]

Each task's program (``programs/rasp/<task>/<task>.py`` and its classifier CSV) tags every sequence of the test
split that ``--config=rasp:task=<task>,model=program`` trains and scores on (its data seed), one sequence at a
time as the published code runs; the score is token accuracy over the tagged positions, as the training command
reports it, and by position in the sequence. Tags are compared as text, with symjax's count tags (``#2``)
read as the published ones (``2``). ``--split=uniform`` scores the 2,000 inputs of uniformly drawn length that
``symjax.decompile`` scores a program on (``RaspTask.uniform_length_batches``), beside the test split (the
Dyck tasks have none), and the difference with the uniform draw's accuracy at each input length (tagged
positions per sequence) weighed as the test split's lengths are: what is left at one mix of lengths.
``--split=generator`` (Dyck tasks only) scores 2,000 distinct inputs drawn as that paper's own code draws them
(``generator_tokens``), beside the test split: whether a gap to the published figure is in symjax's data.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import importlib.util
import io
import os
import subprocess
import time

import numpy as np
from absl import app, flags

from benchmarks.lib import collect
from benchmarks.lib import results as result_files
from symjax.tasks import rasp
from symjax.tasks.base import BOS, PAD

_PROGRAMS = flags.DEFINE_string('programs', None, 'A checkout of princeton-nlp/TransformerPrograms.', required=True)
_TASKS = flags.DEFINE_list('tasks', list(rasp.TASKS), 'RASP tasks.')
_JOBS = flags.DEFINE_integer('jobs', 1, 'Tasks scored at once.', lower_bound=1)
_SPLIT = flags.DEFINE_enum('split', 'test', ['test', 'uniform', 'generator'],
                           'The test split, or (with it) the inputs of uniformly drawn length, or (Dyck tasks) '
                           "inputs drawn by that paper's own generator.")
_JSON = flags.DEFINE_string('json', 'benchmarks/results/published_programs.json', 'Where to write the results.')


def split_tokens(task_name: str, split: str = 'test') -> list[tuple[list[str], list[str], list[bool]]]:
  """(input tokens, target tags, tagged) of every sequence of the split the program recipe scores on
  (``uniform``: the inputs of uniformly drawn length ``symjax.decompile`` scores)."""
  from symjax import tasks
  from symjax.configs import rasp as recipe
  config = recipe.get_config(f'task={task_name},model=program')
  task = tasks.get_task(config)
  words = list(task.vocab.tokens)
  rows = []
  batches = task.uniform_length_batches() if split == 'uniform' else task.eval_batches(split, 500, config.data_seed)
  for batch in batches:
    for x, y, w, mask in zip(batch['inputs'], batch['targets'], batch['weights'], batch['key_mask']):
      n = int(mask.sum())
      if n:  # the last batch's filler rows are not sequences of the split
        rows.append(([words[i] for i in x[:n]], [words[i] for i in y[:n]], [bool(v > 0) for v in w[:n]]))
  return rows


def generator_tokens(task_name: str, count: int = 2_000, seed: int = 0
                     ) -> list[tuple[list[str], list[str], list[bool]]]:
  """``count`` distinct Dyck inputs drawn as that paper's code draws them (``make_dyck_pft`` in its
  ``src/utils/data_utils.py``, with the ``min_length=1, max_length=16`` its ``run.py`` passes), as
  ``split_tokens`` gives them: with probability 1/2, k ~ U{0..8} pairs, each appended or wrapped around the rest
  with probability 1/2, padded with uniformly drawn brackets or cut to 15; else 15 uniformly drawn brackets.
  That code draws from NumPy's legacy generator, so this does too (``RandomState``, seeded as it seeds)."""
  if not task_name.startswith('dyck'):
    raise ValueError(f'--split=generator is for the Dyck tasks (dyck1, dyck2), got {task_name!r}')
  pairs = list(rasp.BRACKETS[task_name])
  symbols = [c for p in pairs for c in p]
  rng, seen, rows = np.random.RandomState(seed), set(), []
  while len(rows) < count:
    if rng.randint(2):
      s: list[str] = []
      for _ in range(rng.randint(0, 8 + 1)):
        left, right = pairs[rng.randint(0, len(pairs))]
        s = s + [left, right] if rng.randint(0, 2) == 0 else [left, *s, right]
      s = s[:15] + (rng.choice(symbols, size=15 - len(s)).tolist() if len(s) < 15 else [])
    else:
      s = rng.choice(symbols, size=15).tolist()
    if tuple(s) not in seen:
      seen.add(tuple(s))
      tags = rasp.dyck_tags(s, rasp.BRACKETS[task_name])
      rows.append(([BOS, *s], [PAD, *tags], [False] + [True] * len(s)))
  return rows


def score(programs: str, task_name: str, split: str = 'test') -> dict:
  """The published program of ``task_name`` over ``split``: token accuracy (%), positions, sequences, seconds,
  and by position (and, on ``uniform``, by input length: its tagged positions)."""
  rows = generator_tokens(task_name) if split == 'generator' else split_tokens(task_name, split)
  if not rows:
    return {}
  path = os.path.join(programs, 'programs', 'rasp', task_name, f'{task_name}.py')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'no published program at {path}: --programs names a TransformerPrograms checkout')
  here = os.getcwd()
  os.chdir(programs)  # the programs read their classifier CSV by a path from the repository's root
  try:
    spec = importlib.util.spec_from_file_location(f'published_{task_name}', path)
    module = importlib.util.module_from_spec(spec)
    with contextlib.redirect_stdout(io.StringIO()):  # the file tags its own examples when imported
      spec.loader.exec_module(module)
    start = time.perf_counter()
    right, total = collections.Counter(), collections.Counter()   # by position
    right_by_length, by_length = collections.Counter(), collections.Counter()
    for tokens, tags, tagged in rows:
      length = sum(tagged)
      for i, (got, want, counted) in enumerate(zip(module.run(tokens), tags, tagged)):
        if counted:
          hit = str(got) == want.removeprefix('#')
          total[i] += 1
          right[i] += hit
          by_length[length] += 1
          right_by_length[length] += hit
    seconds = time.perf_counter() - start
  finally:
    os.chdir(here)
  return {'accuracy': 100.0 * sum(right.values()) / sum(total.values()), 'positions': sum(total.values()),
          'sequences': len(rows), 'seconds': seconds,
          'accuracy_by_position': {str(i): 100.0 * right[i] / total[i] for i in sorted(total)},
          'accuracy_by_length': {str(n): 100.0 * right_by_length[n] / by_length[n] for n in sorted(by_length)},
          'positions_by_length': {str(n): by_length[n] for n in sorted(by_length)}}


def main(argv):
  del argv
  programs = os.path.abspath(_PROGRAMS.value)
  if _SPLIT.value == 'generator' and not all(t.startswith('dyck') for t in _TASKS.value):
    raise app.UsageError('--split=generator is for the Dyck tasks (dyck1, dyck2), got '
                         f'--tasks={",".join(_TASKS.value)}')
  splits = ['test'] + ([_SPLIT.value] if _SPLIT.value != 'test' else [])
  with concurrent.futures.ProcessPoolExecutor(_JOBS.value) as pool:
    futures = {(t, split): pool.submit(score, programs, t, split) for t in _TASKS.value for split in splits}
    scores = {key: f.result() for key, f in futures.items()}
  try:
    commit = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=programs, capture_output=True, text=True,
                            check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    commit = 'unknown (not a git checkout)'
  test = {t: scores[t, 'test'] for t in _TASKS.value}
  uniform = {t: scores[t, 'uniform'] for t in _TASKS.value if scores.get((t, 'uniform'))}
  about = ("the published Transformer Programs (princeton-nlp/TransformerPrograms, programs/rasp/<task>) on {}: "
           "token accuracy (%) over the tagged positions, ")
  if _SPLIT.value == 'test':
    header = ('task', 'published', 'on this split', 'positions')
    rows = [(t, rasp.PUBLISHED[t], s['accuracy'], s['positions']) for t, s in test.items()]
    record = {'what': about.format("the test split symjax's program recipe scores on")
                      + 'beside the accuracy that paper reports on its own data (Table 1)',
              'programs_commit': commit, 'split': 'test',
              'published_accuracy': {t: rasp.PUBLISHED[t] for t in test}, 'on_this_split': test}
  elif _SPLIT.value == 'generator':
    generated = {t: scores[t, 'generator'] for t in _TASKS.value}
    header = ('task', 'published', 'on this split', "paper's generator")
    rows = [(t, rasp.PUBLISHED[t], test[t]['accuracy'], s['accuracy']) for t, s in generated.items()]
    record = {'what': about.format("2,000 distinct inputs drawn by that paper's own generator (make_dyck_pft, "
                                   "min_length=1, max_length=16, NumPy's legacy generator seeded 0), and on the "
                                   "test split symjax's program recipe scores on, ")
                      + 'one published program per task (no seeds, so no interval)',
              'programs_commit': commit, 'split': 'generator', 'intervals': 'none: one published program per task',
              'published_accuracy': {t: rasp.PUBLISHED[t] for t in generated},
              'on_this_split': test, 'on_generator': generated}
  else:
    header = ('task', 'test split', 'uniform lengths', 'uniform - test', 'at test lengths')
    # The last column weighs the uniform draw's accuracy at each length as the test split's lengths weigh.
    rows = [(t, test[t]['accuracy'], s['accuracy'], s['accuracy'] - test[t]['accuracy'],
             collect.at_lengths(s['accuracy_by_length'], test[t]['positions_by_length']) - test[t]['accuracy'])
            for t, s in uniform.items()]
    record = {'what': about.format('the 2,000 inputs of uniformly drawn length symjax.decompile scores a program '
                                   "on, and on the test split symjax's program recipe scores on")
                      + 'one published program per task (no seeds, so no interval)',
              'programs_commit': commit, 'split': 'uniform', 'intervals': 'none: one published program per task',
              'published_accuracy': {t: rasp.PUBLISHED[t] for t in uniform},
              'on_this_split': {t: test[t] for t in uniform}, 'on_uniform_lengths': uniform,
              'uniform_minus_test': {t: row[3] for t, row in zip(uniform, rows)},
              'uniform_minus_test_at_test_lengths': {t: row[4] for t, row in zip(uniform, rows)}}
  print(f'{header[0]:12s} ' + ' '.join(f'{h:>15s}' for h in header[1:]))
  for task, *values in rows:
    print(f'{task:12s} ' + ' '.join(f'{v:15.2f}' if isinstance(v, float) else f'{v:15d}' for v in values))
  result_files.write(_JSON.value, record)


if __name__ == '__main__':
  app.run(main)
