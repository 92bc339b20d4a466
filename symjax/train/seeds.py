"""Several seeds of one config, trained together in one process.

A leading seed axis on everything that differs between seeds: the parameters (initialised from each seed's
key), the optimiser state, the order of the training batches and the dropout keys. The task's data (and so
its splits and evaluation batches) depend on ``data_seed`` only and are shared. One compiled step then
trains every seed (``combined_step``: ``jax.vmap`` over the seed axis, or each seed's step unrolled as its
own subgraph of one program), so small models keep the machine busy instead of paying per-step overhead
once per seed.

Each seed has its own work directory, laid out as a single run's (``config.json`` with that seed, ``run.json``,
``vocab.json``, ``metrics.jsonl``, ``final_metrics.json``, ``checkpoints/``): ``symjax.load`` and
``python -m symjax.main`` read it like any other, and a vmapped seed equals the separate run of that seed up
to float rounding (``tests/test_seeds.py``). Rerunning resumes from the newest checkpoint step that every
seed has, and a set of seeds whose ``final_metrics.json`` all record the last step is not trained again.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from symjax.model import transformer_program
from symjax.run import lock
from symjax.run import workdir as rundir
from symjax.system import files, host
from symjax.system.errors import InputError
from symjax.train import config as config_lib
from symjax.train import distill, optim
from symjax.train import metrics as metrics_lib
from symjax.train import trainer as train

FINAL_FILE = rundir.FINAL_FILE


def finished(workdir: str, total_steps: int) -> dict | None:
  """The final metrics of a run in ``workdir`` that reached ``total_steps``, else None."""
  path = os.path.join(workdir, FINAL_FILE)
  if not os.path.isfile(path):
    return None
  final = files.read_json(path)
  return final if final.get('step') == total_steps else None


def check_config(config: ml_collections.ConfigDict) -> None:
  """What training seeds together cannot do, as one-line errors."""
  if config.stop_at_accuracy:
    raise InputError(f'config.stop_at_accuracy must be 0 when seeds train together (each seed would stop at '
                     f'its own step), got {config.stop_at_accuracy}')
  if config.numeral_glyph_init:
    raise InputError('config.numeral_glyph_init is not supported when seeds train together; '
                     'train such runs one by one with python -m symjax.main')
  for phase in ('soft_steps', 'straight_steps'):
    if config.get(phase, 0):
      raise InputError(f'config.{phase} (program training) is not taken by the seed trainer; train such runs '
                       'one by one with python -m symjax.main')
  if config.mesh.vocab != 1 or config.mesh.data not in (-1, 1) or config.distributed.num_processes != 1:
    raise InputError('seeds train together on one device of one process: config.mesh.vocab and '
                     'config.mesh.data must be 1 (or data -1) and config.distributed.num_processes 1')


def _stack(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _restore_common(managers, abstract_state, workdirs) -> tuple[int, list | None]:
  """The newest checkpoint step that every seed has and that restores for every seed, through the work
  directory's one restore-with-fallback. A seed's checkpoint that fails is moved to its
  ``checkpoints_corrupt/`` (the other seeds' checkpoints of that step stay where they are)."""
  common = sorted(set.intersection(*(set(m.all_steps()) for m in managers)), reverse=True) if managers else []

  def restore_every_seed(step):
    states = []
    for manager, workdir in zip(managers, workdirs):
      try:
        rundir.check_checkpoint(workdir, step)
        state = rundir.restore_state(manager, step, abstract_state)
        if not all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state)
                   if jnp.issubdtype(x.dtype, jnp.inexact)):  # saved finite: damaged since
          raise ValueError('its parameters or optimiser state hold non-finite values')
        states.append(state)
      except Exception as e:  # pylint: disable=broad-except
        where = rundir.quarantine(workdir, step) if jax.process_index() == 0 else workdir
        raise RuntimeError(f'{type(e).__name__} in {workdir}, moved to {where}') from None
    return step, states

  restored = rundir.restore_first_valid(restore_every_seed, common, workdirs[0], quarantine_failed=False,
                                         check=lambda step: None)  # each seed's is read in restore_every_seed
  with rundir.quiet_orbax():
    for manager in managers:
      manager.reload()  # forget what was moved aside
  if restored is None:
    if common:
      print('WARNING: no checkpoint step common to the seeds restores; the seeds start from step 0', file=sys.stderr)
    return 0, None
  return restored


SEED_STEPS = ('auto', 'vmap', 'unroll')


def combined_step(train_step, num_seeds: int, how: str = 'auto'):
  """``train_step`` of every seed as one jitted function of (states, batches, keys), each with a leading
  seed axis; it donates the states.

  ``'vmap'`` batches every operation over the seeds: one kernel per operation, what fills a GPU or TPU.
  ``'unroll'`` writes each seed's step as an independent subgraph of one program, which XLA:CPU runs
  concurrently on its cores; a small model's batched operations run on one core, so on a CPU unrolling is
  the faster (measured in ``benchmarks/results/step_time.json``). ``'auto'``: unroll on CPU, vmap
  elsewhere. Either way seed i computes exactly ``train_step`` on its own slice.
  """
  if how not in SEED_STEPS:
    raise InputError(f'seed step must be one of {list(SEED_STEPS)}, got {how!r}')
  if how == 'auto':
    how = 'unroll' if jax.default_backend() == 'cpu' else 'vmap'
  if how == 'vmap':
    return jax.jit(jax.vmap(train_step), donate_argnums=0)

  def unrolled(states, batches, keys):
    take = lambda i: lambda x: x[i]
    outs = [train_step(jax.tree.map(take(i), states), jax.tree.map(take(i), batches), keys[i])
            for i in range(num_seeds)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
  return jax.jit(unrolled, donate_argnums=0)


def train_seeds(config: ml_collections.ConfigDict, seeds: Sequence[int], workdirs: Sequence[str],
                verbose: bool = True, seed_step: str = 'auto') -> list[dict]:
  """Trains ``config`` once per seed, all seeds in one compiled step (``combined_step(..., seed_step)``);
  seed i in ``workdirs[i]``; the loop is the single run's (``symjax.train.trainer.train_seats``).

  Returns each seed's final metrics (the content of its ``final_metrics.json``; a seed whose loss became
  non-finite has ``{'diverged': step}`` instead, and its last good checkpoint is kept).
  """
  if seed_step not in SEED_STEPS:
    raise InputError(f'seed step must be one of {list(SEED_STEPS)}, got {seed_step!r}')
  if len(seeds) != len(workdirs) or not seeds:
    raise InputError(f'need one work directory per seed, got {len(seeds)} seeds and {len(workdirs)} folders')
  host.prepare()
  spec = config_lib.validate(config)
  check_config(config)
  host.use_compilation_cache(config.compilation_cache_dir)
  done = [finished(w, config.total_steps) for w in workdirs]
  if all(done):
    return done
  # Every seed's folder held by this run alone (symjax.run.lock), stopped in one line on a full disk.
  with rundir.stops_when_full(workdirs[0]) as disk, lock.owned_all(workdirs):
    seed_configs = []
    for seed in seeds:
      c = ml_collections.ConfigDict(config.to_dict())
      c.seed = seed
      seed_configs.append(c)
    s = train.setup(spec, list(zip(workdirs, seed_configs)))
    seats = seed_seats(config, s, seeds, workdirs, seed_configs, seed_step, verbose)
    return train.train_seats(config, s, seats, disk, bar=False, verbose=verbose)


def seed_seats(config, s: train.Setup, seeds: Sequence[int], workdirs: Sequence[str], seed_configs: list,
               seed_step: str, verbose: bool) -> train.Seats:
  """Every seed's seat: the steps over a leading seed axis, the data and model shared by every seed, the state
  resumed from the newest step all seeds share (or initialised from each seed's key)."""
  task, model_config, model, tx = s.task, s.model_config, s.model, s.tx
  # Every seed learns from the same frozen teacher.
  objective = distill.make_objective(model_config, s.teacher, s.spec) if s.teacher is not None else None
  train_step, eval_step = train.make_steps(model, tx, train.StepOptions.of(config, task), objective)
  counts = transformer_program.sets_counts(model_config)

  def init(key):
    """A seed's fresh state, its counts set as a single run's (``trainer.task_init``)."""
    state = nn.meta.unbox(optim.init_state(model, tx, key, task.seq_len))
    if not counts:
      return state
    return state.replace(params=transformer_program.set_counts(state.params, model_config, task.symbol_ids()))

  keys = jnp.stack([jax.random.key(s) for s in seeds])
  v_train = combined_step(train_step, len(seeds), seed_step)
  v_eval = jax.jit(jax.vmap(eval_step, in_axes=(0, None)))   # every seed scores the same batch
  all_finite = jax.jit(jax.vmap(
      lambda tree: jnp.all(jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]))))

  def step(state, i):
    return v_train(state, _stack([task.batch('train', i, config.batch_size, seed) for seed in seeds]), keys)

  def evaluate(params, split: str) -> list[dict[str, float]]:
    """Every seed's metrics on ``split`` (every seed scores the same batches)."""
    sums = metrics_lib.total(v_eval(params, batch) for batch in
                             task.scored_batches(split, config.batch_size, config.data_seed))
    return [metrics_lib.summarize({k: float(v[i]) for k, v in sums.items()}, config.top_ks)
            for i in range(len(seeds))]

  # --- State: resume from the newest step all seeds share.
  managers = [rundir.checkpoint_manager(w, config.keep_checkpoints, config.best_metric) for w in workdirs]
  abstract_state = jax.eval_shape(init, keys[0])
  start_step, restored = _restore_common(managers, abstract_state, workdirs)
  state = _stack(restored) if restored else jax.jit(jax.vmap(init))(keys)
  num_params = sum(x.size for x in jax.tree.leaves(abstract_state.params))
  if verbose:
    print(f'symjax: {len(seeds)} seeds {list(seeds)} of a {model_config.kind} model, {num_params:,} parameters '
          f'each, task {task.name!r}' + (f', resuming from step {start_step}' if start_step else ''))
  return train.Seats(list(workdirs), seed_configs, [f'seed {seed}' for seed in seeds], step, evaluate,
                     lambda params: [bool(x) for x in np.asarray(all_finite(params))],
                     lambda tree, i: jax.tree.map(lambda x: x[i], tree), managers, state, start_step)
