"""Token accuracy of a trained tagging run by sequence length and by position, on one split.

  python -m benchmarks.analysis.accuracy_by_position --workdir=runs/<dir> [--split=test] [--json=PATH]

Counts only the positions with a target (weight > 0); position j is the j-th such position of a sequence
(for RASP tasks: the j-th content token, after ``<s>``). Prints one row per length with its accuracy per
position, and writes the table as JSON.
"""


import numpy as np
from absl import app, flags

import symjax
from benchmarks.lib import cli
from benchmarks.lib import results as result_files
from symjax import tasks

_WORKDIR = flags.DEFINE_string('workdir', None, 'Work directory of a trained run.', required=True)
_SPLIT = flags.DEFINE_string('split', 'test', 'The split to score.')
_JSON = cli.json_output('', 'Where to write the table ("" prints only).')


def main(_):
  run = symjax.load(_WORKDIR.value)
  task = tasks.get_task(run.config)
  hits: dict[int, list[np.ndarray]] = {}
  for batch in task.eval_batches(_SPLIT.value, 256, run.config.data_seed):
    logits = run.model.apply({'params': run.params}, batch['inputs'], batch['key_mask'])
    correct = np.asarray(logits).argmax(-1) == batch['targets']
    for row, weight in zip(correct, batch['weights'] > 0):
      if weight.any():
        hits.setdefault(int(weight.sum()), []).append(row[weight])
  table = {}
  print(f'{_WORKDIR.value}, split {_SPLIT.value}: token accuracy (%) by length and position')
  print('| length | sequences | accuracy | by position |')
  print('|---:|---:|---:|---|')
  for length in sorted(hits):
    rows = np.stack(hits[length])
    per_position = 100 * rows.mean(0)
    table[length] = {'sequences': len(rows), 'accuracy': float(100 * rows.mean()),
                     'by_position': [float(p) for p in per_position]}
    print(f'| {length} | {len(rows)} | {100 * rows.mean():.1f} | '
          + ' '.join(f'{p:.0f}' for p in per_position) + ' |')
  if _JSON.value:
    result_files.write(_JSON.value, {'workdir': _WORKDIR.value, 'split': _SPLIT.value, 'by_length': table})
    print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
