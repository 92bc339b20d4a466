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

import dataclasses
import json
import math
import os
import sys
import time
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

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
  if config.get('soft_steps', 0):
    raise InputError('config.soft_steps (program training) is not taken by the seed trainer; train such runs '
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
  seed i in ``workdirs[i]``.

  Returns each seed's final metrics (the content of its ``final_metrics.json``; a seed whose loss became
  non-finite has ``{'diverged': step}`` instead, and its last good checkpoint is kept).
  """
  if seed_step not in SEED_STEPS:
    raise InputError(f'seed step must be one of {list(SEED_STEPS)}, got {seed_step!r}')
  if len(seeds) != len(workdirs) or not seeds:
    raise InputError(f'need one work directory per seed, got {len(seeds)} seeds and {len(workdirs)} folders')
  host.prepare()
  config_lib.validate(config)
  check_config(config)
  host.use_compilation_cache(config.compilation_cache_dir)
  done = [finished(w, config.total_steps) for w in workdirs]
  if all(done):
    return done
  # Every seed's folder held by this run alone (symjax.run.lock), stopped in one line on a full disk.
  with rundir.stops_when_full(workdirs[0]), lock.owned_all(workdirs):
    return _train(config, seeds, workdirs, seed_step, verbose)


def _train(config: ml_collections.ConfigDict, seeds: Sequence[int], workdirs: Sequence[str], seed_step: str,
           verbose: bool) -> list[dict]:
  """``train_seeds`` once its folders are held: set up, the loop, the final evaluation."""
  r = _set_up(config, seeds, workdirs, seed_step, verbose)
  seed_configs, task, model_config, schedule = r.seed_configs, r.task, r.model_config, r.schedule
  v_train, v_eval, all_finite, keys = r.v_train, r.v_eval, r.all_finite, r.keys
  managers, writers, state, start_step = r.managers, r.writers, r.state, r.start_step
  run_files_written = False

  def evaluate(params, split: str) -> list[dict[str, float]]:
    """Every seed's metrics on ``split``; 'train' is a fixed sample of 4 training batches, as in the
    single-run trainer, to compare with validation."""
    sums = metrics_lib.total(v_eval(params, batch) for batch in
                             task.scored_batches(split, config.batch_size, config.data_seed))
    return [metrics_lib.summarize({k: float(v[i]) for k, v in sums.items()}, config.top_ks)
            for i in range(len(seeds))]

  # --- Loop.
  diverged: dict[int, int] = {}
  tokens_per_step = len(seeds) * config.batch_size * task.seq_len
  last_time, last_step, step, rate = time.time(), start_step, start_step, 0.0
  try:
    while step < config.total_steps:
      state, metrics = v_train(state, _stack([task.batch('train', step, config.batch_size, s) for s in seeds]),
                               keys)
      step += 1
      if step % config.log_every_steps == 0 or step == config.total_steps:
        now = time.time()
        rate = (step - last_step) * tokens_per_step / max(now - last_time, 1e-9)
        last_time, last_step = now, step
        _log_train(step, metrics, seeds, diverged, writers, rate, float(schedule(step)))
      if step % config.eval_every_steps == 0 or step == config.total_steps:
        finite = np.asarray(all_finite(state.params))
        validation = evaluate(state.params, 'validation')
        if not run_files_written:  # the folders now get checkpoints this config trained
          for c, w in zip(seed_configs, workdirs):
            rundir.save_run_files(w, c, task, model_config, start_step)
          run_files_written = True
        _save_validated(step, state, finite, validation, diverged, managers, writers)
        if verbose:
          mean = lambda k: np.mean([v[k] for i, v in enumerate(validation) if i not in diverged] or [np.nan])
          print(f'step {step}: validation loss {mean("loss"):.4f} accuracy {mean("accuracy"):.4f} '
                f'(mean of {len(seeds) - len(diverged)} seeds)' + (f', {rate:,.0f} tokens/s' if rate else ''),
                flush=True)
  except BaseException:  # a bug or an interrupt: finish the checkpoints being saved and the metric files
    for manager, writer in zip(managers, writers):
      manager.wait_until_finished()
      writer.close()
      manager.close()
    raise
  for manager in managers:
    manager.wait_until_finished()

  # --- Final evaluation of every seed's final parameters (a seed whose parameters are not finite diverged).
  for i, ok in enumerate(np.asarray(all_finite(state.params))):
    if not ok:
      diverged.setdefault(i, step)
  splits = {'train': evaluate(state.params, 'train'), 'validation': evaluate(state.params, 'validation'),
            **{s: evaluate(state.params, s) for s in ('test', *task.eval_splits)}}
  return _write_finals(step, splits, diverged, workdirs, writers, managers)



@dataclasses.dataclass
class _SeedRun:
  """What ``train_seeds`` sets up before its loop: shared by every seed, or one per seed."""
  seed_configs: list
  task: Any
  model_config: Any
  schedule: Any
  v_train: Any        # (stacked state, stacked batch, keys) -> (state, metrics)
  v_eval: Any         # (stacked params, batch) -> every seed's metric sums
  all_finite: Any     # stacked params -> [seeds] bool
  keys: Any
  managers: list
  writers: list
  state: Any
  start_step: int


def _set_up(config, seeds: Sequence[int], workdirs: Sequence[str], seed_step: str, verbose: bool) -> _SeedRun:
  """Data and model, shared by every seed, every folder checked against its seed's config before any is
  written; the state resumed from the newest step all seeds share."""
  seed_configs = []
  for seed in seeds:
    c = ml_collections.ConfigDict(config.to_dict())
    c.seed = seed
    seed_configs.append(c)
  s = train.setup(config, list(zip(workdirs, seed_configs)))
  task, model_config, model, tx, schedule = s.task, s.model_config, s.model, s.tx, s.schedule
  # Every seed learns from the same frozen teacher.
  objective = distill.make_objective(model_config, s.teacher, config) if s.teacher is not None else None
  train_step, eval_step = train.make_steps(model, tx, train.StepOptions.of(config, task), objective)
  init = lambda key: nn.meta.unbox(optim.init_state(model, tx, key, task.seq_len))
  keys = jnp.stack([jax.random.key(s) for s in seeds])
  v_train = combined_step(train_step, len(seeds), seed_step)
  v_eval = jax.jit(jax.vmap(eval_step, in_axes=(0, None)))   # every seed scores the same batch
  all_finite = jax.jit(jax.vmap(
      lambda tree: jnp.all(jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]))))

  # --- State: resume from the newest step all seeds share.
  managers = [rundir.checkpoint_manager(w, config.keep_checkpoints, config.best_metric) for w in workdirs]
  abstract_state = jax.eval_shape(init, keys[0])
  start_step, restored = _restore_common(managers, abstract_state, workdirs)
  state = _stack(restored) if restored else jax.jit(jax.vmap(init))(keys)
  writers = [rundir.MetricWriter(w, resume_step=start_step) for w in workdirs]
  num_params = sum(x.size for x in jax.tree.leaves(abstract_state.params))
  if verbose:
    print(f'symjax: {len(seeds)} seeds {list(seeds)} of a {model_config.kind} model, {num_params:,} parameters '
          f'each, task {task.name!r}' + (f', resuming from step {start_step}' if start_step else ''))
  return _SeedRun(seed_configs, task, model_config, schedule, v_train, v_eval, all_finite, keys, managers,
                  writers, state, start_step)

def _log_train(step: int, metrics, seeds: Sequence[int], diverged: dict[int, int], writers, rate: float,
               learning_rate: float) -> None:
  """Each seed's training metrics; a seed whose metrics are not finite is marked diverged at ``step``."""
  for i, m in enumerate(_unstack(jax.device_get(metrics), len(seeds))):
    m = {k: float(v) for k, v in m.items()}
    if i not in diverged and not all(math.isfinite(v) for v in m.values()):
      diverged[i] = step
      print(f'WARNING: seed {seeds[i]} diverged at step {step} (non-finite training metrics); '
            f'its last good checkpoint is kept', file=sys.stderr)
    if i not in diverged:
      writers[i].write(step, 'train', {**m, 'tokens_per_second': rate, 'learning_rate': learning_rate})


def _save_validated(step: int, state, finite, validation: list[dict], diverged: dict[int, int], managers,
                    writers) -> None:
  """Each seed's validation metrics and checkpoint, but for a seed that diverged (its parameters not finite:
  it is marked so here)."""
  for i, (manager, writer) in enumerate(zip(managers, writers)):
    if not finite[i]:
      diverged.setdefault(i, step)
    if i in diverged:
      continue
    writer.write(step, 'validation', validation[i])
    rundir.save_state(manager, step, jax.tree.map(lambda x, i=i: x[i], state), validation[i])


def _write_finals(step: int, splits: dict[str, list[dict]], diverged: dict[int, int], workdirs, writers,
                  managers) -> list[dict]:
  """Each seed's ``final_metrics.json`` (``{'diverged': step}`` for a seed that diverged); closes its files."""
  finals = []
  for i, (w, writer, manager) in enumerate(zip(workdirs, writers, managers)):
    if i in diverged:
      final = {'step': step, 'diverged': diverged[i]}
    else:
      final = {'step': step, **{split: rows[i] for split, rows in splits.items()}}
      writer.write(step, 'test', final['test'])
    files.write_atomically(os.path.join(w, FINAL_FILE), json.dumps(final, indent=1))
    writer.close()
    manager.close()
    finals.append(final)
  return finals


def _unstack(tree, n: int) -> list:
  return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(n)]
