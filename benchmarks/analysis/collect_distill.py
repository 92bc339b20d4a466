"""Collects ``benchmarks/suites/distill_suite.sh`` into one table and JSON.

  python -m benchmarks.analysis.collect_distill [ROOT=runs/distill_suite] [--json=benchmarks/results/distillation.json]

Per task, student kind and mode (scratch / distilled): test accuracy and loss, mean ± 95% interval over the
3 seeds with per-seed values, the teacher's test metrics, and for distilled students the last logged
distances to the teacher (KL of the logits, x_t and x_e stream distances).
"""

import glob
import json
import os
import sys

from benchmarks.lib import results as result_files
from benchmarks.lib.collect import cell, root_and_json
from symjax.train.sweep import stat


def last_train_record(seed_dir: str) -> dict:
  with open(os.path.join(seed_dir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f if '"train"' in line]
  return rows[-1] if rows else {}


def main(argv):
  root, out = root_and_json(argv, 'runs/distill_suite', 'benchmarks/results/distillation.json')
  rows, teachers = [], {}
  for task in ('reverse', 'text'):
    path = os.path.join(root, task, 'teacher', 'final_metrics.json')
    if os.path.isfile(path):
      teachers[task] = json.load(open(path))['test']
    for kind in ('token_factored', 'symbolic'):
      for mode in ('scratch', 'distill'):
        sweep = os.path.join(root, task, f'{kind}_{mode}', 'sweep.json')
        if not os.path.isfile(sweep):
          print(f'missing: {sweep}', file=sys.stderr)
          continue
        command = json.load(open(sweep))['command']
        seed_dirs = sorted(glob.glob(os.path.join(root, task, f'{kind}_{mode}', 'base', 'seed_*')))
        finals = [json.load(open(os.path.join(d, 'final_metrics.json'))) for d in seed_dirs]
        row = {'task': task, 'kind': kind, 'mode': mode, 'command': command, 'seeds': len(finals)}
        for split, metric in (('test', 'accuracy'), ('test', 'loss'), ('validation', 'loss')):
          row[f'{split}/{metric}'] = stat([f[split][metric] for f in finals])
        if mode == 'distill':
          last = [last_train_record(d) for d in seed_dirs]
          for key in ('distill/kl', 'distill/x_t', 'distill/x_e'):
            values = [r[key] for r in last if key in r]
            if values:
              row[f'final_train/{key}'] = stat(values)
        rows.append(row)
  print('| task | student | trained | test accuracy (%) | test loss | end KL to teacher | end x_t / x_e distance |')
  print('|---|---|---|---:|---:|---:|---:|')
  for r in rows:
    kl = r.get('final_train/distill/kl')
    xs = [r.get(f'final_train/distill/{s}') for s in ('x_t', 'x_e')]
    acc, loss = r['test/accuracy'], r['test/loss']
    ends = ' / '.join(f"{x['mean']:.3f}" for x in xs if x)
    print(f"| {r['task']} | {r['kind']} | {r['mode']} | {cell(acc, 100, 2)} | {cell(loss)} | "
          f"{'' if kl is None else format(kl['mean'], '.3f')} | {ends} |")
  for task, t in teachers.items():
    print(f"teacher ({task}, standard, seed 0): test accuracy {100 * t['accuracy']:.2f}%, loss {t['loss']:.4f}")
  result_files.write(out, {'command': 'bash benchmarks/suites/distill_suite.sh runs/distill_suite',
                           'teachers': teachers, 'rows': rows})


if __name__ == '__main__':
  main(sys.argv)
