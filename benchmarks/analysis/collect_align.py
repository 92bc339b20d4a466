"""Collects ``benchmarks/suites/align_suite.sh`` into one table and JSON.

  python -m benchmarks.analysis.collect_align [ROOT=runs/align_suite] [--json=benchmarks/results/alignment.json]

Per task, kind and alignment on/off, on the test split: precision@k of the module's activations (eq. 10),
of its weights (eq. 9), of the backbone's attention (mean over layers and heads), the module's accuracy and
the frozen backbone's; mean ± 95% interval over the 3 seeds, per-seed values.
"""

import glob
import json
import os
import sys

from benchmarks.lib import results as result_files
from benchmarks.lib.collect import cell, root_and_json
from symjax.train.sweep import stat

KINDS = ('standard', 'token_factored', 'symbolic')
ALIGNMENT = {'false': 'none (CE only)', 'true': 'CE + MSE + MSE', 'weighted': '0.1 CE + MSE + MSE'}
METRICS = ('precision_activations', 'precision_weights', 'precision_attention', 'module_accuracy',
           'backbone_accuracy')


def main(argv):
  root, out = root_and_json(argv, 'runs/align_suite', 'benchmarks/results/alignment.json')
  rows = []
  for task in ('induction', 'reverse'):
    for kind in KINDS:
      for aligned in ('false', 'true', 'weighted'):
        files = sorted(glob.glob(os.path.join(root, task, kind, f'align_{aligned}', 'seed_*',
                                              'alignment.json')))
        if not files:
          print(f'missing: {task} {kind} align={aligned}', file=sys.stderr)
          continue
        results = [json.load(open(f)) for f in files]
        row = {'task': task, 'kind': kind, 'aligned': aligned, 'seeds': len(results),
               'config': results[0]['config']}
        for m in METRICS:
          row[m] = stat([r['test'][m] for r in results])
        row['precision_blocks'] = [stat(v) for v in zip(*[r['test']['precision_blocks'] for r in results])]
        rows.append(row)
  fmt = lambda d: cell(d, 100, 1)
  print('| task | kind | alignment | P@k activations | P@k weights | P@k blocks | P@k attention | module acc. | backbone acc. |')  # noqa: E501
  print('|---|---|---|---:|---:|---:|---:|---:|---:|')
  for r in rows:
    blocks = ' / '.join(f"{100 * b['mean']:.0f}" for b in r['precision_blocks'])
    print(f"| {r['task']} | {r['kind']} | {ALIGNMENT[r['aligned']]} | {fmt(r['precision_activations'])} | "
          f"{fmt(r['precision_weights'])} | {blocks} | {fmt(r['precision_attention'])} | {fmt(r['module_accuracy'])} | "
          f"{fmt(r['backbone_accuracy'])} |")
  result_files.write(out, {'suite': 'bash benchmarks/suites/align_suite.sh runs/align_suite', 'rows': rows})
  print(f'wrote {out}')


if __name__ == '__main__':
  main(sys.argv)
