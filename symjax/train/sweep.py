"""Seeds and grids: every grid point × seed of a config, each in its own resumable work directory.

  python -m symjax.cli.sweep --config=configs/symbolic.py:task=text,size=medium --config.text_path=input.txt \\
      --seeds=3 --grid learning_rate=3e-3,1e-2 --grid model.tau_init=0.5,1 --workdir=runs/sweep

trains seeds 0..N-1 of every combination of the ``--grid`` values (the seeds of one grid point together, in
one vmapped step: ``symjax.train.seeds``) in ``DIR/<field=value,...>/seed_<s>``; rerunning skips what finished and
resumes the rest. It then writes ``DIR/sweep.md`` and ``DIR/sweep.json``: for every grid point the mean,
the 95% interval of the mean (Student's t over seeds) and the per-seed values of the validation metrics;
the grid point with the best mean validation ``--select`` metric is chosen, and only its test metrics are
reported — the test split is read for the chosen configuration alone.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
from typing import Any, Sequence

import ml_collections
import numpy as np

from symjax.system import files
from symjax.system.errors import InputError
from symjax.train import config as config_lib
from symjax.train import seeds as seeds_lib

SELECT = {'loss': min, 'accuracy': max, 'perplexity': min, 'sequence_accuracy': max}
REPORTED = ('loss', 'accuracy')


def parse_grid(config: ml_collections.ConfigDict, specs: Sequence[str]) -> list[tuple[str, list[Any]]]:
  """``['field=v1,v2', 'model.field=v']`` -> ``[(field, [values...]), ...]``, each value of the field's type.

  Raises ValueError naming the field and what is allowed when a field does not exist or a value does not
  parse.
  """
  grid = []
  for spec in specs:
    if '=' not in spec:
      raise InputError(f'--grid {spec!r} is not field=value1,value2,...')
    field, values = spec.split('=', 1)
    parent, _, name = field.rpartition('.')
    node = config
    for part in parent.split('.') if parent else ():
      node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
    if not isinstance(node, ml_collections.ConfigDict) or name not in node:
      known = sorted(k for k in (node.keys() if isinstance(node, ml_collections.ConfigDict) else config.keys()))
      raise InputError(f'--grid field {field!r} is not a config field; fields{" of " + parent if parent else ""}: '
                       f'{", ".join(known)}')
    if isinstance(node[name], ml_collections.ConfigDict):
      raise InputError(f'--grid field {field!r} is a group of fields; name one of its fields')
    if not values or any(not v for v in values.split(',')):
      raise InputError(f'--grid {field}: empty value in {values!r}; give field=value1,value2,...')
    grid.append((field, [_parse_value(field, node[name], v) for v in values.split(',')]))
  fields = [f for f, _ in grid]
  if len(set(fields)) != len(fields):
    raise InputError(f'--grid names a field twice: {fields}')
  return grid


def _parse_value(field: str, current: Any, text: str) -> Any:
  kind = type(current)
  if kind is bool:
    if text.lower() not in ('true', 'false', '1', '0'):
      raise InputError(f'--grid {field}: {text!r} is not a boolean (true or false)')
    return text.lower() in ('true', '1')
  if kind in (int, float):
    try:
      value = float(text)
    except ValueError:
      raise InputError(f'--grid {field}: {text!r} is not a number ({kind.__name__})') from None
    if kind is int:
      if value != int(value):
        raise InputError(f'--grid {field}: {text!r} is not an integer')
      return int(value)
    return value
  if kind is str:
    return text
  if kind is tuple or current is None:
    try:
      return tuple(int(x) for x in text.split(':')) if text else ()
    except ValueError:
      raise InputError(f'--grid {field}: {text!r} is not a tuple of integers separated by ":"') from None
  raise InputError(f'--grid {field}: fields of type {kind.__name__} cannot be swept')


def point_name(point: dict[str, Any]) -> str:
  """The folder of a grid point: ``field=value,...`` (``base`` when the grid is empty)."""
  fmt = lambda v: ':'.join(map(str, v)) if isinstance(v, tuple) else str(v)
  return ','.join(f'{k}={fmt(v)}' for k, v in point.items()) or 'base'


def apply(config: ml_collections.ConfigDict, point: dict[str, Any]) -> ml_collections.ConfigDict:
  """``config`` with the grid point's values, as ``--config.<field>=<value>`` would set them: fields that
  follow another by reference (text's ``model.max_len``, four times ``seq_len``) follow it here too."""
  config = copy.deepcopy(config)
  for field, value in point.items():
    parent, _, name = field.rpartition('.')
    node = config
    for part in parent.split('.') if parent else ():
      node = node[part]
    node[name] = value
  return config


def interval(values: Sequence[float]) -> tuple[float, float]:
  """Mean and the half-width of its 95% confidence interval (Student's t; 0 for one value)."""
  from scipy import stats
  x = np.asarray(values, np.float64)
  if len(x) < 2:
    return float(x.mean()), 0.0
  return float(x.mean()), float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def stat(values: Sequence[float]) -> dict[str, Any]:
  """{'mean', 'ci95' (half-width, ``interval``), 'values'}: how every table reports a metric over seeds
  (NaN for no values)."""
  values = list(values)
  mean, half = interval(values) if values else (math.nan, math.nan)
  return {'mean': mean, 'ci95': half, 'values': values}


def summarize(points: list[dict[str, Any]], finals: list[list[dict]], seed_list: Sequence[int],
              select: str) -> dict[str, Any]:
  """Per grid point: mean, 95% half-width and per-seed values of validation metrics; the chosen point."""
  rows = []
  for point, runs in zip(points, finals):
    ok = [r for r in runs if 'diverged' not in r]
    row = {'point': point, 'name': point_name(point), 'seeds': list(seed_list),
           'diverged': [s for s, r in zip(seed_list, runs) if 'diverged' in r]}
    for metric in dict.fromkeys((*REPORTED, select)):
      row[f'validation/{metric}'] = stat([r['validation'][metric] for r in ok])
    rows.append(row)
  better = SELECT[select]
  candidates = [i for i, r in enumerate(rows) if not r['diverged']]
  chosen = better(candidates, key=lambda i: rows[i][f'validation/{select}']['mean']) if candidates else None
  out = {'select': f'validation/{select}', 'rows': rows, 'chosen': None}
  if chosen is not None:
    runs = finals[chosen]
    test = {}
    for metric in dict.fromkeys((*REPORTED, select)):
      test[f'test/{metric}'] = stat([r['test'][metric] for r in runs])
    train_loss = [r['train']['loss'] for r in runs if 'train' in r]
    if train_loss:
      test['train/loss'] = stat(train_loss)
    out['chosen'] = {'name': rows[chosen]['name'], 'point': rows[chosen]['point'], **test}
  return out


def markdown(summary: dict[str, Any], command: str) -> str:
  fmt = lambda d: f"{d['mean']:.4f} ± {d['ci95']:.4f}" if not math.isnan(d['mean']) else 'diverged'
  metrics = [k for k in summary['rows'][0] if k.startswith('validation/')]
  lines = [f'`{command}`', '', '| grid point | ' + ' | '.join(metrics) + ' | per-seed ' + summary['select'] + ' |',
           '|---|' + '---:|' * (len(metrics) + 1)]
  for r in summary['rows']:
    seeds = ', '.join(f'{v:.4f}' for v in r[summary['select']]['values'])
    if r['diverged']:
      seeds += f' (seeds {r["diverged"]} diverged)'
    lines.append(f"| {r['name']} | " + ' | '.join(fmt(r[m]) for m in metrics) + f' | {seeds} |')
  c = summary['chosen']
  if c:
    lines += ['', f"Chosen by mean {summary['select']}: **{c['name']}**. Its test metrics (mean ± 95% interval "
              f"over seeds):", '']
    for k, v in c.items():
      if isinstance(v, dict) and 'mean' in v:
        lines.append(f"- {k}: {fmt(v)} (seeds: {', '.join(f'{x:.4f}' for x in v['values'])})")
  return '\n'.join(lines) + '\n'


def run(config: ml_collections.ConfigDict, grid_specs: Sequence[str], num_seeds: int, workdir: str,
        select: str = 'loss', command: str = '', seed_step: str = 'auto') -> dict[str, Any]:
  """Trains every grid point × seed (resuming, skipping what finished) and writes sweep.md / sweep.json."""
  if num_seeds < 1:
    raise InputError(f'--seeds must be >= 1, got {num_seeds}')
  if select not in SELECT:
    raise InputError(f'--select must be one of {sorted(SELECT)}, got {select!r}')
  if seed_step not in seeds_lib.SEED_STEPS:
    raise InputError(f'--seed_step must be one of {list(seeds_lib.SEED_STEPS)}, got {seed_step!r}')
  grid = parse_grid(config, grid_specs)
  points = [dict(zip([f for f, _ in grid], values)) for values in itertools.product(*[v for _, v in grid])]
  configs = [apply(config, p) for p in points]
  for p, c in zip(points, configs):  # every point is checked before anything trains
    try:
      config_lib.validate(c)
      seeds_lib.check_config(c)
    except ValueError as e:
      raise InputError(f'grid point {point_name(p)}: {e}') from None
  seed_list = list(range(num_seeds))
  finals = []
  for i, (p, c) in enumerate(zip(points, configs)):
    folders = [os.path.join(workdir, point_name(p), f'seed_{s}') for s in seed_list]
    print(f'[{i + 1}/{len(points)}] {point_name(p)}', flush=True)
    finals.append(seeds_lib.train_seeds(c, seed_list, folders, seed_step=seed_step))
  summary = summarize(points, finals, seed_list, select)
  summary['command'] = command
  files.write_atomically(os.path.join(workdir, 'sweep.json'), json.dumps(summary, indent=1))
  text = markdown(summary, command)
  files.write_atomically(os.path.join(workdir, 'sweep.md'), text)
  print(text)
  return summary
