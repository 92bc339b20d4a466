"""Validation accuracy with every input length weighed alike: a validation measure for recipes meant to learn
short inputs, whose splits hold few of them (each distinct input once, so 80% of sort's have the longest
content).

  python -m benchmarks.analysis.length_balanced --recipe=default=DIR,DIR,DIR --recipe=balanced=DIR,DIR,DIR
      [--split=validation] [--json=benchmarks/results/transformer_program_sort_length_balanced_validation.json]

For each run (a trained RASP tagging run's work directory, the checkpoint ``symjax.load`` picks): token
accuracy per length (the number of tagged positions), then their mean, each length weighing the same as the
task draws lengths; per recipe the mean and 95% interval over its runs. Reads ``--split`` only.
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from benchmarks.lib import cli
from benchmarks.lib import results as result_files
from benchmarks.lib.by_length import hits_by_length
from symjax.train import sweep

_RECIPES = flags.DEFINE_multi_string('recipe', [], 'label=DIR,DIR,...: the runs of one recipe, one per seed.')
_SPLIT = flags.DEFINE_string('split', 'validation', 'The split scored.')
_JSON = cli.json_output('benchmarks/results/transformer_program_sort_length_balanced_validation.json',
                        'Output ("" prints).')


def balanced_accuracy(workdir: str, split: str) -> tuple[float, dict[int, float]]:
  """The mean over lengths of the token accuracy (%) at each length, and those accuracies."""
  by_length = {length: float(100 * rows.mean()) for length, rows in sorted(hits_by_length(workdir, split).items())}
  return float(np.mean(list(by_length.values()))), by_length


def main(_):
  recipes = {}
  for item in _RECIPES.value:
    label, _, dirs = item.partition('=')
    if not label or not dirs:
      raise app.UsageError(f'--recipe takes label=DIR,DIR,..., got {item!r}')
    recipes[label] = dirs.split(',')
  if not recipes:
    raise app.UsageError('give at least one --recipe=label=DIR,DIR,...')
  per_run, summary = {}, {}
  for label, dirs in recipes.items():
    values = []
    for workdir in dirs:
      balanced, by_length = balanced_accuracy(workdir, _SPLIT.value)
      per_run[workdir] = {'recipe': label, 'length_balanced_accuracy': balanced, 'by_length': by_length}
      values.append(balanced)
    summary[label] = sweep.stat(values)
  print(f'| recipe | {_SPLIT.value} accuracy, lengths weighed alike |\n|---|---:|')
  for label, st in summary.items():
    print(f"| {label} | {st['mean']:.2f} ± {st['ci95']:.2f} |")
  if _JSON.value:
    result_files.write(_JSON.value, {
        'what': f'{_SPLIT.value} token accuracy (%) with every length weighed alike (the mean over lengths of '
                'the accuracy at each), per run and per recipe (mean and 95% t-interval over its runs)',
        'split': _SPLIT.value, 'summary': summary, 'per_run': per_run})


if __name__ == '__main__':
  app.run(main)
