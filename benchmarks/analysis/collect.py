"""Gathers each finished suite into one table and one JSON file (the test split is read by the suites
themselves, once, for the point chosen on validation data).

  python -m benchmarks.analysis.collect STUDY [ARGS...] [--json=PATH] [flags]

STUDY, its arguments and the default JSON it writes:
- ``sweeps ROOT [--kinds=...] [--device=...]``: ``bash benchmarks/suites/grid.sh sweep|variants ROOT``'s
  sweeps, ROOT/<task>/<kind>/sweep.json each. For each: the chosen grid point (by validation loss), its
  validation loss and test metrics as mean ± 95% interval over seeds, with per-seed values; text and FOL
  report loss (and FOL perplexity), RASP tasks token accuracy next to the Transformer Programs figure
  ("Learning Transformer Programs", Table 1), and the ALiBi extrapolation to lengths 12 and 16.
  Writes suite.json.
- ``combine COLLECTED.json [COLLECTED.json ...] [--kinds=...] [--suffixes=...]``: per (task, kind), the best
  of several collected sweeps on validation loss: the candidates of kind K are the sweeps named
  ``<task>/K<suffix>`` for each of ``--suffixes``, so every kind is tuned over the union of its grids.
  Writes benchmarks/results/suite_tied_untied_h100.json.
- ``validation RUN_DIR [RUN_DIR ...] --json=PATH [--what=...] [--command=...] [--fields=...] [--restarts=R]``:
  the validation accuracy of finished training runs at every evaluation and the best, then per task and
  setting the mean and 95% interval of the best over seeds, for choosing a recipe on validation data only;
  with R, also over seeds each keeping the best of R initialisations, beside each seed's first alone.
- ``align [ROOT=runs/align_suite]``: ``grid.sh align``: per task, kind and alignment on/off, precision@k of
  the module's activations (eq. 10), of its weights (eq. 9), of the backbone's attention, the module's
  accuracy and the frozen backbone's. Writes benchmarks/results/alignment.json.
- ``distill [ROOT=runs/distill_suite]``: ``grid.sh distill``: per task, student kind and mode (scratch /
  distilled), test accuracy and loss, the teacher's, and the last logged distances to the teacher.
  Writes benchmarks/results/distillation.json.
- ``graph [ROOT=runs/graph_suite]``: ``grid.sh graph``: per kind with and without edges, test token and
  graph accuracy and validation loss. Writes benchmarks/results/graph_distance.json.
"""

from __future__ import annotations

import collections
import glob
import json
import math
import os
import sys

from absl import app, flags

from benchmarks.lib import cli
from benchmarks.lib import results as result_files
from benchmarks.lib.collect import RASP, TRANSFORMER_PROGRAMS, cell, restarted, run_record
from symjax.train import sweep
from symjax.train.sweep import stat

KINDS = ['standard', 'token_factored', 'symbolic']
_JSON = cli.json_output(None, 'Where to write the results (default: the study\'s own, above).')
_KINDS = cli.kinds(KINDS, 'sweeps, combine: the <kind> folders or names to gather.')
_DEVICE = flags.DEFINE_string('device', '', 'sweeps: the device the sweeps ran on, recorded in the JSON.')
_SUFFIXES = flags.DEFINE_list('suffixes', ['', '_untied'],
                              'combine: sweep-name suffixes that are candidates of a kind ("" is the kind itself).')
_WHAT = flags.DEFINE_string('what', '', 'validation: what the runs compare (written to the JSON).')
_COMMAND = flags.DEFINE_string('command', '', 'validation: the training command of the runs, RUN for the folder.')
_RESTARTS = flags.DEFINE_integer('restarts', 1, 'validation: read the runs as a recipe keeping the best of this '
                                  'many initialisations per seed (training seeds seed·R … seed·R + R − 1).',
                                  lower_bound=1)
_FIELDS = flags.DEFINE_list('fields', ['gumbel_scale', 'gumbel_scale_end', 'numerical_heads'],
                            'validation: config.model fields that tell the settings apart (or, not a model '
                            'field, a field of the config itself: learning_rate, weight_decay, eval_every_steps).')


def one_root(argv: list[str], default: str) -> str:
  if len(argv) > 1:
    raise app.UsageError(f'give one ROOT (default {default}), got {argv}')
  return argv[0] if argv else default


ALIGNMENT = {'false': 'none (CE only)', 'true': 'CE + MSE + MSE', 'weighted': '0.1 CE + MSE + MSE'}
ALIGN_METRICS = ('precision_activations', 'precision_weights', 'precision_attention', 'module_accuracy',
                 'backbone_accuracy')


def collect_align(argv: list[str], out: str | None):
  root, out = one_root(argv, 'runs/align_suite'), out or 'benchmarks/results/alignment.json'
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
        for m in ALIGN_METRICS:
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
  result_files.write(out, {'suite': 'bash benchmarks/suites/grid.sh align runs/align_suite', 'rows': rows})
  print(f'wrote {out}')



def last_train_record(seed_dir: str) -> dict:
  with open(os.path.join(seed_dir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f if '"train"' in line]
  return rows[-1] if rows else {}


def collect_distill(argv: list[str], out: str | None):
  root, out = one_root(argv, 'runs/distill_suite'), out or 'benchmarks/results/distillation.json'
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
  result_files.write(out, {'command': 'bash benchmarks/suites/grid.sh distill runs/distill_suite',
                           'teachers': teachers, 'rows': rows})



def collect_graph(argv: list[str], out: str | None):
  root, out = one_root(argv, 'runs/graph_suite'), out or 'benchmarks/results/graph_distance.json'
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
  result_files.write(out, {'suite': 'bash benchmarks/suites/grid.sh graph runs/graph_suite', 'rows': rows})
  print(f'wrote {out}')



def collect_sweeps(argv: list[str], out: str | None):
  if len(argv) != 1:
    raise app.UsageError('usage: collect sweeps ROOT')
  root, out = argv[0], out or 'suite.json'
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

  suite = 'sweep' if kinds == _KINDS.default else 'variants'
  result_files.write(out, {'device': _DEVICE.value, 'command': f'bash benchmarks/suites/grid.sh {suite} {root}',
                           'collected_with': 'python -m benchmarks.analysis.collect ' + ' '.join(sys.argv[1:]),
                           'sweeps': results})
  print(f'wrote {out}')



def collect_validation(argv: list[str], out: str | None):
  if not out:
    raise app.UsageError('validation needs --json=PATH')
  runs = [run_record(path, _FIELDS.value) for path in argv]
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
    lines = [r['program_lines'] for r in rs if 'program_lines' in r]
    if lines:
      summary[-1]['program_lines'] = lines
    print(f"| {task} | {setting} | {len(rs)} | {', '.join(f'{b:.3f}' for b in best)} | "
          f"{s['mean']:.3f} ± {s['ci95']:.3f} |" + (f" lines {', '.join(map(str, lines))}" if lines else ''))
    if _RESTARTS.value > 1:
      kept = restarted(rs, _RESTARTS.value)
      if kept is None:
        raise app.UsageError(f'--restarts={_RESTARTS.value}: no seed of {task} {setting} has all its '
                             'initialisations among these runs')
      summary[-1].update(kept)
      print(f"|  | best of {kept['restarts']} per seed | {len(kept['restarted_seeds'])} | "
            f"{', '.join(f'{v:.3f}' for v in kept['best_values'])} | "
            f"{kept['best_of_restarts']['mean']:.3f} ± {kept['best_of_restarts']['ci95']:.3f} |")
  result_files.write(out, {'command': _COMMAND.value, 'what': _WHAT.value, 'summary': summary,
                                   'runs': runs})



def chosen_validation(entry: dict) -> dict:
  chosen = entry['chosen']['name']
  return next(r for r in entry['rows'] if r['name'] == chosen)['validation/loss']


def combine_sweeps(argv: list[str], out: str | None):
  if not argv:
    raise app.UsageError('usage: collect combine COLLECTED.json [COLLECTED.json ...]')
  out = out or 'benchmarks/results/suite_tied_untied_h100.json'
  sweeps, sources = {}, {}
  for path in argv:
    with open(path) as f:
      for key, entry in json.load(f)['sweeps'].items():
        sweeps[key], sources[key] = entry, path
  tasks = sorted({key.split('/')[0] for key in sweeps})
  chosen = {}
  for task in tasks:
    for kind in _KINDS.value:
      keys = [f'{task}/{kind}{s}' for s in _SUFFIXES.value if f'{task}/{kind}{s}' in sweeps]
      if not keys:
        continue
      best = min(keys, key=lambda k: chosen_validation(sweeps[k])['mean'])
      chosen[f'{task}/{kind}'] = {
          'chosen_sweep': best, 'source': sources[best], 'chosen': sweeps[best]['chosen'],
          'validation/loss': chosen_validation(sweeps[best]), 'command': sweeps[best].get('command'),
          'candidates': {k: {'point': sweeps[k]['chosen']['name'], 'validation/loss': chosen_validation(sweeps[k])}
                         for k in keys}}

  print('| task | kind | chosen sweep | chosen point | validation loss | test loss | test accuracy |')
  print('|---|---|---|---|---:|---:|---:|')
  for task in ('text', 'fol'):
    for kind in _KINDS.value:
      c = chosen.get(f'{task}/{kind}')
      if c:
        print(f"| {task} | {kind} | {c['chosen_sweep']} | {c['chosen']['name']} | {cell(c['validation/loss'])} | "
              f"{cell(c['chosen']['test/loss'])} | {cell(c['chosen']['test/accuracy'])} |")
  for kind in _KINDS.value:
    c = chosen.get(f'fol/{kind}')
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
      c = chosen.get(f'{task}/{kind}')
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

  with open(out, 'w') as f:
    json.dump({'inputs': argv, 'kinds': _KINDS.value, 'suffixes': _SUFFIXES.value,
               'combined_with': 'python -m benchmarks.analysis.collect ' + ' '.join(sys.argv[1:]), 'chosen': chosen},
              f, indent=1)
  print(f'wrote {out}')



STUDIES = {'sweeps': collect_sweeps, 'combine': combine_sweeps, 'validation': collect_validation,
           'align': collect_align, 'distill': collect_distill, 'graph': collect_graph}


def main(argv):
  if len(argv) < 2 or argv[1] not in STUDIES:
    raise app.UsageError(f'usage: python -m benchmarks.analysis.collect STUDY [ARGS...]; STUDY is one of '
                         f'{list(STUDIES)}')
  STUDIES[argv[1]](argv[2:], _JSON.value)


if __name__ == '__main__':
  app.run(main)
