"""Diagnosis of trained runs: fit (train vs validation vs test), mixture entropy, τ, slopes, gradient norms.

  python -m benchmarks.analysis.symbolic_diagnosis --runs=runs/text_symbolic/learning_rate=0.01 \\
      [--runs=runs/text_token_factored/learning_rate=0.01 ...] [--json=benchmarks/results/diagnosis.json]

Each ``--runs`` folder is a sweep grid point (its ``seed_*`` folders) or a single work directory. For every
seed it reads ``final_metrics.json`` (train loss on a fixed sample of training batches, validation and
test loss: the gap says under- or over-fitting), and the final parameters: for symbolic layers the entropy
of every vocabulary-projection mixture α (values and FFN, per layer and head, mean over 4 validation
batches, as a fraction of log |V|: 0 is one token, 1 is uniform) and the learned τ per head; ALiBi slopes;
with ``--over_training`` the same entropies and τ at every kept checkpoint;
and from ``metrics.jsonl`` the gradient norm of every module at the start, middle and end of training.
Prints a table and writes JSON.
"""

import glob
import json
import math
import os
import shlex
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import symjax
from benchmarks.lib import cli
from benchmarks.lib import results as result_files
from symjax import tasks
from symjax.model import intermediates as names
from symjax.run import workdir as rundir

_RUNS = flags.DEFINE_multi_string('runs', [], 'Sweep grid-point folders or work directories.')
_OVER_TRAINING = flags.DEFINE_bool('over_training', False, 'Also the mixture entropy and τ at every kept '
                                   'checkpoint (train with a large --config.keep_checkpoints to keep them all).')
_JSON = cli.json_output('benchmarks/results/symbolic_diagnosis.json')


def seed_dirs(path: str) -> list[str]:
  found = sorted(glob.glob(os.path.join(path, 'seed_*')))
  return found or [path]


def mixture_entropy(run, batches) -> dict[str, list[float]]:
  """Mean entropy of α over valid tokens, per site and head, as a fraction of log |V|."""
  sums: dict[str, np.ndarray] = {}
  count = 0.0
  log_v = math.log(run.model.config.vocab_size)
  for batch in batches:
    _, state = run.model.apply({'params': run.params}, batch['inputs'], batch['key_mask'],
                               mutable=['intermediates'])
    weights = jnp.asarray(batch['weights'])[..., None]                      # [batch, time, 1]
    for name, alpha in names.flat(state[names.COLLECTION]).items():
      if not name.endswith(('.v_mixture', '.ffn.mixture')):
        continue
      h = -(alpha * jnp.log(jnp.clip(alpha, 1e-30))).sum(-1) / log_v        # [batch, time, heads]
      sums[name] = sums.get(name, 0.0) + np.asarray((h * weights).sum((0, 1)))
    count += float(batch['weights'].sum())
  return {k: (v / count).round(4).tolist() for k, v in sorted(sums.items())}


def readable_share(run, batches) -> float:
  """Share of the last layer's state ‖X_t‖² + ‖X_e‖² held by the streams with an exact token reading (the
  streams whose site is vocabulary-projected in every layer: both for the paper's model, X_t for
  symbolic_sites='values', X_e for 'ffn'), mean over valid tokens. 1.0: everything reads as tokens."""
  cfg = run.model.config
  layers = range(cfg.num_layers)
  readable = {'x_t': all(cfg.projects(l, 'values') for l in layers), 'x_e': all(cfg.projects(l, 'ffn') for l in layers)}
  total = count = 0.0
  for batch in batches:
    _, state = run.model.apply({'params': run.params}, batch['inputs'], batch['key_mask'],
                               mutable=['intermediates'])
    sites = names.flat(state[names.COLLECTION])
    energy = {k: jnp.sum(sites[f'blocks.{cfg.num_layers - 1}.{k}'] ** 2, -1) for k in ('x_t', 'x_e')}  # [batch, time]
    share = sum(energy[k] for k in energy if readable[k]) / (energy['x_t'] + energy['x_e'])
    total += float((share * batch['weights']).sum())
    count += float(batch['weights'].sum())
  return total / count


def learned(params, leaf: str) -> dict[str, list[float]]:
  out = {}
  for path, value in jax.tree_util.tree_flatten_with_path(params)[0]:
    keys = [str(getattr(k, 'key', k)) for k in path]
    if keys[-1] == leaf:
      out['/'.join(keys[:-1])] = np.exp(np.asarray(value)).round(4).tolist()
  return out


def grad_trajectory(workdir: str) -> dict[str, list[float]]:
  """Gradient norm of every module at the first, middle and last logged training step."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    records = [r for r in map(json.loads, f) if r['split'] == 'train']
  if not records:
    return {}
  picks = [records[0], records[len(records) // 2], records[-1]]
  keys = sorted(k for k in records[-1] if k.startswith('grad_norm'))
  return {'steps': [r['step'] for r in picks], **{k: [round(r.get(k, math.nan), 4) for r in picks] for k in keys}}


def diagnose(workdir: str) -> dict:
  run = symjax.load(workdir)
  with open(os.path.join(workdir, 'final_metrics.json')) as f:
    final = json.load(f)
  out = {'workdir': workdir, 'kind': run.model.config.kind,
         'loss': {s: final[s]['loss'] for s in ('train', 'validation', 'test') if s in final},
         'tau': learned(run.params, 'log_tau'), 'slopes': learned(run.params, 'log_slope'),
         'grad_norm': grad_trajectory(workdir)}
  if run.model.config.kind == 'symbolic':
    task = tasks.get_task(run.config, workdir)
    batches = [b for _, b in zip(range(4), task.eval_batches('validation', 64, run.config.data_seed))]
    out['mixture_entropy'] = mixture_entropy(run, batches)
    out['readable_share'] = readable_share(run, batches)
    if _OVER_TRAINING.value:
      out['over_training'] = {}
      for step in rundir.checkpoint_steps(workdir):
        at = symjax.load(workdir, step)
        out['over_training'][step] = {'mixture_entropy': mixture_entropy(at, batches),
                                      'tau': learned(at.params, 'log_tau')}
    out['variant'] = {'symbolic_sites': run.model.config.symbolic_sites,
                      'projection_gain': run.model.config.projection_gain}
  return out


def main(_):
  results = {}
  for path in _RUNS.value:
    results[path] = [diagnose(w) for w in seed_dirs(path)]
  print('| run | kind | train loss | validation loss | test loss | gap (val - train) | exactly readable share |')
  print('|---|---|---:|---:|---:|---:|---:|')
  for path, seeds in results.items():
    mean = lambda s: np.mean([d['loss'].get(s, math.nan) for d in seeds])
    print(f"| {path} | {seeds[0]['kind']} | {mean('train'):.4f} | {mean('validation'):.4f} | {mean('test'):.4f} | "
          f"{mean('validation') - mean('train'):+.4f} | "
          f"{np.mean([d.get('readable_share', math.nan) for d in seeds]):.3f} |")
  for path, seeds in results.items():
    if 'mixture_entropy' in seeds[0]:
      print(f'\nMixture entropy / log|V| per head (mean of {len(seeds)} seeds), {path}:')
      for site in seeds[0]['mixture_entropy']:
        values = np.mean([d['mixture_entropy'][site] for d in seeds], 0)
        tau = np.mean([d['tau'].get(site.replace('/values', '/value_projection').replace('/ffn', '/ffn/projection'),
                                    [math.nan]) for d in seeds], 0)
        print(f'  {site:22s} entropy {np.array2string(values, precision=3)}  τ {np.array2string(tau, precision=3)}')
  for path, seeds in results.items():
    if 'over_training' in seeds[0]:
      print(f'\nMixture entropy / log|V| over training, mean over heads and {len(seeds)} seeds, {path}:')
      steps = list(seeds[0]['over_training'])
      print('  step ' + ' '.join(f'{s:>7}' for s in steps))
      for site in seeds[0]['over_training'][steps[-1]]['mixture_entropy']:
        row = [np.mean([np.mean(d['over_training'][s]['mixture_entropy'][site]) for d in seeds
                        if s in d['over_training']]) for s in steps]
        print(f'  {site:22s} ' + ' '.join(f'{v:7.3f}' for v in row))
  os.makedirs(os.path.dirname(_JSON.value) or '.', exist_ok=True)
  result_files.write(_JSON.value, {'command': 'python ' + ' '.join(shlex.quote(a) for a in sys.argv), 'runs': results})
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
