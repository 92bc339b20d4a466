"""Training and evaluation, as one linear function: data -> model -> optimizer -> state -> checkpoints ->
steps -> loop.

Rerunning with the same work directory resumes from the latest valid checkpoint. Batches and dropout keys
are pure functions of (seed, step), so an interrupted and resumed run ends with exactly the parameters of an
uninterrupted one (on CPU).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import math
import os
import re
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.extend.core import jaxpr_as_fun
from jax.sharding import NamedSharding, PartitionSpec

from symjax import model as model_lib
from symjax import tasks
from symjax.model import ModelConfig, Transformer
from symjax.model.attention import GUMBEL_RNG
from symjax.ops import readout as readout_ops
from symjax.run import workdir as rundir
from symjax.system import files, host
from symjax.system import mesh as mesh_lib
from symjax.system.errors import InputError, PeerLost, TrainingDiverged
from symjax.train import config as config_lib
from symjax.train import distill, exported
from symjax.train import early as early_lib
from symjax.train import metrics as metrics_lib
from symjax.train.optim import TrainState, init_state, learning_rate_schedule, make_optimizer


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """What the step functions read from the run config and the task, built once: the readout ('direct' or
  'streamed'), the k of the top-k accuracies, the number of steps (over which program training's noise
  anneals) and whether attention reads the batches' ``key_mask`` (not for a task whose inputs are never
  padding: an all-true mask changes no weight, and a fused kernel would add it as a bias)."""

  readout: str = 'direct'
  top_ks: tuple[int, ...] = (3,)
  total_steps: int = 1
  key_mask: bool = True

  @classmethod
  def of(cls, config: ml_collections.ConfigDict, task: tasks.Task | None = None) -> 'StepOptions':
    return cls(config.readout, tuple(config.top_ks), config.total_steps,
               key_mask=True if task is None else task.pads_inputs)


def token_stats(model: Transformer, params, batch, readout: str, key_mask: bool = True, **apply_kw
                ) -> tuple[jax.Array, ...]:
  """Per-token (loss, prediction, #logits above the target's, #equal to it), each ``[batch, time]``.

  ``readout='streamed'`` streams the readout over vocabulary chunks (sharded over the 'vocab' mesh
  axis when there is one) and never forms the ``[tokens, vocabulary]`` logits. ``key_mask=False``
  ignores the batch's key mask (``StepOptions.key_mask``).
  """
  h, table = model.apply({'params': params}, batch['inputs'], batch['key_mask'] if key_mask else None,
                         return_hidden=True, edges=batch.get('edges'), **apply_kw)
  return hidden_stats(model, h, table, batch, readout)


def hidden_stats(model: Transformer, h, table, batch, readout: str) -> tuple[jax.Array, ...]:
  """``token_stats`` from the final hidden state h ``[batch, time, d_model]`` and the readout table."""
  flat_h, flat_targets = h.reshape(-1, h.shape[-1]), batch['targets'].reshape(-1)
  # The readout runs in the compute dtype, as every readout does (``readout.logits``): a float32
  # table against a bfloat16 h would otherwise promote the largest product of the step to float32.
  table = table.astype(h.dtype)
  num_valid = model.config.num_valid_rows
  if readout == 'streamed':
    stats = readout_ops.readout_stats(flat_h, table, flat_targets, model.config.vocab_chunk_size, num_valid)
  else:
    stats = readout_ops.direct_readout_stats(flat_h, table, flat_targets, num_valid)
  return tuple(x.reshape(batch['targets'].shape) for x in stats)


def training_dynamics(params, grads) -> dict[str, jax.Array]:
  """What the diagnosis of a run reads over training, cheap enough for every logged step: the gradient
  norm of every top-level module (``grad_norm/layer_0``, ``grad_norm/embed``, ...), the mean learned
  temperature τ of every vocabulary projection (``tau/layer_0/ffn``) and the mean ALiBi slope of every
  layer (``slope/layer_0``)."""
  out = {f'grad_norm/{name}': optax.tree.norm(g) for name, g in grads.items()}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    keys = [str(getattr(k, 'key', k)) for k in path]
    if keys[-1] == 'log_tau':
      site = 'ffn' if 'ffn' in keys else 'values'
      out[f'tau/{keys[0]}/{site}'] = jnp.exp(leaf).mean()
    elif keys[-1] == 'log_slope':
      out[f'slope/{keys[0]}'] = jnp.exp(leaf).mean()
  return out


def gumbel_schedule(model_config: ModelConfig, total_steps: int) -> optax.Schedule:
  """Program training's noise scale at each step: geometric from ``model.gumbel_scale`` at step 0 to
  ``model.gumbel_scale_end`` at the last step (constant without an end)."""
  start = model_config.gumbel_scale
  end = start if model_config.gumbel_scale_end is None else model_config.gumbel_scale_end
  return optax.exponential_decay(start, max(total_steps - 1, 1), end / start,
                                 end_value=end if end < start else None)


def make_steps(model: Transformer, tx: optax.GradientTransformation, options: StepOptions, objective=None):
  """The pure train and eval step functions (to be jitted with the run's shardings, or vmapped over
  seeds): ``train_step(state, batch, rng)`` with the run's key ``rng``, ``eval_step(params, batch)``.

  ``objective(ce, logits, intermediates, batch) -> (loss, metrics)``, when given, replaces the mean
  cross-entropy as the loss minimised (distillation, ``symjax.train.distill.make_objective``); the logged
  ``loss`` stays the cross-entropy and its metrics are logged beside it."""

  sampled = model.config.hard and model.config.gumbel_scale > 0

  def loss_fn(params, batch, dropout_key, step):
    kw = dict(deterministic=False, rngs={'dropout': dropout_key})
    if sampled:  # program training's Gumbel noise at this step's scale
      kw['rngs'][GUMBEL_RNG] = jax.random.fold_in(dropout_key, 1)
      kw['gumbel_scale'] = gumbel_schedule(model.config, options.total_steps)(step)
    if objective is None:
      loss, _, above, tied = token_stats(model, params, batch, options.readout, options.key_mask, **kw)
    else:
      (h, table), state = model.apply({'params': params}, batch['inputs'],
                                      batch['key_mask'] if options.key_mask else None, return_hidden=True,
                                      edges=batch.get('edges'), mutable=['intermediates'], **kw)
      loss, _, above, tied = hidden_stats(model, h, table, batch, options.readout)
    sums = metrics_lib.weighted_metrics(loss, above, tied, batch, options.top_ks)
    ce = sums['loss'] / jnp.maximum(sums['weight'], 1.0)
    if objective is None:
      return ce, (ce, sums, {})
    logits = readout_ops.logits(h, table)[..., :model.config.vocab_size]
    total, extra = objective(ce, logits, state['intermediates'], batch)
    return total, (ce, sums, {'objective': total, **extra})

  def train_step(state: TrainState, batch, rng):
    dropout_key = jax.random.fold_in(jax.random.fold_in(rng, 1), state.step)
    (_, (loss, sums, extra)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, dropout_key,
                                                                                state.step)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {'loss': loss, 'accuracy': sums['correct'] / jnp.maximum(sums['weight'], 1.0),
               'grad_norm': optax.tree.norm(grads), **extra, **training_dynamics(state.params, grads)}
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  def eval_step(params, batch):
    loss, _, above, tied = token_stats(model, params, batch, options.readout, options.key_mask)
    return metrics_lib.weighted_metrics(loss, above, tied, batch, options.top_ks)

  return train_step, eval_step


@dataclasses.dataclass
class CompiledRun:
  abstract_state: TrainState  # ShapeDtypeStructs carrying their shardings (Orbax restores into them)
  shardings: Any
  init: Any                   # rng -> sharded TrainState
  train_step: Any             # (state, batch) -> (state, metrics); donates the state
  eval_step: Any              # (params, batch) -> metric sums
  all_finite: Any             # pytree -> bool array


def compile_run(model: Transformer, tx, options: StepOptions, rng, mesh, rules, seq_len: int, objective=None
                ) -> CompiledRun:
  """State shapes from a trace of the initialiser, shardings from the logical-axis rules, and the jitted steps
  with explicit in/out shardings (``objective``: see ``make_steps``). Call under `jax.set_mesh(mesh)`."""
  # One trace of the initialiser gives both its shapes and its program: the jitted init below replays the
  # jaxpr, far cheaper than tracing the Flax model again, on the path to the first step.
  initialiser, abstract_boxed = jax.make_jaxpr(lambda key: init_state(model, tx, key, seq_len),
                                               return_shape=True)(rng)
  init = lambda key: jax.tree.unflatten(jax.tree.structure(abstract_boxed),
                                        jaxpr_as_fun(initialiser)(key))
  shardings = mesh_lib.state_shardings(abstract_boxed, mesh, rules)
  abstract_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                nn.meta.unbox(abstract_boxed), shardings)
  train_step, eval_step = make_steps(model, tx, options, objective)
  replicated = NamedSharding(mesh, PartitionSpec())
  batch_sharding = mesh_lib.batch_sharding(mesh)
  step_jit = dict(in_shardings=(shardings, batch_sharding), out_shardings=(shardings, replicated), donate_argnums=0)
  return CompiledRun(
      abstract_state=abstract_state, shardings=shardings,
      init=jax.jit(lambda k: nn.meta.unbox(init(k)), out_shardings=shardings),
      train_step=jax.jit(lambda state, batch: train_step(state, batch, rng), **step_jit),
      eval_step=jax.jit(eval_step, in_shardings=(shardings.params, batch_sharding),
                        out_shardings=replicated),
      all_finite=jax.jit(lambda tree: jnp.all(jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)
                                                         if jnp.issubdtype(x.dtype, jnp.inexact)])),
                         out_shardings=replicated))


def finite(state: TrainState, all_finite) -> TrainState:
  """``state`` as restored, or a ValueError when it holds a non-finite value: the trainer saves only finite
  states, so such a checkpoint was damaged after it was written (and is set aside like any other damage)."""
  if not bool(all_finite(state)):
    raise ValueError('its parameters or optimiser state hold non-finite values')
  return state


def peer_lost(e: BaseException, step: int, workdir: str) -> PeerLost:
  """The one-line error for a collective that lost a process: which one, and how to go on."""
  lost = mesh_lib.lost_processes()
  who = ('process 0 (the coordinator)' if lost is None else
         ' and '.join(f'process {i}' for i in lost) if lost else 'another process')
  saved = rundir.checkpoint_steps(workdir)
  kept = f'its last checkpoint (step {saved[-1]}) is intact' if saved else 'no checkpoint was saved yet'
  text = ' '.join(str(e).split())
  op, why = re.search(r'Gloo [\w-]+ failed', text), re.search(r'Connection (reset|closed|refused)[a-z ]*', text)
  cause = ': '.join(m.group(0).strip() for m in (op, why) if m) or text[:120]
  return PeerLost(f'lost {who} of the {jax.process_count()} after step {step} ({cause}); {kept}: rerun every '
                  f'process with the same command to resume')


def initial_state(run: CompiledRun, rng, kept: str | None) -> TrainState:
  """``run.init(rng)``; with ``kept`` (a path from ``exported.path_for``), the same arrays read from there if an
  earlier start kept them, else initialised and kept there (``exported.write_state``).

  Why: at a warm start, reading the initialiser's program from the persistent cache and running it held up the
  first step by half a second on a laptop's CPU (the docs' "Performance" page)."""
  state = exported.read_state(kept, run.abstract_state) if kept else None
  if state is None:
    state = run.init(rng)
    if kept:
      exported.write_state(kept, state)
  return state


def check_task_fits(task: tasks.Task, model_config: ModelConfig) -> None:
  """Raises ValueError when the model cannot read the task's batches (too long, or no graph to read)."""
  if model_config.relational and not task.has_edges:
    raise InputError(f"config.model.relational = True needs a graph task whose batches carry edges (task "
                     f"'graph_distance'); task {task.name!r} has none")
  if task.seq_len > model_config.max_len:
    raise InputError(f'task {task.name!r} has sequences of {task.seq_len} tokens but model.max_len is '
                     f'{model_config.max_len}; raise config.model.max_len or lower config.seq_len')


def task_init(state: TrainState, task: tasks.Task, model_config: ModelConfig, shardings) -> TrainState:
  """Freshly initialised parameters with the task's own changes (``Task.initial_params``), if it has any."""
  change = lambda params: task.initial_params(params, model_config)
  if jax.eval_shape(change, state.params) is None:
    return state
  return jax.jit(lambda s: s.replace(params=change(s.params)), out_shardings=shardings, donate_argnums=0)(state)


@dataclasses.dataclass(frozen=True)
class Setup:
  """What a run needs before its state: the task, the model's typed config, the teacher (or None), the
  model, its optimiser and learning-rate schedule."""

  task: tasks.Task
  model_config: ModelConfig
  teacher: Any
  model: nn.Module
  tx: optax.GradientTransformation
  schedule: optax.Schedule


def setup(config: ml_collections.ConfigDict, runs: list[tuple[str, ml_collections.ConfigDict]],
          vocab_shards: int = 1) -> Setup:
  """The steps every trainer takes before its state, for one work directory or several (the seeds of
  ``symjax.train.seeds``, each with its own config): the task, the typed model config built once from the
  ConfigDict, every folder checked against them before any is written, the teacher, the model and its
  optimiser. ``config`` must be validated already."""
  for workdir, _ in runs:
    os.makedirs(workdir, exist_ok=True)
  task = tasks.get_task(config, runs[0][0])
  model_config = config_lib.model_config(config, len(task.vocab), task.causal, vocab_shards=vocab_shards)
  check_task_fits(task, model_config)
  for workdir, run_config in runs:
    rundir.check_same_model(workdir, model_config)
    rundir.check_same_data(workdir, task)
    rundir.check_same_training(workdir, run_config)
    distill.check_same_distillation(workdir, run_config)
  teacher = distill.load_teacher(config, task, model_config, runs[0][0]) if config_lib.distills(config) else None
  return Setup(task, model_config, teacher, model_lib.build(model_config), make_optimizer(config),
               learning_rate_schedule(config))


def abstract_batch(task: tasks.Task, config: ml_collections.ConfigDict, mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """The shapes, dtypes and sharding of every training batch (``mesh_lib.batch_putter``'s arrays)."""
  sharding = mesh_lib.batch_sharding(mesh)
  return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding)
          for k, v in task.batch('train', 0, config.batch_size, config.seed).items()}


def compile_ahead(traced: Callable[[], tuple[Any, Any]], mesh, abstract_batch, kept: str | None = None,
                  early: concurrent.futures.Future | None = None, needed: threading.Event | None = None
                  ) -> concurrent.futures.Future:
  """Makes the program of the first training step on a worker thread, for batches of ``abstract_batch``'s
  shapes and shardings; the future's result is the step to call, ``(state, batch) -> (state, metrics)``.
  ``traced()`` gives the jitted step and the state's abstract arrays (``CompiledRun.train_step`` and
  ``abstract_state``); it may wait for the main thread to trace them, and is called only once the worker
  needs them. JAX keeps the trace, the lowering and the executable in the step's own caches, so its first call
  with arrays of those shapes and shardings runs the program at once.

  Without ``kept``, the result is the jitted step, traced, lowered and compiled (or read from the persistent
  cache). With ``kept``, a path from ``exported.path_for``, the step kept there (``symjax.train.exported``) is
  compiled without tracing anything and without the state's shapes, and the result calls it
  (``exported.as_step``). If none is kept there, the step is traced and exported there first, and the run
  calls the kept step all the same: a rerun then finds the program it compiled in the persistent cache.
  ``early``, the future of that kept step compiled already (``early_lib.EarlyStep.future_for``), spares
  the worker reading and compiling it; if its result is None, the worker does both. A kept step compiled before
  ``needed`` is set is primed (``exported.prime``): the caller sets it when what it has left to do before the
  first step (reading a kept state) takes less time than priming would save.

  Why: a warm start spends most of its time before the first step in Python, importing and tracing, and in
  reading the compiled program back from the cache. The reading lets go of the GIL, so the main thread traces
  the initialiser and reads or initialises the state meanwhile (the docs' "Performance" page). Only the mesh
  is carried over to the worker: under another setting made for the calling thread alone (a ``with
  jax.default_matmul_precision(...)`` block) the first call misses these caches and compiles its own program."""
  def use(e: Exception) -> None:
    print(f'WARNING: the training step kept in {kept} cannot be used ({type(e).__name__}: {e}); tracing '
          f'the step instead', file=sys.stderr)

  def compile_():
    with jax.set_mesh(mesh):  # the mesh context is the calling thread's own
      if kept:
        made = early.result() if early is not None else None
        data = None
        if made is None:
          data = exported.read(kept)
          if data is None:
            step_fn, abstract_state = traced()
            try:  # a step this JAX cannot export: the traced one runs
              data = exported.export(step_fn, abstract_state, abstract_batch)
            except Exception as e:  # pylint: disable=broad-except
              use(e)
            else:
              exported.write(kept, data)
        if made is not None or data is not None:
          try:  # a step this JAX cannot read back, compile or call with the run's state: the traced one runs
            if made is None:
              made = exported.compile_kept(data, mesh, jax.tree.leaves(abstract_batch)[0].sharding, needed)
            return exported.as_step(*made, traced()[1], abstract_batch)
          except Exception as e:  # pylint: disable=broad-except
            use(e)
      step_fn, abstract_state = traced()
      step_fn.lower(abstract_state, abstract_batch).compile()
      return step_fn

  pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='symjax-compile')
  try:
    return pool.submit(compile_)
  finally:
    pool.shutdown(wait=False)


def prefetched(make: Callable[[int], Any], steps: Iterable[int]) -> Iterator[Any]:
  """``make(step)`` for each step in order, each made on a worker thread while the caller uses the one before.

  The trainer runs CPU programs inline (``host.run_cpu_programs_inline``), so without this the next batch
  would be cut and placed only after the step ends; JAX lets go of the GIL while a program runs, and the worker
  makes it meanwhile. ``make`` must depend on its step alone (a task's batches do). Closing the generator (a
  break, an exception) waits for the one call in flight and drops its result.
  """
  pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='symjax-batches')
  try:
    ahead: collections.deque[concurrent.futures.Future] = collections.deque()
    for step in steps:
      ahead.append(pool.submit(make, step))
      if len(ahead) > 1:
        yield ahead.popleft().result()
    while ahead:
      yield ahead.popleft().result()
  finally:
    pool.shutdown(wait=True, cancel_futures=True)


def interactive_output() -> bool:
  """A terminal, or a Jupyter / Colab kernel (whose stderr is no TTY, yet shows tqdm's widget)."""
  if sys.stderr.isatty():
    return True
  ipython = sys.modules.get('IPython')
  shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, 'get_ipython') else None
  return shell is not None and hasattr(shell, 'kernel')


# ----------------------------------------------------------------------------------------------------------
# The trainer.
# ----------------------------------------------------------------------------------------------------------
def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, early: early_lib.EarlyStep | None = None
                       ) -> dict[str, dict[str, float]]:
  """Trains (or resumes) in ``workdir``; returns the final metrics per split. ``early``: the step
  ``early_lib.start`` began compiling for this config, used if it is this run's."""
  # --- Config, processes and mesh.
  host.set_defaults(config.get('model', {}).get('kind'))
  config_lib.validate(config)
  early_lib.use_compilation_cache(config)
  mesh_lib.maybe_initialize_distributed(config.distributed)
  mesh = mesh_lib.make_mesh(config.mesh.data, config.mesh.vocab, config.batch_size)
  rules = tuple(tuple(r) for r in config.sharding_rules)
  lead = jax.process_index() == 0

  # --- Data, model and optimizer. Every process builds the same global batches and keeps its devices' rows.
  s = setup(config, [(workdir, config)], vocab_shards=mesh.shape[mesh_lib.VOCAB_AXIS])
  task, model_config, teacher, model, tx, schedule = s.task, s.model_config, s.teacher, s.model, s.tx, s.schedule
  put = mesh_lib.batch_putter(mesh)

  with jax.set_mesh(mesh):
    # --- The first step's program, compiled (or read from the cache) on a worker thread while the state's shapes
    # are traced and the state is restored or initialised below. A kept step needs neither.
    saved_steps = rundir.checkpoint_steps(workdir)
    soft_first = bool(config.get('soft_steps', 0)) and max(saved_steps, default=0) < config.soft_steps
    batch_shapes = abstract_batch(task, config, mesh)
    options = StepOptions.of(config, task)
    key = lambda name: exported.step_key(name, config, model_config, options, mesh, batch_shapes)
    kept, made = None, None
    if teacher is None:  # a teacher's parameters are constants of the traced step: not in the key
      step_key = key('soft' if soft_first else 'train')
      kept = exported.path_for(step_key)
      if kept and not soft_first:
        made = early.future_for(step_key, mesh) if early is not None else None
        early_lib.note(config, step_key)
    needed = early.needed if made is not None else threading.Event()
    traced: concurrent.futures.Future = concurrent.futures.Future()
    ahead = compile_ahead(traced.result, mesh, batch_shapes, kept, made, needed)

    # --- State shapes and shardings, compiled steps.
    try:
      rng = jax.random.key(config.seed)
      objective = None
      if teacher is not None:  # stream-specific distillation from a frozen teacher (symjax.train.distill)
        objective = distill.make_objective(model_config, distill.teacher_on(mesh, teacher), config)
      run = compile_run(model, tx, options, rng, mesh, rules, task.seq_len, objective)
      # Program training's soft phase: the same parameters through the soft model (model.hard off).
      soft = dataclasses.replace(model_config, hard=False, gumbel_scale=0.0, gumbel_scale_end=None)
      soft_step = compile_run(model_lib.build(soft), tx, options, rng, mesh, rules, task.seq_len,
                              objective).train_step if config.get('soft_steps', 0) else None
    except BaseException as e:  # the worker waits for these: it fails too, and the error is raised here
      traced.set_exception(e)
      raise
    traced.set_result((soft_step if soft_first else run.train_step, run.abstract_state))
    num_params = sum(x.size for x in jax.tree.leaves(run.abstract_state.params))

    # --- Checkpoints: resume from the latest valid one. A run with none to resume makes its manager at its
    # first save: Orbax's import and set-up would hold up the first step.
    manager, state = None, None
    if saved_steps:
      manager = rundir.checkpoint_manager(workdir, config.keep_checkpoints, config.best_metric)
      state = rundir.restore_first_valid(lambda step: finite(rundir.restore_state(manager, step, run.abstract_state),
                                                             run.all_finite),
                                         sorted(manager.all_steps(), reverse=True), workdir)
      with rundir.quiet_orbax():
        manager.reload()  # forget what was moved aside
    if state is None:
      if saved_steps and lead:
        print(f'WARNING: no checkpoint in {workdir!r} could be restored; training starts again from step 0',
              file=sys.stderr)
      needed.set()  # reading a kept state takes a tenth of a second: less than priming the step would gain
      state = task_init(initial_state(run, rng, exported.path_for(key('init'), exported.STATE_SUFFIX)), task,
                        model_config, run.shardings)
    host.release_freed_memory()
    start_step = int(state.step)
    train_step, eval_step, all_finite = run.train_step, run.eval_step, run.all_finite
    # The first step's caches now hold its program: its first call below skips the compiler.
    needed.set()  # the worker primes the step no more (compile_ahead)
    if soft_first:
      soft_step = ahead.result()
    else:
      train_step = ahead.result()

    # --- Loop.
    writer = rundir.MetricWriter(workdir, resume_step=start_step)
    run_files_written = False
    if lead:
      print(f'symjax: {model_config.kind} model, {num_params:,} parameters, task {task.name!r} '
            f'(vocabulary {len(task.vocab)}), mesh {dict(mesh.shape)}, workdir {workdir}')
      if start_step > 0:
        print(f'resuming from step {start_step}')
    bar = None
    if config.progress_bar and interactive_output() and lead:
      from tqdm.auto import tqdm  # a widget in notebooks, a text bar on terminals
      bar = tqdm(total=config.total_steps, initial=start_step, dynamic_ncols=True)
    say = bar.write if bar is not None else print
    started = time.time()
    tokens_per_step = config.batch_size * task.seq_len
    last_time, last_step = time.time(), start_step
    validation: dict[str, float] = {}
    step = start_step
    resumed = os.path.join(rundir.CHECKPOINT_DIR, str(start_step)) if start_step > 0 else None

    def diverged(what: str) -> TrainingDiverged:
      """The error for non-finite values; right after a resume it names the checkpoint resumed from (a
      checkpoint saved since would be the one to blame instead) and how to resume from the one before."""
      if resumed is None or manager is None or max(manager.all_steps(), default=0) > start_step:
        return TrainingDiverged(f'{what}; the last good checkpoint is kept')
      return TrainingDiverged(f'{what}, {step - start_step} steps after resuming from {resumed} in {workdir!r}; to '
                              f'resume from an earlier checkpoint, move {resumed} into {rundir.CORRUPT_DIR}/ and '
                              f'rerun the same command')
    batches = prefetched(lambda s: put(task.batch('train', s, config.batch_size, config.seed)),
                         range(start_step, config.total_steps))
    try:
      while step < config.total_steps:
        step_fn = soft_step if soft_step is not None and step < config.soft_steps else train_step
        state, metrics = step_fn(state, next(batches))
        step += 1
        if step == start_step + 1 and lead:  # how long compilation (or the cache) held the user up
          jax.block_until_ready(metrics['loss'])
          say(f'first step done after {time.time() - started:.1f} s (compilation included)')
        if step == start_step + 1:  # compiled by now on every process (dispatch compiles)
          # The initialiser ran once. Its program (a large one: every initialiser) is freed here, after the first
          # step and not before it: unloading it holds the main thread up for a tenth of a second or more.
          run.init.clear_cache()
          host.collect_start_up_garbage()  # the command's start-up, uncollected until now (host's docstring)
          host.release_freed_memory()  # what the compiler and the collector freed
        if step % config.log_every_steps == 0 or step == config.total_steps:
          metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
          if not all(math.isfinite(v) for v in metrics.values()):
            raise diverged(f'non-finite training metrics at step {step}: {metrics}')
          now = time.time()
          metrics['tokens_per_second'] = (step - last_step) * tokens_per_step / max(now - last_time, 1e-9)
          metrics['learning_rate'] = float(schedule(step))
          last_time, last_step = now, step
          writer.write(step, 'train', metrics)
          if bar is not None:
            bar.set_postfix(loss=f"{metrics['loss']:.4f}", tok_s=f"{metrics['tokens_per_second']:.0f}")
          elif lead:  # a log file, nohup, CI: one line per logged step
            say(f"step {step}/{config.total_steps}: loss {metrics['loss']:.4f}, "
                f"{metrics['tokens_per_second']:,.0f} tokens/s, {now - started:.1f} s")
        if bar is not None:
          bar.update(1)
        if step % config.eval_every_steps == 0 or step == config.total_steps:
          if not bool(all_finite(state.params)):
            raise diverged(f'non-finite parameters at step {step}')
          validation = metrics_lib.evaluate(eval_step, state.params, metrics_lib.split_batches(
              task, 'validation', config.batch_size, config.data_seed), config.top_ks, put)
          writer.write(step, 'validation', validation)
          first_evaluation = not run_files_written
          if not run_files_written:  # the folder now holds checkpoints this config trained
            rundir.save_run_files(workdir, config, task, model_config, start_step)
            run_files_written = True
          if manager is None:
            manager = rundir.checkpoint_manager(workdir, config.keep_checkpoints, config.best_metric)
          rundir.save_state(manager, step, state, validation)
          if first_evaluation:
            host.release_freed_memory()  # what compiling the evaluation freed
          if lead:
            say(f'step {step}: validation ' + ' '.join(
                f'{k}={v:.4f}' for k, v in validation.items()))
          if config.stop_at_accuracy and validation['accuracy'] >= config.stop_at_accuracy:
            if lead:
              say(f'validation accuracy {validation["accuracy"]:.4f} >= config.stop_at_accuracy; stopping')
            break
    except BaseException as e:  # a divergence, an interrupt or a bug: finish what was being saved, then fail
      if mesh_lib.peer_failure(e):  # the save in flight waits on the lost process: not waited for
        writer.close()
        raise peer_lost(e, step, workdir) from None
      if manager is not None:
        manager.wait_until_finished()
      writer.close()
      if manager is not None:
        manager.close()
      raise
    finally:
      batches.close()
      if bar is not None:
        bar.close()
    if manager is not None:
      manager.wait_until_finished()
    host.collect_start_up_garbage()  # a finished run resumed takes no step

    # --- Final evaluation of the final parameters; final_metrics.json is never replaced by non-finite ones.
    try:
      if not bool(all_finite(state.params)):
        raise diverged(f'non-finite parameters at step {step}; {rundir.FINAL_FILE} is left as it was')
      score = lambda split: metrics_lib.evaluate(eval_step, state.params, metrics_lib.split_batches(
          task, split, config.batch_size, config.data_seed), config.top_ks, put)
      final = {'train': score('train'), 'validation': validation or score('validation'),
               **{split: score(split) for split in ('test', *task.eval_splits)}}
      if not all(math.isfinite(v) for m in final.values() for v in m.values()):
        raise diverged(f'non-finite final metrics at step {step}; {rundir.FINAL_FILE} is left as it was')
      writer.write(step, 'test', final['test'])
    finally:
      writer.close()
      if manager is not None:
        manager.close()
    if lead:
      metrics_lib.print_table(f'final metrics at step {step}', final)
      files.write_atomically(os.path.join(workdir, rundir.FINAL_FILE), json.dumps({'step': step, **final}, indent=1))
  return final
