"""Interpretability measurements on trained models: the induction circuit and its knockout, token
importance against known ground truth, and how much accuracy depends on each stream.

  python -m benchmarks.suites.interpretability [--json=interpretability.json] [--train_missing]

Work directories (trained with `python -m symjax.main`): --induction=/tmp/final_{kind} (configs/<kind>.py,
the default induction job) and --rasp=/tmp/rasp_suite/{task}/{kind} (benchmarks/suites/rasp_suite.py). With
--train_missing the absent ones are trained first with the default settings. Prints Markdown tables and
writes JSON.
"""

import json
import os
import time

from absl import app, flags, logging

from benchmarks.lib import cli
from benchmarks.lib import results as result_files

_JSON = cli.json_output('interpretability.json')
_INDUCTION = flags.DEFINE_string('induction', '/tmp/final_{kind}', 'Induction runs, {kind} substituted.')
_RASP = flags.DEFINE_string('rasp', '/tmp/rasp_suite/{task}/{kind}', 'RASP runs, {task} and {kind} substituted.')
_RASP_TASKS = flags.DEFINE_list('rasp_tasks', ['reverse', 'sort', 'hist', 'double_hist', 'most_freq', 'dyck1',
                                               'dyck2'], 'RASP tasks for the stream ablations.')
_SEQUENCES = flags.DEFINE_integer('sequences', 1000, 'Test sequences used for token importance.')
_IG_STEPS = flags.DEFINE_integer('ig_steps', 128, 'Integrated-gradients steps.')
_TRAIN = flags.DEFINE_bool('train_missing', False, 'Train the runs that do not exist yet.')

KINDS = ('standard', 'token_factored', 'symbolic')


def ensure(workdir, config_fn):
  from symjax.run import workdir as rundir
  from symjax.train import trainer as train
  if not os.path.isfile(os.path.join(workdir, rundir.RUN_FILE)):
    if not _TRAIN.value:
      raise FileNotFoundError(f'{workdir} has no trained run; train it or pass --train_missing')
    config = config_fn()
    config.progress_bar = False
    train.train_and_evaluate(config, workdir)
  import symjax
  return symjax.load(workdir)


def test_set(run, limit=None):
  from symjax import tasks
  from symjax.interpret import induction
  task = tasks.get_task(run.config)
  batch = induction.concat(task.eval_batches('test', 500, run.config.seed))
  keep = batch['weights'].sum(1) > 0                         # drop the padding rows of the last batch
  batch = {k: v[keep][:limit] for k, v in batch.items()}
  return task, batch


def split(batch, size=250):
  n = len(batch['inputs'])
  return [{k: v[s:s + size] for k, v in batch.items()} for s in range(0, n, size)]


def main(_):
  logging.set_verbosity(logging.ERROR)
  from symjax import configs
  from symjax.interpret import attribution, induction
  results = json.load(open(_JSON.value)) if os.path.exists(_JSON.value) else {}

  def save():
    result_files.write(_JSON.value, results)

  runs = {}
  for kind in KINDS:
    runs[('induction', kind)] = ensure(_INDUCTION.value.format(kind=kind), lambda: configs.from_file(kind))
    for task in sorted(set(_RASP_TASKS.value) | {'reverse'}):
      if task == 'reverse' or kind != 'standard':
        runs[(task, kind)] = ensure(_RASP.value.format(task=task, kind=kind),
                                    lambda: configs.from_file(f'configs/rasp.py:task={task},model={kind}'))

  # 1. The induction circuit and its knockout, over the whole test split.
  for kind in KINDS:
    key = f'circuit/{kind}'
    if key in results:
      continue
    run = runs[('induction', kind)]
    task, batch = test_set(run)
    circuit = induction.find_circuit(run.model, run.params, batch, task.vocab)
    results[key] = {
        'description': circuit.describe(), 'previous_token_head': circuit.previous_token_head,
        'induction_head': circuit.induction_head, 'previous_token_heads': circuit.previous_token_heads,
        'induction_heads': circuit.induction_heads,
        'previous_token_scores': circuit.previous_token_scores.round(4).tolist(),
        'induction_scores': circuit.induction_scores.round(4).tolist(),
        **{f'knockout_{mode}': induction.knockouts(run.model, run.params, batch, task.vocab, circuit, mode)
           for mode in induction.KNOCKOUT_MODES},
        'context_guess_accuracy': induction.context_guess_accuracy(batch, task.vocab), 'chance': 0.25}
    save()

  # 2. Token importance, precision@1, on the first test sequences.
  for task_name in ('induction', 'reverse'):
    for kind in KINDS:
      key = f'importance/{task_name}/{kind}'
      if key in results:
        continue
      run = runs[(task_name, kind)]
      task, batch = test_set(run, _SEQUENCES.value)
      start = time.time()
      r = attribution.evaluate_importance(run.model, run.params, split(batch), task_name, task.vocab,
                                          run.model_config.causal, 1, _IG_STEPS.value)
      results[key] = {**r, 'sequences': len(batch['inputs']), 'seconds': time.time() - start}
      save()

  # 3. Stream ablations of the two-stream models.
  for task_name in ('induction', *_RASP_TASKS.value):
    for kind in ('token_factored', 'symbolic'):
      key = f'streams/{task_name}/{kind}'
      if key in results:
        continue
      run = runs[(task_name, kind)]
      task, batch = test_set(run)
      results[key] = attribution.stream_ablations(run.model, run.params, split(batch, 500))
      save()

  print_tables(results)


def print_tables(results):
  pct = lambda x: f'{100 * x:.1f}'
  print('\n## Induction circuit (test split, positions that need induction)\n')
  print('| model | previous-token head(s) | induction head(s) | knockout | accuracy | top induction head out | '
        'all induction heads out | previous-token heads out | numbers only, all induction heads out |')
  print('|---|---|---|---|---:|---:|---:|---:|---:|')
  names = lambda heads: ', '.join(f'L{l}.H{h}' for l, h in heads)
  for kind in KINDS:
    r = results.get(f'circuit/{kind}')
    if not r:
      continue
    for mode in ('resample', 'mean', 'zero'):
      k = list(r[f'knockout_{mode}'].values())
      print(f"| {kind} | {names(r['previous_token_heads'])} | {names(r['induction_heads'])} | {mode} | "
            f"{pct(k[0]['accuracy'])} | {pct(k[1]['accuracy'])} | {pct(k[2]['accuracy'])} | {pct(k[3]['accuracy'])} | "
            f"{pct(k[2]['numbers_accuracy'])} |")
  for kind in KINDS:
    r = results.get(f'circuit/{kind}')
    if r:
      print(f"{kind}: context guess {pct(r['context_guess_accuracy'])}%, chance {pct(r['chance'])}%")
  print('\n## Token importance: precision@1 against the known source positions\n')
  print('| task | model | native | integrated gradients | input × gradient | |IG| | |I×G| | random | queries |')
  print('|---|---|---:|---:|---:|---:|---:|---:|---:|')
  for task in ('induction', 'reverse'):
    for kind in KINDS:
      r = results.get(f'importance/{task}/{kind}')
      if r:
        print(f"| {task} | {kind} | {pct(r['native'])} | {pct(r['integrated_gradients'])} | "
              f"{pct(r['input_x_gradient'])} | {pct(r['|integrated_gradients|'])} | {pct(r['|input_x_gradient|'])} | "
              f"{pct(r['random'])} | {r['queries']} |")
  print('\n## Stream ablations: test token accuracy (%)\n')
  print('| task | model | as trained | readout without X_e | readout without X_t | all X_e updates mean-ablated '
        '| all X_t updates mean-ablated |')
  print('|---|---|---:|---:|---:|---:|---:|')
  for key, r in results.items():
    if key.startswith('streams/'):
      _, task, kind = key.split('/')
      print(f"| {task} | {kind} | {pct(r['none'])} | {pct(r['readout_without_x_e'])} | "
            f"{pct(r['readout_without_x_t'])} | {pct(r['x_e_mean'])} | {pct(r['x_t_mean'])} |")


if __name__ == '__main__':
  app.run(main)
