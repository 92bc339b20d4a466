"""Collects ``benchmarks/suites/graph_suite.sh``'s sweeps into one table and JSON.

  python -m benchmarks.analysis.collect_graph [ROOT=runs/graph_suite] [--json=benchmarks/results/graph_distance.json]

For each kind with and without edges: test token accuracy (every node scored), test sequence accuracy
(every node of a graph right) and validation loss, mean ± 95% interval over the seeds, per-seed values.
"""

import glob
import json
import os
import sys

from benchmarks.lib import results as result_files
from benchmarks.lib.collect import cell, root_and_json
from symjax.train.sweep import stat

KINDS = ('standard', 'token_factored', 'symbolic')


def main(argv):
  root, out = root_and_json(argv, 'runs/graph_suite', 'benchmarks/results/graph_distance.json')
  rows = []
  for kind in KINDS:
    for relational in (True, False):
      path = os.path.join(root, f'{kind}_relational_{str(relational).lower()}', 'sweep.json')
      if not os.path.isfile(path):
        print(f'missing: {path}', file=sys.stderr)
        continue
      with open(path) as f:
        sweep = json.load(f)
      folder = os.path.join(os.path.dirname(path), sweep['chosen']['name'])
      finals = []
      for seed_dir in sorted(glob.glob(os.path.join(folder, 'seed_*'))):
        with open(os.path.join(seed_dir, 'final_metrics.json')) as f:
          finals.append(json.load(f))
      row = {'kind': kind, 'relational': relational, 'command': sweep['command'], 'seeds': len(finals)}
      for split, metric in (('test', 'accuracy'), ('test', 'sequence_accuracy'), ('validation', 'loss'),
                            ('train', 'loss')):
        row[f'{split}/{metric}'] = stat([r[split][metric] for r in finals])
      rows.append(row)
  print('| kind | edges | test token accuracy (%) | test graph accuracy (%) | train loss |')
  print('|---|---|---:|---:|---:|')
  for r in rows:
    print(f"| {r['kind']} | {'yes' if r['relational'] else 'no'} | {cell(r['test/accuracy'], 100, 2)} | "
          f"{cell(r['test/sequence_accuracy'], 100, 2)} | {cell(r['train/loss'], 1, 2)} |")
  result_files.write(out, {'suite': 'bash benchmarks/suites/graph_suite.sh runs/graph_suite', 'rows': rows})
  print(f'wrote {out}')


if __name__ == '__main__':
  main(sys.argv)
