"""Validation accuracy of finished training runs, for choosing a recipe on validation data only.

  python -m benchmarks.analysis.collect_validation --json=benchmarks/results/program_gumbel.json \
      --what='...' --command='python -m symjax.main ... --workdir=RUN' RUN_DIR [RUN_DIR ...]

Per run: task, seed, the model settings that differ from the recipe's (``--fields``), the validation token
accuracy at every evaluation and the best; then, per task and setting, the mean and 95% interval of the
best over seeds. The test split is never read here.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os

from absl import app, flags

from benchmarks.lib import results as result_files
from symjax.model import ModelConfig
from symjax.system.errors import InputError
from symjax.train.sweep import stat

# A run from before a field existed trained with its default.
DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
_JSON = flags.DEFINE_string('json', None, 'Output.', required=True)
_WHAT = flags.DEFINE_string('what', '', 'What the runs compare (written to the JSON).')
_COMMAND = flags.DEFINE_string('command', '', 'The training command of the runs, RUN for the run folder.')
_FIELDS = flags.DEFINE_list('fields', ['gumbel_scale', 'gumbel_scale_end', 'numerical_heads'],
                            'config.model fields that tell the settings apart (or, not a model field, a '
                            'field of the config itself: learning_rate, weight_decay, eval_every_steps).')


def setting(config: dict, name: str):
  """A model field of a run's config (its default for a run from before the field existed), else a field
  of the config itself."""
  if name in config['model'] or name in DEFAULTS:
    return config['model'].get(name, DEFAULTS.get(name))
  if name not in config:
    raise InputError(f'{name!r} is neither a config.model field nor a config field')
  return config[name]


def run_record(path: str, fields: list[str]) -> dict:
  config_path, metrics_path = os.path.join(path, 'config.json'), os.path.join(path, 'metrics.jsonl')
  for p in (config_path, metrics_path):
    if not os.path.isfile(p):
      raise InputError(f'{path} is not a finished training run: {os.path.basename(p)} is missing')
  with open(config_path) as f:
    config = json.load(f)
  by_step = {}
  with open(metrics_path) as f:
    for line in f:
      row = json.loads(line)
      if row.get('split') == 'validation':
        by_step[str(row['step'])] = 100 * row['accuracy']
  if not by_step:
    raise InputError(f'{path} has no validation evaluation in metrics.jsonl')
  return {'run': os.path.basename(os.path.normpath(path)), 'task': config['task'], 'seed': config['seed'],
          'setting': {name: setting(config, name) for name in fields},
          'steps': config['total_steps'], 'validation_accuracy_by_step': by_step,
          'best_validation_accuracy': max(by_step.values())}


def main(argv):
  runs = [run_record(path, _FIELDS.value) for path in argv[1:]]
  if not runs:
    raise app.UsageError('name at least one run folder')
  groups = collections.defaultdict(list)
  for r in runs:
    groups[(r['task'], json.dumps(r['setting'], sort_keys=True))].append(r)
  summary = []
  print('| task | setting | seeds | best validation accuracy (per seed) | mean ± 95% |\n|---|---|---:|---|---:|')
  for (task, setting), rs in sorted(groups.items()):
    rs.sort(key=lambda r: r['seed'])
    best = [r['best_validation_accuracy'] for r in rs]
    s = stat(best)
    summary.append({'task': task, 'setting': json.loads(setting), 'seeds': [r['seed'] for r in rs],
                    'best_validation_accuracy': s})
    print(f"| {task} | {setting} | {len(rs)} | {', '.join(f'{b:.3f}' for b in best)} | "
          f"{s['mean']:.3f} ± {s['ci95']:.3f} |")
  result_files.write(_JSON.value, {'command': _COMMAND.value, 'what': _WHAT.value, 'summary': summary,
                                   'runs': runs})


if __name__ == '__main__':
  app.run(main)
