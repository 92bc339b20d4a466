"""What benchmarks/analysis/collect.py and the suites share: how a mean ± interval is printed, and the record
of one finished run's validation accuracy."""

import json
import os

from symjax.model import ModelConfig
from symjax.system.errors import InputError
from symjax.tasks import rasp
from symjax.train import config as config_lib
from symjax.train import sweep

RASP = rasp.TASKS
# Test token accuracy (%) of Transformer Programs, "Learning Transformer Programs" Table 1.
TRANSFORMER_PROGRAMS = rasp.PUBLISHED


def cell(stat: dict | None, scale: float = 1.0, digits: int = 4) -> str:
  """``mean ± ci95`` of a ``symjax.train.sweep.stat`` record, times ``scale``; 'not run' for None."""
  if stat is None:
    return 'not run'
  return f"{scale * stat['mean']:.{digits}f} ± {scale * stat['ci95']:.{digits}f}"


# A run from before a field existed trained with its default.
DEFAULTS = ModelConfig.defaults()
CONFIG_DEFAULTS = config_lib.default_config().to_dict()


def setting(config: dict, name: str):
  """A model field of a run's config (its default for a run from before the field existed), else a field
  of the config itself."""
  if name in config['model'] or name in DEFAULTS:
    return config['model'].get(name, DEFAULTS.get(name))
  if name in config:
    return config[name]
  if name in CONFIG_DEFAULTS:
    return CONFIG_DEFAULTS[name]
  raise InputError(f'{name!r} is neither a config.model field nor a config field')


def run_record(path: str, fields: list[str]) -> dict:
  config_path, metrics_path = os.path.join(path, 'config.json'), os.path.join(path, 'metrics.jsonl')
  for p in (config_path, metrics_path):
    if not os.path.isfile(p):
      raise InputError(f'{path} is not a finished training run: {os.path.basename(p)} is missing')
  with open(config_path) as f:
    config = json.load(f)
  by_step = {}
  with open(metrics_path) as f:
    for line in f:
      row = json.loads(line)
      if row.get('split') == 'validation':
        by_step[str(row['step'])] = 100 * row['accuracy']
  if not by_step:
    raise InputError(f'{path} has no validation evaluation in metrics.jsonl')
  record = {'run': os.path.basename(os.path.normpath(path)), 'task': config['task'], 'seed': config['seed'],
            'setting': {name: setting(config, name) for name in fields},
            'steps': config['total_steps'], 'validation_accuracy_by_step': by_step,
            'best_validation_accuracy': max(by_step.values())}
  # A Transformer Program decompiled into the run's program/ folder: its size, which a recipe may be chosen
  # on (only the line count is read; the accuracies in that file are the test split's).
  measured = os.path.join(path, 'program', 'measured.json')
  if os.path.isfile(measured):
    with open(measured) as f:
      record['program_lines'] = json.load(f)['lines']
  return record


def initialisations(seed: int, restarts: int) -> list[int]:
  """The training seeds behind seed ``seed`` of a recipe that trains ``restarts`` initialisations per seed and
  keeps the one best on validation (``chosen_on_validation``): seed·R … seed·R + R − 1, disjoint across seeds,
  and ``[seed]`` itself for one."""
  if restarts < 1 or seed < 0:
    raise ValueError(f'restarts must be >= 1 and seed >= 0, got {restarts} and {seed}')
  return list(range(seed * restarts, (seed + 1) * restarts))


def at_lengths(accuracy_by_length: dict, positions_by_length: dict) -> float | None:
  """One draw's accuracy (%) by sequence length weighed by another draw's tagged positions at each length: what
  the first would read with the second's mix of lengths. None where the second has a length the first lacks,
  or no positions."""
  total = sum(positions_by_length.values())
  if not total or not set(positions_by_length) <= set(accuracy_by_length):
    return None
  return sum(accuracy_by_length[n] * count for n, count in positions_by_length.items()) / total


def restarted(runs: list[dict], restarts: int) -> dict | None:
  """Runs read as a recipe that keeps the best of ``restarts`` initialisations per seed
  (``initialisations``): per seed, the initialisation kept and its best validation accuracy, beside that
  of each seed's first initialisation alone (the recipe without restarts). Seeds missing an initialisation
  are left out; None where no seed is whole."""
  by_seed = {r['seed']: r['best_validation_accuracy'] for r in runs}
  kept, first, seeds = [], [], []
  for seed in range(max(by_seed) // restarts + 1):
    inits = initialisations(seed, restarts)
    if all(i in by_seed for i in inits):
      best = max(inits, key=lambda i: (by_seed[i], -i))  # the first on a tie, as chosen_on_validation
      seeds.append({'seed': seed, 'initialisations': inits, 'kept': best})
      kept.append(by_seed[best])
      first.append(by_seed[inits[0]])
  if not seeds:
    return None
  return {'restarts': restarts, 'restarted_seeds': seeds, 'best_values': kept, 'best_of_restarts': sweep.stat(kept),
          'first_initialisation': sweep.stat(first)}


def chosen_on_validation(per_seed: dict) -> tuple[str, dict] | None:
  """The seed whose run is best on validation (the lowest such seed on a tie) and its record: how
  "Learning Transformer Programs" choose the one program they report (of 5 seeds, Appendix B)."""
  if not all('validation_accuracy' in r for r in per_seed.values()):
    return None
  seed = max(sorted(per_seed, key=int), key=lambda s: per_seed[s]['validation_accuracy'])
  return seed, per_seed[seed]
