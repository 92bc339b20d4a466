"""How well attribution patching, AtP* and EAP-IG read a text model's head sweep: every (layer, position, head)
site's output patched from a corrupt prompt, exactly and as each method estimates it (``Edges.node_sweep``).

  python -m benchmarks.analysis.head_sweep --workdirs=/tmp/text_medium_seed0,... [--prompts=8] [--length=9]
      [--json=benchmarks/results/head_sweep_text.json]

Each run is the text recipe's 4-layer model (``--config=KIND:task=text,size=medium`` with
``--config.text_path`` Tiny Shakespeare, one per seed; all runs of one kind). Clean prompts: the first
``--prompts`` windows of ``--length`` characters of its test split; corrupt: the next ``--prompts`` windows.
Metric: the mean log-probability of the clean run's prediction after the last character. Per method: Pearson and
Spearman against the exact effects over every site (AtP* against their magnitudes, as it gives magnitudes), where it
ranks the two largest exact effects, and seconds (compiled, warm); per run, and the mean and 95% interval over
runs. For the two largest sites, the path f(α) − f(0) with the site moved α of the way to corrupt (α = 0, 0.1, ...,
1): attribution patching reads its slope at 0.
"""

from __future__ import annotations

import time

import numpy as np
from absl import app, flags

from benchmarks.lib import cli
from benchmarks.lib import results as result_files

_WORKDIRS = flags.DEFINE_list('workdirs', ['/tmp/text_medium_seed0', '/tmp/text_medium_seed1',
                                            '/tmp/text_medium_seed2'], 'The trained text runs, one per seed.')
_PROMPTS = flags.DEFINE_integer('prompts', 8, 'Prompt pairs.', lower_bound=1)
_LENGTH = flags.DEFINE_integer('length', 9, 'Characters a prompt.', lower_bound=2)
_STEPS = flags.DEFINE_integer('ig_steps', 16, "EAP-IG's steps.", lower_bound=1)
_JSON = cli.json_output('benchmarks/results/head_sweep_text.json', 'Output.')


def sweep(workdir: str) -> dict:
  """The sweep of one run: per method its agreement with the exact sweep, and the two largest exact effects."""
  from scipy import stats

  import symjax
  from symjax.interpret import edges
  run = symjax.load(workdir)
  n, length = _PROMPTS.value, _LENGTH.value
  text = run.batches('test', n=1, batch_size=2 * n)[0]['inputs']
  clean, corrupt = text[:n, :length], text[n:2 * n, :length]
  weights = np.zeros(clean.shape, np.float32)
  weights[:, -1] = 1.0
  e = edges.Edges(run.model, run.params, clean, corrupt, weights=weights)
  out, sweeps = {}, {}
  for method in edges.Edges.NODE_METHODS:
    e.node_sweep(method, steps=_STEPS.value)                       # compiles
    start = time.perf_counter()
    sweeps[method] = e.node_sweep(method, steps=_STEPS.value)
    out[method] = {'seconds': time.perf_counter() - start}
  exact = sweeps['exact'].ravel()
  largest = np.argsort(-np.abs(exact), kind='stable')[:2]
  heads = [h for h, _, _ in e.graph.patterns]
  site = lambda i: f'{heads[i // length]} at position {i % length}'
  for method, result in sweeps.items():
    score = result.ravel()
    target = np.abs(exact) if method == 'atp_star' else exact
    order = np.argsort(-np.abs(score), kind='stable')
    ranks = [int(np.nonzero(order == i)[0][0]) + 1 for i in largest]
    out[method].update({'pearson': float(np.corrcoef(score, target)[0, 1]),
                        'spearman': float(stats.spearmanr(score, target).statistic),
                        'ranks_of_two_largest': ranks, 'two_largest_in_top_three': max(ranks) <= 3,
                        'estimates_of_two_largest': [float(score[i]) for i in largest]})
    print(workdir, method, {k: v for k, v in out[method].items() if k != 'estimates_of_two_largest'}, flush=True)
  return {'kind': run.model_config.kind, 'sites': len(exact), 'per_method': out,
          'two_largest': [{'site': site(int(i)), 'exact': float(exact[i]),
                           'path': path(e, heads[i // length], int(i % length))} for i in largest]}


def path(e, head: str, position: int) -> list[float]:
  """f(α) − f(0) at α = 0, 0.1, ..., 1 with the head's output at ``position`` moved α of the way to the corrupt
  run's: how far from linear (what attribution patching assumes) the effect of that site is."""
  g = e.graph
  patch = np.zeros((len(g.edges), e.clean.shape[1]), np.float32)
  patch[g.ends[0] == g.nodes.index(head), position] = 1.0
  base = e.value()
  return [e.value(alpha * patch) - base for alpha in np.linspace(0.0, 1.0, 11)]


def main(argv):
  del argv
  from symjax.train import sweep as sweep_lib
  per_run = {workdir: sweep(workdir) for workdir in _WORKDIRS.value}
  kinds = sorted({r['kind'] for r in per_run.values()})
  if len(kinds) > 1:
    raise app.UsageError(f'--workdirs must be runs of one model kind, got {kinds}')
  methods = next(iter(per_run.values()))['per_method']
  summary = {m: {'pearson': sweep_lib.stat([r['per_method'][m]['pearson'] for r in per_run.values()]),
                 'spearman': sweep_lib.stat([r['per_method'][m]['spearman'] for r in per_run.values()]),
                 'seconds': sweep_lib.stat([r['per_method'][m]['seconds'] for r in per_run.values()]),
                 'runs_with_two_largest_in_top_three': sum(r['per_method'][m]['two_largest_in_top_three']
                                                           for r in per_run.values())} for m in methods}
  result_files.write(_JSON.value, {
      'what': "a text model's head sweep ((layer, position, head) sites, each head's output at one position patched "
              'from a corrupt prompt) exactly and as attribution patching, AtP* and EAP-IG estimate it; mean and '
              '95% t-interval over runs (seeds)',
      'kind': kinds[0],
      'train_command': f'python -m symjax.main --config={kinds[0]}:task=text,size=medium '
                       '--config.text_path=../shared/data/tinyshakespeare.txt --config.seed=S',
      'prompts': _PROMPTS.value, 'length': _LENGTH.value, 'ig_steps': _STEPS.value, 'summary': summary,
      'per_run': per_run})


if __name__ == '__main__':
  app.run(main)
