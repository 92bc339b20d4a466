"""The dual-stream family at CPU scale, from the sweeps of ``bash benchmarks/suites/grid.sh dual_stream ROOT``:
Tiny Shakespeare at the medium text recipe, every variant with the same budget and the same learning-rate
grid, 3 seeds each, the learning rate chosen on validation loss.

  python -m benchmarks.analysis.dual_stream ROOT [--json=benchmarks/results/dual_stream_text_cpu.json]

It writes, per variant, the chosen point's validation and test loss per seed, and three comparisons, each
per seed (seed s of one variant against seed s of the other: the same data order) with the mean and a 95%
t-interval over seeds:

- head mixing: validation loss of independent and Kronecker over dense, beside "The Dual-Stream
  Transformer"'s +8% and +2.5% at 29M parameters;
- streams: CASCADE and single over token-factored;
- per-layer supervision: the validation loss with and without it, and the head-ablation effects — the rise of
  validation loss when one head's output is zeroed (``attn.z``), over every head — their mean |effect| and
  largest effect, with PLS over without, beside the papers' 5–23×.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from benchmarks.lib import results
from symjax.train.sweep import interval

MIXING = {'dense': 'dns-dns_T', 'independent': 'ind-dns_T', 'kronecker': 'kron-dns_T'}
STREAMS = {'token_factored': 'kron-dns_T', 'cascade': 'kron-dns_C', 'single': 'kron-dns_S'}
PLS = {'without': 'kron-dns_T', 'with': 'kron-dns_T_pls'}
VARIANTS = sorted(set(MIXING.values()) | set(STREAMS.values()) | set(PLS.values()))
PAPERS = {'independent': 0.08, 'kronecker': 0.025, 'pls_ablation_ratio': [5, 23]}


def stat(values) -> dict:
  mean, half = interval(values)
  return {'mean': mean, 'ci95': half, 'values': [float(v) for v in values]}


def chosen(root: str, variant: str) -> dict:
  """The sweep's chosen point: its name, and the validation and test loss per seed."""
  sweep = json.load(open(os.path.join(root, 'text', variant, 'sweep.json')))
  name = sweep['chosen']['name']
  row = next(r for r in sweep['rows'] if r['name'] == name)
  return {'point': name, 'seeds': row['seeds'], 'validation_loss': row['validation/loss']['values'],
          'grid': {r['name']: r['validation/loss']['mean'] for r in sweep['rows']},
          'test_loss': sweep['chosen']['test/loss']['values'],
          'folder': os.path.join(root, 'text', variant, name)}


def ratio(a: dict, b: dict) -> dict:
  """a's validation loss over b's, seed by seed."""
  return stat(np.asarray(a['validation_loss']) / np.asarray(b['validation_loss']))


def parameters(folder: str) -> int:
  """The parameter count of a sweep point's model."""
  import symjax
  from symjax.model import count_params
  return count_params(symjax.load(os.path.join(folder, 'seed_0')).model_config)


def head_effects(folder: str, seed: int) -> np.ndarray:
  """``[layers, heads]``: validation loss with head h of block l zeroed, minus without."""
  import symjax
  from symjax import interpret
  run = symjax.load(os.path.join(folder, f'seed_{seed}'))
  cfg = run.model_config
  base = run.evaluate('validation')['loss']
  out = np.zeros((cfg.num_layers, cfg.num_heads))
  for l in range(cfg.num_layers):
    for h in range(cfg.num_heads):
      out[l, h] = run.evaluate('validation', hooks={f'blocks.{l}.attn.z': interpret.zero_head(h)})['loss'] - base
  return out


def main(argv: list[str]) -> int:
  if len(argv) < 2 or argv[1] in ('-h', '--help', '--helpfull'):
    print(__doc__)
    return 0 if len(argv) > 1 else 2
  root = argv[1]
  out_path = next((a.split('=', 1)[1] for a in argv[2:] if a.startswith('--json=')),
                  'benchmarks/results/dual_stream_text_cpu.json')
  runs = {v: chosen(root, v) for v in VARIANTS}
  record: dict = {'what': __doc__.split('\n\n')[0].replace('\n', ' '),
                  'suite_command': f'bash benchmarks/suites/grid.sh dual_stream {root}',
                  'variants': {v: {'point': r['point'], 'grid_validation_loss': r['grid'],
                                   'parameters': parameters(r['folder']),
                                   'validation_loss': stat(r['validation_loss']),
                                   'test_loss': stat(r['test_loss'])} for v, r in runs.items()}}
  record['mixing_over_dense'] = {m: {'variant': v, 'validation_loss_ratio': ratio(runs[v], runs[MIXING['dense']]),
                                     'papers_29M': 1 + PAPERS[m]} for m, v in MIXING.items() if m != 'dense'}
  record['streams_over_token_factored'] = {
      s: {'variant': v, 'validation_loss_ratio': ratio(runs[v], runs[STREAMS['token_factored']])}
      for s, v in STREAMS.items() if s != 'token_factored'}
  effects = {k: [head_effects(runs[v]['folder'], s) for s in runs[v]['seeds']] for k, v in PLS.items()}
  mean_abs = {k: np.asarray([np.abs(e).mean() for e in es]) for k, es in effects.items()}
  largest = {k: np.asarray([e.max() for e in es]) for k, es in effects.items()}
  record['pls'] = {
      'validation_loss_ratio_with_over_without': ratio(runs[PLS['with']], runs[PLS['without']]),
      'head_ablation': {k: {'mean_abs_effect': stat(mean_abs[k]), 'largest_effect': stat(largest[k]),
                            'effects_per_seed': [e.round(5).tolist() for e in effects[k]]} for k in PLS},
      'mean_abs_effect_ratio_with_over_without': stat(mean_abs['with'] / mean_abs['without']),
      'largest_effect_ratio_with_over_without': stat(largest['with'] / largest['without']),
      'papers': f'{PAPERS["pls_ablation_ratio"][0]}-{PAPERS["pls_ablation_ratio"][1]}x larger than matched controls'}
  results.write(out_path, record)
  print(json.dumps({k: v for k, v in record.items() if k != 'variants'}, indent=1)[:4000])
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
