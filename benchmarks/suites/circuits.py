"""Circuit discovery scored against the circuits programs compute: every method of ``symjax.interpret.edges``
on the RASP tasks and induction, over seeds.

  python -m benchmarks.suites.circuits [--tasks=hist,induction,...] [--models=program,symbolic] [--seeds=0,1,2]
      [--runs=/tmp/tprog/suite] [--examples=256] [--threshold=0.01] [--json=benchmarks/results/circuits.json]

Each run is what the recipe trains, in its folder under ``--runs`` (trained here when that lacks a finished one):
``--models=program``, the Transformer Program (the command ``decompile_suite --modes=transformer_program``
records, ``python -m symjax.main --config=rasp:task=T,model=program --config.seed=S``); ``symbolic``, the
program-trained Symbolic Transformer (``--config=rasp:task=T,model=symbolic,program=true``; induction
``--config=symbolic:task=induction,program=true``), whose results are keyed ``T/symbolic``.

Clean inputs: the first ``--examples`` of its test split; corrupt: each one replaced by another of the same
length (resample ablation; a length held by one input alone is left out). Metric: the mean log-probability of
the clean run's tags at the tagged positions. Ground truth: ``program_code.true_edges`` on the task's input
space (a Symbolic Transformer's: ``decompile.true_edges``), less a program's edges from ``positions``, which
hold the same values in both runs, so that no patch finds them. Each method is scored over the edges the model
reads (the rest change nothing, under every method):

  auroc         ranking by |score| against the truth (0.5: chance)
  precision, recall  of the top k edges, k the number of true ones (ACDC: of the set it keeps at --threshold)
  faithfulness  of that circuit, every other edge patched (``Edges.faithfulness``; 1: the whole model)
  spearman      of |score| against the exact patch's |effect|
  seconds       the method's call, compiled and warm (``seconds_first``: the first call, compiling)

The JSON also holds, for the first task and seed, every read edge's exact effect and truth: the circuit figure of
the results page.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

from benchmarks.lib import cli
from benchmarks.lib import results as result_files
from symjax.run import lock
from symjax.tasks import rasp
from symjax.train import sweep

_TASKS = flags.DEFINE_list('tasks', ['hist', 'induction', 'sort', 'double_hist'], f'Of {["induction", *rasp.TASKS]}.')
_MODELS = flags.DEFINE_list('models', ['program'], "Of ['program', 'symbolic'].")
flags.register_validator('models', lambda models: set(models) <= {'program', 'symbolic'},
                         "--models takes 'program' and 'symbolic'")
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Training seeds.')
_RUNS = flags.DEFINE_string('runs', '/tmp/tprog/suite', 'Where runs are trained (or found).')
_EXAMPLES = flags.DEFINE_integer('examples', 256, 'Clean inputs from the test split.', lower_bound=2)
_THRESHOLD = flags.DEFINE_float('threshold', 0.01, "ACDC's threshold on the rise in KL divergence.", lower_bound=0)
_STEPS = flags.DEFINE_integer('ig_steps', 16, "EAP-IG's steps.", lower_bound=1)
_JSON = cli.json_output('benchmarks/results/circuits.json', 'Output.')

METHODS = ('exact', 'eap', 'eap_ig', 'atp_star', 'acdc')


def recipe(task: str, model: str, seed: int, workdir: str) -> list[str]:
  if model == 'symbolic':
    config = ('--config=symbolic:task=induction,program=true' if task == 'induction' else
              f'--config=rasp:task={task},model=symbolic,program=true')
  else:
    config = '--config=program' if task == 'induction' else f'--config=rasp:task={task},model=program'
  return [sys.executable, '-m', 'symjax.main', config, f'--config.seed={seed}', '--config.progress_bar=false',
          f'--workdir={workdir}']


def trained(task: str, model: str, seed: int) -> tuple[str, str]:
  """The run's folder, trained first unless it holds a finished run, and the command that trains it."""
  folder = 'transformer_program' if model == 'program' else 'symbolic_program'
  workdir = os.path.join(_RUNS.value, f'{task}_{folder}_seed{seed}')
  command = recipe(task, model, seed, workdir)
  lock_file = os.path.join(workdir, lock.LOCK_FILE)
  if os.path.isfile(lock_file):  # a run training there now: wait for it (granted once its exclusive lock goes)
    with open(lock_file) as f:
      fcntl.flock(f, fcntl.LOCK_SH)
  if not os.path.isfile(os.path.join(workdir, 'final_metrics.json')):
    subprocess.run(command, check=True)
  return workdir, ' '.join(['python', *command[1:]])


def timed(fn):
  start = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - start


def measure(task: str, model: str, seed: int) -> tuple[dict, dict, str]:
  """(scores per method, the figure's data, the training command) of one run."""
  import symjax
  from symjax import tasks
  from symjax.interpret import edges
  from symjax.proj import program_code

  workdir, command = trained(task, model, seed)
  loaded = symjax.load(workdir)
  batch = loaded.batches('test', n=1, batch_size=_EXAMPLES.value)[0]
  rows, partners = edges.resample_pairs(batch['key_mask'], seed)
  clean, corrupt = batch['inputs'][rows], batch['inputs'][partners]
  key_mask, weights = batch['key_mask'][rows].astype(bool), batch['weights'][rows]
  task_ = tasks.get_task(loaded.config)
  inputs, _ = task_.input_space()
  truth_names = program_code.true_edges(loaded.params, loaded.model_config, list(loaded.tokenizer.vocab.tokens),
                                        inputs, (inputs != task_.pad_id).sum(1))
  e = edges.Edges(loaded.model, loaded.params, clean, corrupt, key_mask=key_mask, weights=weights)
  g = e.graph
  truth = g.mask([t for t in truth_names if not t.startswith('positions->')])
  read = e.read
  calls = {'exact': e.exact, 'eap': e.eap, 'eap_ig': lambda: e.eap_ig(_STEPS.value), 'atp_star': e.atp_star,
           'acdc': lambda: e.acdc(_THRESHOLD.value)}
  out = {}
  exact = None
  for method in METHODS:
    _, first = timed(calls[method])
    result, seconds = timed(calls[method])
    if method == 'acdc':
      kept, scores = result
    else:
      scores = result
      kept = edges.top(np.where(read, np.abs(scores), -1.0), int(truth.sum()))
    magnitude = np.abs(np.asarray(scores, np.float64))
    if method == 'exact':
      exact = magnitude
    precision, recall = edges.precision_recall(kept, truth)
    out[method] = {'auroc': edges.auroc(magnitude[read], truth[read]), 'precision': precision, 'recall': recall,
                   'faithfulness': e.faithfulness(kept), 'spearman': _spearman(magnitude[read], exact[read]),
                   'seconds': seconds, 'seconds_first': first, 'edges_kept': int(kept.sum())}
  out['truth'] = {'faithfulness': e.faithfulness(truth), 'true_edges': int(truth.sum()),
                  'position_edges': len(truth_names) - int(truth.sum()), 'read_edges': int(read.sum()),
                  'edges': len(g.edges), 'examples': len(clean)}
  figure = {'task': task, 'seed': seed, 'nodes': list(g.nodes), 'layer': list(g.layer),
            'edges': [[g.edges[i], float(exact[i]), bool(truth[i])] for i in np.nonzero(read)[0]]}
  return out, figure, command


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
  from scipy import stats
  if np.ptp(a) == 0 or np.ptp(b) == 0:
    return float('nan')
  return float(stats.spearmanr(a, b).statistic)


def main(argv):
  del argv
  per_seed, commands, figure = {}, {}, None
  for model in _MODELS.value:
    for task in _TASKS.value:
      key = task if model == 'program' else f'{task}/{model}'
      for seed in map(int, _SEEDS.value):
        scores, fig, command = measure(task, model, seed)
        per_seed.setdefault(key, {})[str(seed)] = scores
        commands[f'{key}/{seed}'] = command
        figure = figure or fig
        print(key, seed, {m: round(scores[m]['auroc'], 3) for m in METHODS}, flush=True)
  summary = {task: {method: {field: sweep.stat([s[method][field] for s in seeds.values()])
                             for field in seeds[next(iter(seeds))][method]}
                    for method in (*METHODS, 'truth')} for task, seeds in per_seed.items()}
  result_files.write(_JSON.value, {
      'what': 'circuit discovery on Transformer Programs (and program-trained Symbolic Transformers, keyed T/symbolic) '
              'against the circuits their programs compute: AUROC, '
              'precision and recall of the top k (k = true edges; ACDC its set), faithfulness of that circuit, '
              'Spearman against exact edge patching, seconds per call (warm); mean and 95% t-interval over seeds',
      'threshold': _THRESHOLD.value, 'ig_steps': _STEPS.value, 'examples': _EXAMPLES.value,
      'commands': commands, 'summary': summary, 'per_seed': per_seed, 'figure': figure})


if __name__ == '__main__':
  app.run(main)
