"""Decompiled programs of the Symbolic Transformer on the RASP tasks and induction: the paper's continuous
model decompiled as it is, and the program-trained one (``program=true``), over seeds.

  python -m benchmarks.suites.decompile_suite [--tasks=induction,reverse,...] [--seeds=0,1,2]
      [--runs=/tmp/symjax_decompile] [--json=benchmarks/results/decompile.json] [--jobs=2] [--restarts=reverse=10]

Each run is trained by the command a user types (``python -m symjax.main --config=rasp:task=T,model=symbolic``
or ``--config=symbolic`` for induction, ``program=true`` for program training, ``--config.seed=S``) unless
its folder holds a finished run, then decompiled from its best checkpoint by ``python -m symjax.decompile``,
which measures on the test split the program's fidelity to the model, both accuracies and the program's
size. Where the recipe trains several initialisations per seed (``symjax.configs.rasp.RESTARTS``, as "Learning
Transformer Programs" keeps the best of 5), seed s trains initialisations s·R … s·R + R − 1 and decompiles the
one best on validation accuracy (``--restarts=task=R`` sets R for a trial). The JSON is rewritten after every
seed, so a stopped suite keeps what it measured, and a suite run again trains only what its folders lack
(a stopped run resumes from its checkpoint). ``--jobs=2`` trains two runs at once (on a 2-core machine, two
one-core runs finish sooner than the same two one after the other).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time

from absl import app, flags

from benchmarks.lib import cli, collect
from benchmarks.lib import results as result_files
from benchmarks.lib.collect import chosen_on_validation, run_record
from symjax.configs import rasp as rasp_recipe
from symjax.system import files
from symjax.tasks import rasp
from symjax.train import sweep

_TASKS = flags.DEFINE_list('tasks', ['induction', *rasp.TASKS], 'Tasks.')
_MODES = flags.DEFINE_list('modes', ['continuous', 'program', 'program_alibi'],
                           'continuous (the paper), program (program training, the recipe), program_alibi '
                           '(program training without the learned query/key positions; RASP tasks only) and '
                           'transformer_program (model kind program: code a person reads; RASP tasks and induction).')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Training seeds.')
_RUNS = flags.DEFINE_string('runs', '/tmp/symjax_decompile', 'Where runs are trained (or found).')
_JSON = cli.json_output('benchmarks/results/decompile.json', 'Output.')
_JOBS = flags.DEFINE_integer('jobs', 1, 'Runs trained and decompiled at once.', lower_bound=1)
_RESTARTS = flags.DEFINE_list('restarts', [], 'task=R, ...: initialisations per seed of the transformer_program '
                               "mode instead of the recipe's (symjax.configs.rasp.RESTARTS), for a trial of a "
                               'larger search.')
_STEPS = cli.steps(0, "Train each run this many steps instead of the recipe's budget: a speed run "
                      "(decompiling and predicting take as long for any parameters of the recipe's shape); its "
                      "accuracies are not results.")
_OVERRIDES = flags.DEFINE_list('overrides', [], 'key=value, ...: config fields set on every run trained (e.g. '
                                'length_balance=1.0), written into its command.')
_KEEP_DECOMPILED = flags.DEFINE_bool('keep_decompiled', False, "Keep a run's program where its folder already "
                                      'holds one (program/measured.json): a suite resumed after a kill. Without it '
                                      'every run is decompiled anew.')
_ADD_VALIDATION = flags.DEFINE_bool('add_validation', False, 'Only add the validation accuracy of each run\'s '
                                    'decompiled checkpoint to the result files (RESULTS) that lack it, from the run '
                                    'folders their commands name; their other fields are kept as measured.')
_EXAMPLE = flags.DEFINE_string('example', '', "Only write the docs' example program: the transformer_program run "
                               'of this task best on validation among --seeds, from --runs, to '
                               'benchmarks/results/transformer_program_example.json.')
_TABLE = flags.DEFINE_string('table', '', 'Only write the docs table from the result files to this path '
                             '(docs/results/programs_table.md).')
RESULTS = ('benchmarks/results/decompile_continuous.json', 'benchmarks/results/decompile_program.json',
           'benchmarks/results/decompile_program_counting.json', 'benchmarks/results/decompile_program_gumbel.json',
           'benchmarks/results/decompile_program_heads.json',
           'benchmarks/results/decompile_program_induction.json', 'benchmarks/results/decompile_program_alibi.json')

# "Learning Transformer Programs", Table 1 (induction: §4.1): test token accuracy of the decompiled programs (%).
PUBLISHED = {**rasp.PUBLISHED, 'induction': 100.0}
# The published programs' length in lines (princeton-nlp/TransformerPrograms, programs/rasp/<task>/<task>.py).
PUBLISHED_LINES = {'reverse': 709, 'hist': 195, 'double_hist': 845, 'sort': 917, 'most_freq': 1230, 'dyck1': 1109,
                   'dyck2': 1258}
MEASURES = ('program_accuracy', 'fidelity', 'model_accuracy', 'lines', 'table_entries', 'validation_accuracy',
            'uniform_length_accuracy', 'decompile_seconds', 'program_seconds', 'model_seconds', 'train_seconds',
            'data_file', 'left', 'uniform_minus_test', 'uniform_minus_test_at_test_lengths', 'model_lines')
# Per-seed fields kept beside the measures: the restarts a seed chose among, the names the simplifier left.
PER_SEED_FIELDS = ('initialisation', 'restart_validation_accuracies', 'left_names')


def validation_at(workdir: str) -> float:
  """The validation token accuracy (%) of the checkpoint decompiled (the step its measured.json names)."""
  with open(os.path.join(workdir, 'program', 'measured.json')) as f:
    step = json.load(f)['step']
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return next(100 * r['accuracy'] for r in rows if r.get('split') == 'validation' and r['step'] == step)


def recipe(task: str, mode: str) -> list[str]:
  if mode == 'transformer_program':
    return ['--config=program' if task == 'induction' else f'--config=rasp:task={task},model=program']
  program = ',program=true' if mode.startswith('program') else ''
  name = f'symbolic:task=induction{program}' if task == 'induction' else f'rasp:task={task},model=symbolic{program}'
  return [f'--config={name}'] + (['--config.model.qk_positions=false'] if mode == 'program_alibi' else [])


def restarts(task: str) -> int:
  """Initialisations per seed of the transformer_program mode: ``--restarts``, else the recipe's."""
  given = {}
  for item in _RESTARTS.value:
    name, _, count = item.partition('=')
    if not count.isdigit() or int(count) < 1:
      raise app.UsageError(f'--restarts takes task=R with R a whole number >= 1, got {item!r}')
    given[name] = int(count)
  return given.get(task, rasp_recipe.RESTARTS.get(task, 1))


def initialisations(task: str, mode: str, seed: int) -> list[int]:
  """The training seeds behind suite seed ``seed``: itself, or R of their own where the recipe restarts."""
  return collect.initialisations(seed, restarts(task) if mode == 'transformer_program' else 1)


def train(task: str, mode: str, init: int) -> tuple[str, list[str], float | None]:
  """Trains training seed ``init`` unless its folder holds a finished run: (folder, command, wall seconds)."""
  workdir = os.path.join(_RUNS.value, f'{task}_{mode}_seed{init}')
  command = [sys.executable, '-m', 'symjax.main', *recipe(task, mode), f'--config.seed={init}',
             '--config.progress_bar=false', f'--workdir={workdir}']
  command += [f'--config.{item}' for item in _OVERRIDES.value]
  if _STEPS.value:
    command += [f'--config.total_steps={_STEPS.value}', f'--config.eval_every_steps={_STEPS.value}',
                f'--config.warmup_steps={min(100, _STEPS.value // 2)}']
  seconds = os.path.join(workdir, 'train_seconds.txt')
  if not os.path.exists(os.path.join(workdir, 'final_metrics.json')):
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    with open(seconds, 'w') as f:
      f.write(f'{time.perf_counter() - start:.1f}\n')
  taken = None
  if os.path.exists(seconds):  # the wall time of training, with the other job of --jobs beside it
    with open(seconds) as f:
      taken = float(f.read())
  return workdir, command, taken


def one(task: str, mode: str, seed: int) -> tuple[dict, list[str]]:
  inits = initialisations(task, mode, seed)
  trained = [train(task, mode, init) for init in inits]
  validation = [run_record(workdir, [])['best_validation_accuracy'] for workdir, _, _ in trained]
  chosen = inits.index(int(chosen_on_validation(
      {str(init): {'validation_accuracy': v} for init, v in zip(inits, validation)})[0]))
  workdir = trained[chosen][0]
  measured = os.path.join(workdir, 'program', 'measured.json')
  output = os.path.join(workdir, 'program', 'program.py')
  decompile = [sys.executable, '-m', 'symjax.decompile', f'--workdir={workdir}', f'--output={output}',
               f'--json={measured}']
  if not (_KEEP_DECOMPILED.value and os.path.exists(measured)):
    proc = subprocess.run(decompile, capture_output=True, text=True)
    if proc.returncode:
      raise RuntimeError(f'decompiling {workdir} failed: {proc.stderr[-1500:]}')
  with open(measured) as f:
    row = json.load(f)
  row['validation_accuracy'] = validation_at(workdir)
  if 'uniform_lengths' in row:  # the program's accuracy on inputs of uniformly drawn length (RASP, not Dyck)
    row['uniform_length_accuracy'] = row['uniform_lengths']['program_accuracy']
    row['uniform_minus_test'] = row['uniform_length_accuracy'] - row['program_accuracy']
    # The same difference with the uniform draw's accuracy at each length weighed as the test split's lengths
    # are: what remains once the two mixes of lengths are alike (runs decompiled before this have no lengths).
    at_test = collect.at_lengths(row['uniform_lengths'].get('program_accuracy_by_length', {}),
                                 row.get('positions_by_length', {}))
    if at_test is not None:
      row['uniform_minus_test_at_test_lengths'] = at_test - row['program_accuracy']
  if 'left' in row:  # a Transformer Program's code: whether it needs a data file, what the simplifier left
    row['data_file'] = int(bool(row['tables']))
    row['left_names'] = row['left']
    row['left'] = sum(len(names) for names in row['left'].values())
  if all(taken is not None for _, _, taken in trained):
    row['train_seconds'] = sum(taken for _, _, taken in trained)
  if len(trained) > 1:
    row['initialisation'] = inits[chosen]
    row['restart_validation_accuracies'] = validation
  commands = [' '.join(['python', *command[1:]]) for _, command, _ in trained]
  return row, [*commands, ' '.join(['python', *decompile[1:]])]


def table(paths=RESULTS) -> str:
  """The docs' results table from the suite's result files."""
  summary, per_seed, provenance = {}, {}, []
  for path in paths:
    if not os.path.exists(path):
      continue
    with open(path) as f:
      record = json.load(f)
    summary.update(record['summary'])
    per_seed.update(record['per_seed'])
    provenance.append(f"`{path}` ({record['device']}, {record['date']}, commit {record['commit'][:7]})")
  cell = lambda s: f"{s['mean']:.2f} ± {s['ci95']:.2f}"
  lines = ['| task | Transformer Programs | program-trained: program | fidelity | the seed best on validation '
           '| without positions (3,000 steps): program | continuous: model | its program | fidelity '
           '| program size (lines, entries) |',
           '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  for task in PUBLISHED:
    hard, soft = summary.get(f'{task}/program'), summary.get(f'{task}/continuous')
    alibi = summary.get(f'{task}/program_alibi')
    if not (hard and soft):
      continue
    mark = '' if hard['program_accuracy']['mean'] >= PUBLISHED[task] else ' ▼'
    chosen = chosen_on_validation(per_seed[f'{task}/program'])
    best = f"{chosen[1]['program_accuracy']:.2f} (seed {chosen[0]})" if chosen else '—'
    lines.append(f"| {task} | {PUBLISHED[task]:.2f} | {cell(hard['program_accuracy'])}{mark} | "
                 f"{cell(hard['fidelity'])} | {best} | {cell(alibi['program_accuracy']) if alibi else '—'} | "
                 f"{cell(soft['model_accuracy'])} | {cell(soft['program_accuracy'])} | "
                 f"{cell(soft['fidelity'])} | {hard['lines']['mean']:.0f}, {hard['table_entries']['mean']:,.0f} |")
  return '\n'.join([
      'Test token accuracy and fidelity (%), mean ± half-width of the 95% t-interval over 3 seeds; ▼ marks a '
      'program below the published figure ("Learning Transformer Programs", Table 1). "The seed best on '
      'validation" is the test accuracy of the one program that paper\'s protocol would report: the run best '
      'on validation accuracy (they choose among 5 seeds, here 3). Written by '
      '`python -m benchmarks.suites.decompile_suite --table=docs/results/programs_table.md` from '
      + ' and '.join(provenance) + ', which hold the per-seed values and the commands.', '', *lines, ''])


def add_validation(paths=RESULTS) -> None:
  """Adds ``validation_accuracy`` to every per-seed record of ``paths`` from the run folder its training
  command names (result files written before the suite recorded it)."""
  import datetime
  import re
  for path in paths:
    if not os.path.exists(path):
      continue
    with open(path) as f:
      record = json.load(f)
    changed = False
    for key, seeds in record['per_seed'].items():
      for seed, row in seeds.items():
        if 'validation_accuracy' in row:
          continue
        # The decompile command, last, names the run decompiled (a restarted seed trains several before it).
        workdir = re.search(r'--workdir=(\S+)', record['commands'][f'{key}/{seed}'][-1]).group(1)
        row['validation_accuracy'] = validation_at(workdir)
        changed = True
      record['summary'][key]['validation_accuracy'] = sweep.stat(
          [r['validation_accuracy'] for r in seeds.values()])
    if changed:
      record['validation_accuracy_added'] = (
          f"{datetime.date.today()}: the validation accuracy of each run's decompiled checkpoint, read from its "
          f'metrics.jsonl by python -m benchmarks.suites.decompile_suite --add_validation; the test measurements '
          f'are unchanged')
      files.write_atomically(path, json.dumps(record, indent=1))
      print(f'added validation accuracy to {path}')


def write_example(task: str, path: str = 'benchmarks/results/transformer_program_example.json') -> None:
  """The program of the seed best on validation, with its measurements and one sentence per module."""
  best = None
  for seed in (init for s in map(int, _SEEDS.value) for init in initialisations(task, 'transformer_program', s)):
    workdir = os.path.join(_RUNS.value, f'{task}_transformer_program_seed{seed}')
    if not os.path.exists(os.path.join(workdir, 'program', 'measured.json')):
      continue  # an initialisation a restart did not keep: never decompiled
    with open(os.path.join(workdir, 'program', 'measured.json')) as f:
      measured = json.load(f)
    measured['validation_accuracy'] = validation_at(workdir)
    if best is None or measured['validation_accuracy'] > best[1]['validation_accuracy']:
      best = seed, measured, workdir
  seed, measured, workdir = best
  with open(measured['program']) as f:
    source = f.read()
  train = [sys.executable, '-m', 'symjax.main', *recipe(task, 'transformer_program'), f'--config.seed={seed}',
           '--config.progress_bar=false', f'--workdir={workdir}']
  result_files.write(path, {
      'what': f'the decompiled program of the {task} run best on validation accuracy among seeds '
              f'{_SEEDS.value}, its measurements on the test split and one sentence per head and MLP',
      'task': task, 'seed': seed, 'train_command': ' '.join(['python', *train[1:]]),
      **{k: measured[k] for k in ('program_accuracy', 'fidelity', 'validation_accuracy', 'lines',
                                  'table_entries', 'notes')},
      'source': source})


def main(_):
  if _ADD_VALIDATION.value:
    add_validation()
    return
  if _EXAMPLE.value:
    write_example(_EXAMPLE.value)
    return
  if _TABLE.value:
    with open(_TABLE.value, 'w') as f:
      f.write(table())
    print(f'wrote {_TABLE.value}')
    return
  per_seed, commands, summary = {}, {}, {}
  lock = threading.Lock()
  runs = [(task, mode, seed) for task in _TASKS.value for mode in _MODES.value for seed in map(int, _SEEDS.value)
          # the induction recipe's program training has no learned positions: 'program' is this
          if not (task == 'induction' and mode == 'program_alibi')]

  def record(task, mode, seed, row, command):
    key = f'{task}/{mode}'
    with lock:
      commands[f'{key}/{seed}'] = command
      per_seed.setdefault(key, {})[str(seed)] = {m: row[m] for m in MEASURES + PER_SEED_FIELDS if m in row}
      print(key, seed, {m: round(row[m], 2) for m in MEASURES if m in row}, flush=True)
      summary[key] = {m: sweep.stat([r[m] for r in per_seed[key].values()]) for m in MEASURES
                      if all(m in r for r in per_seed[key].values())}
      what = ('decompiled programs of the Symbolic Transformer on the test split: program accuracy, '
              'fidelity to the model, model accuracy (% of tagged positions), program size, seconds to decompile '
              'and to predict the split (program; model compiled and warm); mean and 95% t-interval over seeds')
      if _STEPS.value:
        what = (f'speed only, runs of {_STEPS.value} steps (their accuracies are not results): seconds to '
                f'decompile and to predict the test split (program in one call; model compiled and warm), '
                f'program size')
      result_files.write(_JSON.value, {
          'what': what, 'published_program_accuracy': PUBLISHED,
          'commands': commands, 'summary': summary, 'per_seed': per_seed})

  # Every initialisation is one training job, so that --jobs stays busy across seeds; a seed is decompiled
  # (here, one at a time) as soon as its initialisations are trained.
  with concurrent.futures.ThreadPoolExecutor(_JOBS.value) as pool:
    trained = {(task, mode, init): pool.submit(train, task, mode, init)
               for task, mode, seed in runs for init in initialisations(task, mode, seed)}
    for task, mode, seed in runs:
      for init in initialisations(task, mode, seed):
        trained[task, mode, init].result()
      record(task, mode, seed, *one(task, mode, seed))
  print('\n| task | mode | program accuracy | fidelity | model accuracy | published |\n|---|---|---:|---:|---:|---:|')
  for key, stats in summary.items():
    task, mode = key.split('/')
    cell = lambda m: f"{stats[m]['mean']:.2f} ± {stats[m]['ci95']:.2f}"
    print(f"| {task} | {mode} | {cell('program_accuracy')} | {cell('fidelity')} | {cell('model_accuracy')} | "
          f'{PUBLISHED[task]:.2f} |')


if __name__ == '__main__':
  app.run(main)
