"""Validation accuracy of finished training runs, for choosing a recipe on validation data only.

  python -m benchmarks.analysis.collect_validation --json=benchmarks/results/program_gumbel.json \
      --what='...' --command='python -m symjax.main ... --workdir=RUN' RUN_DIR [RUN_DIR ...]

Per run: task, seed, the model settings that differ from the recipe's (``--fields``), the validation token
accuracy at every evaluation and the best; then, per task and setting, the mean and 95% interval of the
best over seeds. The test split is never read here.
"""

from __future__ import annotations

import collections
import json

from absl import app, flags

from benchmarks.lib import results as result_files
from benchmarks.lib.collect import run_record
from symjax.train.sweep import stat

_JSON = flags.DEFINE_string('json', None, 'Output.', required=True)
_WHAT = flags.DEFINE_string('what', '', 'What the runs compare (written to the JSON).')
_COMMAND = flags.DEFINE_string('command', '', 'The training command of the runs, RUN for the run folder.')
_FIELDS = flags.DEFINE_list('fields', ['gumbel_scale', 'gumbel_scale_end', 'numerical_heads'],
                            'config.model fields that tell the settings apart (or, not a model field, a '
                            'field of the config itself: learning_rate, weight_decay, eval_every_steps).')


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
