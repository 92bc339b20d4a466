"""Chooses, per (task, kind), the best of several collected sweeps on validation loss, and prints the tables.

  python -m benchmarks.analysis.combine_sweeps benchmarks/results/suite_h100.json benchmarks/results/untied_h100.json \
      [--json=benchmarks/results/suite_tied_untied_h100.json] [--kinds=standard,token_factored,symbolic]

Each input is a file written by `benchmarks/analysis/collect_sweeps.py`. The candidates of kind K on a task are the
sweeps named ``<task>/K<suffix>`` for each of ``--suffixes`` in any input (by default ``symbolic`` with the
tied readout and ``symbolic_untied``; not ``symbolic_dense_untied``), so every kind is tuned over the union
of its grids — the same union for every kind when every kind has the same sweeps. A sweep's chosen point is
its best row on validation loss, so the best chosen point over the candidates is the best point of the
union; its test metrics are reported (test read once, for that point only).
"""

import json
import math
import sys

from absl import app, flags

from benchmarks.lib.collect import RASP, TRANSFORMER_PROGRAMS, cell
from symjax.train import sweep

_JSON = flags.DEFINE_string('json', 'benchmarks/results/suite_tied_untied_h100.json',
                            'Where to write the chosen points.')
_KINDS = flags.DEFINE_list('kinds', ['standard', 'token_factored', 'symbolic'], 'The kinds to choose for.')
_SUFFIXES = flags.DEFINE_list('suffixes', ['', '_untied'],
                              'Sweep-name suffixes that are candidates of a kind ("" is the kind itself).')


def validation(entry: dict) -> dict:
  chosen = entry['chosen']['name']
  return next(r for r in entry['rows'] if r['name'] == chosen)['validation/loss']


def main(argv):
  if len(argv) < 2:
    raise app.UsageError('usage: combine_sweeps.py COLLECTED.json [COLLECTED.json ...]')
  sweeps, sources = {}, {}
  for path in argv[1:]:
    with open(path) as f:
      for key, entry in json.load(f)['sweeps'].items():
        sweeps[key], sources[key] = entry, path
  tasks = sorted({key.split('/')[0] for key in sweeps})
  out = {}
  for task in tasks:
    for kind in _KINDS.value:
      keys = [f'{task}/{kind}{s}' for s in _SUFFIXES.value if f'{task}/{kind}{s}' in sweeps]
      if not keys:
        continue
      best = min(keys, key=lambda k: validation(sweeps[k])['mean'])
      out[f'{task}/{kind}'] = {
          'chosen_sweep': best, 'source': sources[best], 'chosen': sweeps[best]['chosen'],
          'validation/loss': validation(sweeps[best]), 'command': sweeps[best].get('command'),
          'candidates': {k: {'point': sweeps[k]['chosen']['name'], 'validation/loss': validation(sweeps[k])}
                         for k in keys}}

  print('| task | kind | chosen sweep | chosen point | validation loss | test loss | test accuracy |')
  print('|---|---|---|---|---:|---:|---:|')
  for task in ('text', 'fol'):
    for kind in _KINDS.value:
      c = out.get(f'{task}/{kind}')
      if c:
        print(f"| {task} | {kind} | {c['chosen_sweep']} | {c['chosen']['name']} | {cell(c['validation/loss'])} | "
              f"{cell(c['chosen']['test/loss'])} | {cell(c['chosen']['test/accuracy'])} |")
  for kind in _KINDS.value:
    c = out.get(f'fol/{kind}')
    if c:
      ppl = [math.exp(v) for v in c['chosen']['test/loss']['values']]
      mean, ci = sweep.interval(ppl)
      c['test/perplexity'] = {'mean': mean, 'ci95': ci, 'values': ppl}
      print(f'fol {kind}: test perplexity {mean:.3f} ± {ci:.3f} ({c["chosen_sweep"]})')

  print('\n| RASP task | Transformer Programs | ' + ' | '.join(_KINDS.value) + ' |')
  print('|---|---:|' + '---:|' * len(_KINDS.value))
  reached = {kind: 0 for kind in _KINDS.value}
  for task in RASP:
    cells = []
    for kind in _KINDS.value:
      c = out.get(f'{task}/{kind}')
      if c is None:
        cells.append('not run')
        continue
      acc = c['chosen']['test/accuracy']
      below = 100 * acc['mean'] < TRANSFORMER_PROGRAMS[task]
      reached[kind] += not below
      # The readout: from the chosen grid point when the grid had it, else from the sweep's name.
      tie = c['chosen']['point'].get('model.tie_embeddings', not c['chosen_sweep'].endswith('_untied'))
      tied = ' (tied)' if tie else ''
      cells.append(cell(acc, 100, 2) + (' ▼' if below else '') + tied)
    print(f'| {task} | {TRANSFORMER_PROGRAMS[task]:.2f} | ' + ' | '.join(cells) + ' |')
  print('\nRASP tasks at or above the Transformer Programs figure (mean of seeds): '
        + ', '.join(f'{k} {n}/7' for k, n in reached.items()))

  with open(_JSON.value, 'w') as f:
    json.dump({'inputs': argv[1:], 'kinds': _KINDS.value, 'suffixes': _SUFFIXES.value,
               'combined_with': 'python -m benchmarks.analysis.combine_sweeps ' + ' '.join(sys.argv[1:]), 'chosen': out},  # noqa: E501
              f, indent=1)
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
