"""Standard, Token-Factored and Symbolic Transformers on the seven RASP tasks, next to the published
Transformer Programs figures ("Learning Transformer Programs", Table 1).

  python -m benchmarks.suites.rasp_suite [--json=rasp_suite.json] [--steps=3000] [--workdir=/tmp/rasp_suite]

Each run is `configs/rasp.py:task=<task>,model=<kind>` (3 layers, 4 heads × 16, batch 64), one seed.
Prints a Markdown table of test token accuracy (and length generalisation at 12 and 16), parameters and
wall time, and writes JSON.
"""

import json
import os
import time

from absl import app, flags

from benchmarks.lib import cli
from benchmarks.lib import results as result_files

_JSON = cli.json_output('rasp_suite.json')
_STEPS = cli.steps(3000, 'Training steps per run.')
_WORKDIR = flags.DEFINE_string('workdir', '/tmp/rasp_suite', 'Parent of the runs\' work directories.')
_TASKS = flags.DEFINE_list('tasks', None, 'Subset of tasks (default: all seven).')
_KINDS = cli.kinds()


def main(_):
  from symjax import configs
  from symjax.model import ModelConfig, count_params
  from symjax.run import workdir as rundir
  from symjax.tasks import rasp
  from symjax.train import trainer as train
  results = json.load(open(_JSON.value)) if os.path.exists(_JSON.value) else {}
  for task in _TASKS.value or rasp.TASKS:
    for kind in _KINDS.value:
      key = f'{task}/{kind}'
      if key in results:
        continue
      config = configs.from_file(f'configs/rasp.py:task={task},model={kind}')
      config.total_steps = _STEPS.value
      config.progress_bar = False
      start = time.time()
      final = train.train_and_evaluate(config, os.path.join(_WORKDIR.value, task, kind))
      seconds = time.time() - start
      run = json.load(open(os.path.join(_WORKDIR.value, task, kind, rundir.RUN_FILE)))
      results[key] = {'test': final['test']['accuracy'], 'test_sequence': final['test']['sequence_accuracy'],
                      'length_12': final.get('length_12', {}).get('accuracy'),
                      'length_16': final.get('length_16', {}).get('accuracy'),
                      'parameters': count_params(ModelConfig.from_dict(run['model'])),
                      'seconds': seconds}
      result_files.write(_JSON.value, results)
  print('| task | Transformer Programs | standard | token_factored | symbolic |')
  print('|---|---:|---:|---:|---:|')
  for task in rasp.TASKS:
    cells = []
    for kind in ('standard', 'token_factored', 'symbolic'):
      r = results.get(f'{task}/{kind}')
      if r is None:
        cells.append('—')
        continue
      mark = ' ▼' if 100 * r['test'] < rasp.PUBLISHED[task] else ''
      extra = f" ({100 * r['length_12']:.1f} / {100 * r['length_16']:.1f})" if r['length_12'] is not None else ''
      cells.append(f"{100 * r['test']:.2f}{mark}{extra}")
    print(f'| {task} | {rasp.PUBLISHED[task]:.2f} | ' + ' | '.join(cells) + ' |')
  print('\n| task | model | parameters | time |')
  print('|---|---|---:|---:|')
  for key, r in results.items():
    task, kind = key.split('/')
    print(f"| {task} | {kind} | {r['parameters']:,} | {r['seconds']:.0f} s |")
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
