"""How close each stream of the default induction models stays to token mixtures, over seeds.

  python -m benchmarks.analysis.stream_cone [--kinds=token_factored,symbolic] [--seeds=0,1,2]
      [--runs=/tmp/symjax_extrapolation] [--sequences=50] [--json=benchmarks/results/stream_cone.json]

Each (kind, seed) is the default induction job (``python -m symjax.main --config=<kind>
--config.seed=<seed>``), trained unless its work directory holds a finished run; the runs are the ones
``length_extrapolation`` reads. On the first ``--sequences`` test sequences it measures, for every channel
of X_t and X_e after each block, the cosine between the state and its nearest non-negative combination of
that channel's token embeddings (``interpret.tracing.cone``: 1 inside the vocabulary cone), averaged over
positions and heads; and, where the model is all-symbolic, the exact mixture trace's largest relative
reconstruction error (``interpret.mixtures.reconstruction_errors``; the tests require ≤ 1e-4).
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from benchmarks.lib import cli, default_runs
from benchmarks.lib import results as result_files
from symjax import tasks
from symjax.interpret import core, mixtures, tracing
from symjax.train import sweep

_KINDS = cli.kinds(['token_factored', 'symbolic'], 'Two-stream model kinds.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Training seeds (config.seed).')
_RUNS = flags.DEFINE_string('runs', '/tmp/symjax_extrapolation', 'Where the runs are trained (or found).')
_SEQUENCES = flags.DEFINE_integer('sequences', 50, 'Test sequences read.', lower_bound=1)
_JSON = cli.json_output('benchmarks/results/stream_cone.json', 'Output ("" prints).')

STREAMS = ('x_t', 'x_e')


def measure(run, inputs: np.ndarray, real: np.ndarray) -> dict:
  """Mean cone cosine per stream after each block over the ``real`` (unpadded) positions, and the mixture
  trace's reconstruction error."""
  cfg = run.model.config
  tr = tracing.trace(run.model, run.params, inputs, key_mask=real, with_cone=False)
  table = core.embedding_table(run.params)
  row = {}
  for stream in STREAMS:
    row[f'cone_cosine_{stream}'] = [
        float(tracing.cone(tr.streams[l][stream], table, cfg.num_heads, cfg.vocab_size)[real].mean())
        for l in range(1, cfg.num_layers + 1)]
  if tr.mixture is not None:
    errors = mixtures.reconstruction_errors(tr.mixture, table, cfg.num_heads)
    row.update({f'reconstruction_error_{s}': max(errors[s]) for s in STREAMS})
  return row


def main(_):
  per_run, commands = {}, {}
  for kind in _KINDS.value:
    for seed in map(int, _SEEDS.value):
      commands[f'{kind}/{seed}'], run = default_runs.induction_run(kind, seed, _RUNS.value)
      task = tasks.get_task(run.config)
      inputs = task.data.inputs['test'][:_SEQUENCES.value]
      per_run.setdefault(kind, {})[str(seed)] = row = {'step': run.step,
                                                       **measure(run, inputs, inputs != task.pad_id)}
      print(kind, seed, row, flush=True)

  summary = {}
  print('\n| kind | stream | block | cone cosine |\n|---|---|---:|---:|')
  for kind, seeds in per_run.items():
    rows = list(seeds.values())
    for stream in STREAMS:
      key = f'cone_cosine_{stream}'
      for l in range(len(rows[0][key])):
        stat = sweep.stat([r[key][l] for r in rows])
        summary.setdefault(kind, {}).setdefault(key, []).append(stat)
        print(f"| {kind} | {stream} | {l} | {stat['mean']:.3f} ± {stat['ci95']:.3f} |")
      if f'reconstruction_error_{stream}' in rows[0]:
        summary[kind][f'reconstruction_error_{stream}_largest'] = max(
            r[f'reconstruction_error_{stream}'] for r in rows)
  if _JSON.value:
    result_files.write(_JSON.value, {
        'what': 'mean cosine between each channel state and its nearest non-negative token mixture (1: a '
                'token mixture), after each block (index 0 = block 0), over positions and heads of the first '
                f'{_SEQUENCES.value} test sequences, default induction jobs, mean and 95% t-interval over '
                'seeds; all-symbolic models also the exact mixture trace\'s largest relative reconstruction '
                'error over blocks',
        'train_commands': commands, 'sequences': _SEQUENCES.value, 'summary': summary, 'per_seed': per_run})


if __name__ == '__main__':
  app.run(main)
