"""Gathers the sweeps of `benchmarks/suites/sweep_suite.sh` into one table and one JSON file.

  python -m benchmarks.analysis.collect_sweeps ROOT [--json=suite.json] [--device="..."] [--kinds=a,b,...]

ROOT/<task>/<kind>/sweep.json, one per (task, kind). For each: the chosen grid point (by validation loss),
its validation loss and test metrics as mean ± 95% interval over seeds, with per-seed values. Text and FOL
report loss (and FOL perplexity, exp of the loss); RASP tasks report token accuracy in percent next to the
Transformer Programs figure ("Learning Transformer Programs", Table 1). Sweeps that did not finish are
listed as missing.
"""

import glob
import json
import math
import os
import sys

from absl import app, flags

from benchmarks.lib import results as result_files
from benchmarks.lib.collect import RASP, TRANSFORMER_PROGRAMS, cell
from symjax.train import sweep

_JSON = flags.DEFINE_string('json', 'suite.json', 'Where to write the gathered results.')
_KINDS = flags.DEFINE_list('kinds', ['standard', 'token_factored', 'symbolic'],
                          'The <kind> folders to gather (variants_suite.sh names its variants).')
_DEVICE = flags.DEFINE_string('device', '', 'The device the sweeps ran on, recorded in the JSON.')



def main(argv):
  if len(argv) != 2:
    raise app.UsageError('usage: collect_sweeps.py ROOT')
  root = argv[1]
  kinds = _KINDS.value
  results = {}
  for task in sorted(os.listdir(root)):
    for kind in kinds:
      path = os.path.join(root, task, kind, 'sweep.json')
      if os.path.exists(path):
        with open(path) as f:
          results[f'{task}/{kind}'] = json.load(f)
  chosen = lambda key: results[key]['chosen'] if key in results else None

  print('| task | kind | chosen | validation loss | test loss | test accuracy |')
  print('|---|---|---|---:|---:|---:|')
  for task in ('text', 'fol'):
    for kind in kinds:
      c = chosen(f'{task}/{kind}')
      if c is None:
        print(f'| {task} | {kind} | not run | | | |')
        continue
      row = next(r for r in results[f'{task}/{kind}']['rows'] if r['name'] == c['name'])
      print(f"| {task} | {kind} | {c['name']} | {cell(row['validation/loss'])} | {cell(c['test/loss'])} | "
            f"{cell(c['test/accuracy'])} |")
  for kind in kinds:
    c = chosen(f'fol/{kind}')
    if c is not None:
      ppl = [math.exp(v) for v in c['test/loss']['values']]
      print(f'fol {kind}: test perplexity {sweep.interval(ppl)[0]:.3f} ± {sweep.interval(ppl)[1]:.3f}')

  print('\n| RASP task | Transformer Programs | ' + ' | '.join(kinds) + ' |')
  print('|---|---:|' + '---:|' * len(kinds))
  for task in RASP:
    cells = [cell((chosen(f'{task}/{k}') or {}).get('test/accuracy'), 100, 2) for k in kinds]
    print(f'| {task} | {TRANSFORMER_PROGRAMS[task]:.2f} | ' + ' | '.join(cells) + ' |')

  # ALiBi extrapolation of the chosen point: accuracy on lengths 12 and 16 after training at 8, read from the
  # seeds' final_metrics.json (sweep.json keeps the test split only).
  print('\n| RASP task | ' + ' | '.join(f'{k} (length 12 / 16)' for k in kinds) + ' |')
  print('|---|' + '---:|' * len(kinds))
  for task in RASP:
    cells = []
    for kind in kinds:
      key, c = f'{task}/{kind}', chosen(f'{task}/{kind}')
      folders = sorted(glob.glob(os.path.join(root, task, kind, c['name'], 'seed_*'))) if c else []
      finals = [json.load(open(os.path.join(d, 'final_metrics.json'))) for d in folders]
      stats = {n: sweep.stat([100 * f[n]['accuracy'] for f in finals])
               for n in ('length_12', 'length_16') if finals and all(n in f for f in finals)}
      if stats:
        results[key]['extrapolation'] = stats
      cells.append(' / '.join(cell(st, 1, 1) for st in stats.values()) or '—')
    print(f'| {task} | ' + ' | '.join(cells) + ' |')

  suite = 'sweep_suite' if kinds == _KINDS.default else 'variants_suite'
  result_files.write(_JSON.value, {'device': _DEVICE.value, 'command': f'bash benchmarks/suites/{suite}.sh {root}',
               'collected_with': 'python -m benchmarks.analysis.collect_sweeps ' + ' '.join(sys.argv[1:]),
               'sweeps': results})
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
