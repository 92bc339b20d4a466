"""Training and evaluation, as one linear function: data -> model -> optimizer -> state -> checkpoints ->
steps -> loop.

Rerunning with the same work directory resumes from the latest valid checkpoint. Batches and dropout keys
are pure functions of (seed, step), so an interrupted and resumed run ends with exactly the parameters of an
uninterrupted one (on CPU).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.extend.core import jaxpr_as_fun
from jax.sharding import NamedSharding, PartitionSpec

from symjax import model as model_lib
from symjax import tasks
from symjax.model import ModelConfig, Transformer, transformer_program
from symjax.model.program import GUMBEL_RNG
from symjax.model.transformer import PLS
from symjax.ops import readout as readout_ops
from symjax.run import lock
from symjax.run import workdir as rundir
from symjax.system import files, host
from symjax.system import mesh as mesh_lib
from symjax.system.errors import InputError, PeerLost, TrainingDiverged
from symjax.train import config as config_lib
from symjax.train import distill, optim
from symjax.train import metrics as metrics_lib
from symjax.train.optim import TrainState, init_state, learning_rate_schedule, make_optimizer


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """What the step functions read from the run config and the task, built once: the readout ('direct' or
  'streamed'), the k of the top-k accuracies, the number of steps (over which program training's noise
  anneals) and whether attention reads the batches' ``key_mask`` (not for a task whose inputs are never
  padding: an all-true mask changes no weight, and a fused kernel would add it as a bias), and the weight of
  program training's group lasso on the readout (``config.readout_sparsity``)."""

  readout: str = 'direct'
  top_ks: tuple[int, ...] = (3,)
  total_steps: int = 1
  key_mask: bool = True
  readout_sparsity: float = 0.0

  @classmethod
  def of(cls, config: ml_collections.ConfigDict, task: tasks.Task | None = None) -> 'StepOptions':
    return cls(config.readout, tuple(config.top_ks), config.total_steps,
               key_mask=True if task is None else task.pads_inputs,
               readout_sparsity=config.get('readout_sparsity', 0.0))


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
    stats = readout_ops.readout_stats(flat_h, table, flat_targets, model.config.kernels.vocab_chunk_size, num_valid)
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
  start = model_config.program.gumbel_scale
  end = start if model_config.program.gumbel_scale_end is None else model_config.program.gumbel_scale_end
  return optax.exponential_decay(start, max(total_steps - 1, 1), end / start,
                                 end_value=end if end < start else None)


def make_steps(model: Transformer, tx: optax.GradientTransformation, options: StepOptions, objective=None):
  """The pure train and eval step functions (to be jitted with the run's shardings, or vmapped over
  seeds): ``train_step(state, batch, rng)`` with the run's key ``rng``, ``eval_step(params, batch)``.

  ``objective(ce, logits, intermediates, batch) -> (loss, metrics)``, when given, replaces the mean
  cross-entropy as the loss minimised (distillation, ``symjax.train.distill.make_objective``); the logged
  ``loss`` stays the cross-entropy and its metrics are logged beside it. Per-layer supervision
  (``model.pls_weight``) adds Σ_l w_l CE_l (``ModelConfig.pls_weights``) to the loss minimised, and logs each
  layer's CE as ``pls/layer_l``."""

  sampled = model.config.samples_argmaxes
  pls = model.config.pls_weights() if model.config.streams.pls_weight > 0 else ()

  def loss_fn(params, batch, dropout_key, step):
    kw = dict(deterministic=False, rngs={'dropout': dropout_key})
    if sampled:  # program training's Gumbel noise at this step's scale
      kw['rngs'][GUMBEL_RNG] = jax.random.fold_in(dropout_key, 1)
      kw['gumbel_scale'] = gumbel_schedule(model.config, options.total_steps)(step)
    if objective is None and not pls:
      loss, _, above, tied = token_stats(model, params, batch, options.readout, options.key_mask, **kw)
    else:
      collections = (['intermediates'] if objective is not None else []) + ([PLS] if pls else [])
      (h, table), state = model.apply({'params': params}, batch['inputs'],
                                      batch['key_mask'] if options.key_mask else None, return_hidden=True,
                                      edges=batch.get('edges'), mutable=collections, **kw)
      loss, _, above, tied = hidden_stats(model, h, table, batch, options.readout)
    sums = metrics_lib.weighted_metrics(loss, above, tied, batch, options.top_ks)
    ce = sums['loss'] / jnp.maximum(sums['weight'], 1.0)
    total, extra = ce, {}
    if pls:  # per-layer supervision: the shared head's cross-entropy after every layer, weighted
      for l, w in enumerate(pls):
        layer_loss = hidden_stats(model, state[PLS][f'decoded_{l}'][0], table, batch, options.readout)[0]
        layer_ce = jnp.sum(layer_loss * batch['weights']) / jnp.maximum(sums['weight'], 1.0)
        total, extra[f'pls/layer_{l}'] = total + w * layer_ce, layer_ce
      extra['objective'] = total
    if options.readout_sparsity:  # the group lasso of program training (config.readout_sparsity)
      extra['readout_norm'] = transformer_program.readout_group_norm(
          transformer_program.readout_table(params['readout'], model.config),
          transformer_program.cardinality(model.config))
      total = total + options.readout_sparsity * extra['readout_norm']
      extra['objective'] = total
    if objective is None:
      return total, (ce, sums, extra)
    logits = readout_ops.logits(h, table)[..., :model.config.vocab_size]
    distilled, more = objective(ce, logits, state['intermediates'], batch)
    total = total + distilled - ce
    return total, (ce, sums, {**extra, 'objective': total, **more})

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
  # The failure surfaces where the loop next waits on a result: steps are dispatched ahead of it.
  return PeerLost(f'lost {who} of the {jax.process_count()} by step {step} ({cause}); {kept}: rerun every '
                  f'process with the same command to resume')


def check_task_fits(task: tasks.Task, model_config: ModelConfig) -> None:
  """Raises ValueError when the model cannot read the task's batches (too long, or no graph to read)."""
  if model_config.attention.relational and not task.has_edges:
    raise InputError(f"config.model.relational = True needs a graph task whose batches carry edges (task "
                     f"'graph_distance'); task {task.name!r} has none")
  if task.seq_len > model_config.max_len:
    raise InputError(f'task {task.name!r} has sequences of {task.seq_len} tokens but model.max_len is '
                     f'{model_config.max_len}; raise config.model.max_len or lower config.seq_len')


def readable_eval_splits(task: tasks.Task, model_config: ModelConfig) -> tuple[str, ...]:
  """The task's extra evaluation splits whose sequences the model reads. Longer ones (a RASP task's
  length_16 for a model of max_len 8) are left out of the final evaluation, with one line saying so, rather
  than failing it after training."""
  too_long = {s: task.split_length(s) for s in task.eval_splits if task.split_length(s) > model_config.max_len}
  if too_long and jax.process_index() == 0:
    print(f'not evaluated at the end: {", ".join(too_long)} (sequences of '
          f'{", ".join(str(n) for n in too_long.values())} tokens; model.max_len = {model_config.max_len})')
  return tuple(s for s in task.eval_splits if s not in too_long)


def task_init(state: TrainState, task: tasks.Task, model_config: ModelConfig, shardings) -> TrainState:
  """Freshly initialised parameters with the model's set counts (``model.position_counts``,
  ``model.symbol_counts``) and the task's own changes (``Task.initial_params``), if it has any."""
  counts = transformer_program.sets_counts(model_config)
  if not counts and jax.eval_shape(lambda params: task.initial_params(params, model_config), state.params) is None:
    return state

  def change(params):
    params = transformer_program.set_counts(params, model_config, task.symbol_ids()) if counts else params
    changed = task.initial_params(params, model_config)
    return params if changed is None else changed

  return jax.jit(lambda s: s.replace(params=change(s.params)), out_shardings=shardings, donate_argnums=0)(state)


@dataclasses.dataclass(frozen=True)
class Setup:
  """What a run needs before its state: the task, the model's typed config, the teacher (or None), the
  model, its optimiser and learning-rate schedule."""

  spec: config_lib.RunSpec
  task: tasks.Task
  model_config: ModelConfig
  teacher: Any
  model: nn.Module
  tx: optax.GradientTransformation
  schedule: optax.Schedule


def check_resumable(workdir: str, config: ml_collections.ConfigDict, model_config: ModelConfig,
                    task: tasks.Task) -> None:
  """Refuses, before anything is restored, moved or rewritten, to resume the checkpoints of ``workdir`` under a
  run that cannot continue them: another model, other data (a corpus edited or replaced since: the resumed run
  would no longer equal an uninterrupted one), another task, data_seed or seed, an option that changes the
  optimiser state's structure (e.g. clipping switched on or off), or other distillation settings; a restore
  that failed on such a mismatch would otherwise look like a corrupt checkpoint. Run files without a checkpoint
  hold nothing to resume: the run starts anew there (and says so where they were another model's). Work
  directories written before run.json recorded the data are not checked for it."""
  run_path, config_path = os.path.join(workdir, rundir.RUN_FILE), os.path.join(workdir, rundir.CONFIG_FILE)
  run = files.read_json(run_path) if os.path.isfile(run_path) else None
  resumes = bool(rundir.checkpoint_steps(workdir))
  where, fresh = f'work directory {workdir!r}', 'or choose a new --workdir'
  if run is not None:
    now = json.loads(json.dumps(model_config.flat()))  # tuples as lists, like the file
    changed = sorted(k for k in set(run['model']) | set(now) if run['model'].get(k) != now.get(k))
    details = ', '.join(f'{k}: {run["model"].get(k)!r} -> {now.get(k)!r}' for k in changed)
    if changed and resumes:
      raise InputError(f'{where} holds a run of a different model ({details}); resume it with its own config {fresh}')
    if changed and jax.process_index() == 0:
      print(f'{where} has the run files of another model ({details}) but no checkpoint; starting a new run there')
  if not resumes:
    return
  data, now = (run or {}).get('data'), task.data_fingerprint
  if now is not None and data is not None and data != now:
    raise InputError(f'{where} was trained on other data: its {rundir.RUN_FILE} records {data["tokens"]:,} tokens '
                     f'(sha256 {data["sha256"][:12]}...), the corpus this config reads gives {now["tokens"]:,} '
                     f'(sha256 {now["sha256"][:12]}...); resume with the corpus it was trained on (the text file '
                     f'or a token folder of it) {fresh}')
  if not os.path.isfile(config_path):
    return
  saved = files.read_json(config_path, rundir.CONFIG_HINT)
  optim.check_continues(where, saved, config)
  was, now_d = saved.get('distill') or {}, config.get('distill')
  now_d = now_d.to_dict() if now_d is not None else {}
  if (was.get('teacher') or '') == (now_d.get('teacher') or '') == '' or was == now_d:
    return
  changed = sorted(k for k in set(was) | set(now_d) if was.get(k) != now_d.get(k))
  raise InputError(f'{where} was trained with other distillation settings '
                   f'({", ".join(f"distill.{k}: {was.get(k)!r} -> {now_d.get(k)!r}" for k in changed)}); '
                   f'resume it with its own values {fresh}')


def setup(spec: config_lib.RunSpec, runs: list[tuple[str, ml_collections.ConfigDict]], vocab_shards: int = 1
          ) -> Setup:
  """The steps every trainer takes before its state, for one work directory or several (the seeds of
  ``symjax.train.seeds``, each with its own config): the task, the typed model config built once from the
  ConfigDict, every folder checked against them before any is written, the teacher, the model and its
  optimiser, from the run spec ``validate`` parsed."""
  config = spec.config
  for workdir, _ in runs:
    os.makedirs(workdir, exist_ok=True)
  task = tasks.get_task(config, runs[0][0])
  model_config = spec.model_for(len(task.vocab), task.causal, vocab_shards)
  check_task_fits(task, model_config)
  task.eval_splits = readable_eval_splits(task, model_config)
  for workdir, run_config in runs:
    check_resumable(workdir, run_config, model_config, task)
  teacher = distill.load_teacher(spec, task, model_config, runs[0][0]) if config_lib.distills(config) else None
  return Setup(spec, task, model_config, teacher, model_lib.build(model_config), make_optimizer(config),
               learning_rate_schedule(config))


def interactive_output() -> bool:
  """A terminal, or a Jupyter / Colab kernel (whose stderr is no TTY, yet shows tqdm's widget)."""
  if sys.stderr.isatty():
    return True
  ipython = sys.modules.get('IPython')
  shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, 'get_ipython') else None
  return shell is not None and hasattr(shell, 'kernel')


def compile_steps(config: ml_collections.ConfigDict, s: Setup, mesh, rng) -> tuple[CompiledRun, Any]:
  """The run's compiled steps, and ``step_at(i)``: the train step to take at step ``i`` — ``run.train_step``
  but in program training's soft phase (the first ``soft_steps``: the same parameters through the soft model)
  and its straight-through end (the last ``straight_steps``: through the model that trains the argmax program,
  not its relaxation). Call under `jax.set_mesh(mesh)`."""
  rules, options = tuple(map(tuple, config.sharding_rules)), StepOptions.of(config, s.task)
  objective = None
  if s.teacher is not None:  # stream-specific distillation from a frozen teacher (symjax.train.distill)
    objective = distill.make_objective(s.model_config, distill.teacher_on(mesh, s.teacher), s.spec)
  run = compile_run(s.model, s.tx, options, rng, mesh, rules, s.task.seq_len, objective)
  phase = lambda model_config: compile_run(model_lib.build(model_config), s.tx, options, rng, mesh, rules,
                                           s.task.seq_len, objective).train_step
  soft, straight = config.get('soft_steps', 0), config.get('straight_steps', 0)
  if soft:
    soft_step = phase(s.model_config.replace(hard=False, gumbel_scale=0.0, gumbel_scale_end=None))
    return run, lambda i: soft_step if i < soft else run.train_step
  if straight:  # the noise schedule runs on over the whole run: its scale is the argmax's noise at the end
    straight_step = phase(s.model_config.replace(relaxed=False, attention_noise=True))
    return run, lambda i: straight_step if i >= config.total_steps - straight else run.train_step
  return run, lambda i: run.train_step


def restore_latest(run: CompiledRun, workdir: str, keep: int, best_metric: str):
  """(manager, state): the latest checkpoint of ``workdir`` that passes its checks, or (None, None) when the
  folder holds none. A run that starts from nothing makes its manager at its first save."""
  if not rundir.checkpoint_steps(workdir):
    return None, None
  manager = rundir.checkpoint_manager(workdir, keep, best_metric)
  state = rundir.restore_first_valid(
      lambda step: finite(rundir.restore_state(manager, step, run.abstract_state), run.all_finite),
      sorted(manager.all_steps(), reverse=True), workdir)
  with rundir.quiet_orbax():
    manager.reload()  # forget what was moved aside
  if state is None and jax.process_index() == 0:
    print(f'WARNING: no checkpoint in {workdir!r} could be restored; training starts again from step 0',
          file=sys.stderr)
  return manager, state


@dataclasses.dataclass
class Seats:
  """The runs one training loop trains: one work directory per seed, every seed's state in one tree (with a
  leading seed axis where there are several, ``symjax.train.seeds``), and the compiled functions over it. A
  single run is the loop with one seat."""

  workdirs: list[str]
  configs: list[ml_collections.ConfigDict]   # each seat's config (its own seed)
  names: list[str]                           # each seat in messages: its work directory, or 'seed 3'
  step: Any                                  # (state, step) -> (state, metrics): the step's own batch(es)
  evaluate: Any                              # (params, split) -> each seat's metrics over the split
  all_finite: Any                            # params -> each seat's bool
  part: Any                                  # (tree, i) -> seat i's part of it
  managers: list                             # checkpoint managers (None until a seat's first save)
  state: Any
  start_step: int


class Progress:
  """What the loop records and tells the user: each logged step's metrics (with tokens/s and the learning
  rate) to every seat's metric writer, and on process 0 a progress bar on a terminal or in a notebook, else
  one line per logged step (a log file, nohup, CI); seeds trained together say one line per evaluation."""

  def __init__(self, seats: Seats, total_steps: int, bar: bool, tokens_per_step: int, schedule: optax.Schedule,
               verbose: bool = True):
    self.lead, self.total, self.started = jax.process_index() == 0, total_steps, time.time()
    self.one, self.verbose = len(seats.workdirs) == 1, verbose and jax.process_index() == 0
    self.writers = [rundir.MetricWriter(w, resume_step=seats.start_step) for w in seats.workdirs]
    self.tokens_per_step, self.schedule = tokens_per_step, schedule
    self.last_time, self.last_step, self.rate = time.time(), seats.start_step, 0.0
    self.bar = None
    if bar and interactive_output() and self.verbose:
      from tqdm.auto import tqdm  # a widget in notebooks, a text bar on terminals
      self.bar = tqdm(total=total_steps, initial=seats.start_step, dynamic_ncols=True)

  def say(self, text: str) -> None:
    if self.verbose:
      (self.bar.write if self.bar is not None else print)(text, **({} if self.bar is not None else {'flush': True}))

  def log(self, step: int, metrics: list[dict[str, float]], live: list[int]) -> None:
    now = time.time()
    self.rate = (step - self.last_step) * self.tokens_per_step / max(now - self.last_time, 1e-9)
    extra = {'tokens_per_second': self.rate, 'learning_rate': float(self.schedule(step))}
    self.last_time, self.last_step = now, step
    for i in live:
      self.writers[i].write(step, 'train', {**metrics[i], **extra})
    if not self.one:
      return
    if self.bar is not None:
      self.bar.set_postfix(loss=f"{metrics[0]['loss']:.4f}", tok_s=f'{self.rate:.0f}')
    else:
      self.say(f"step {step}/{self.total}: loss {metrics[0]['loss']:.4f}, {self.rate:,.0f} tokens/s, "
               f'{now - self.started:.1f} s')

  def first_step(self, loss) -> None:
    """How long compilation (or the cache) held the user up: said once the first step's loss exists."""
    if self.verbose and self.one:
      jax.block_until_ready(loss)
      self.say(f'first step done after {time.time() - self.started:.1f} s (compilation included)')

  def validated(self, step: int, validation: list[dict[str, float]], live: list[int]) -> None:
    for i in live:
      self.writers[i].write(step, 'validation', validation[i])
    if self.one:
      self.say(f'step {step}: validation ' + ' '.join(f'{k}={v:.4f}' for k, v in validation[0].items()))
      return
    mean = lambda k: np.mean([validation[i][k] for i in live] or [np.nan])
    self.say(f'step {step}: validation loss {mean("loss"):.4f} accuracy {mean("accuracy"):.4f} (mean of {len(live)} '
             f'seeds)' + (f', {self.rate:,.0f} tokens/s' if self.rate else ''))

  def reached(self, validation: dict[str, float], stop_at_accuracy: float) -> bool:
    """Whether the validation accuracy reached ``config.stop_at_accuracy`` (0: never), said when it did."""
    if not stop_at_accuracy or validation['accuracy'] < stop_at_accuracy:
      return False
    self.say(f'validation accuracy {validation["accuracy"]:.4f} >= config.stop_at_accuracy; stopping')
    return True

  def stepped(self) -> None:
    if self.bar is not None:
      self.bar.update(1)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def diverged(what: str, workdir: str, start_step: int, step: int, manager) -> TrainingDiverged:
  """The error for non-finite values. Right after a resume (no checkpoint saved since, which would be the
  one to blame instead) it names the checkpoint resumed from and how to resume from the one before."""
  if start_step == 0 or manager is None or max(manager.all_steps(), default=0) > start_step:
    return TrainingDiverged(f'{what}; the last good checkpoint is kept')
  resumed = os.path.join(rundir.CHECKPOINT_DIR, str(start_step))
  return TrainingDiverged(f'{what}, {step - start_step} steps after resuming from {resumed} in {workdir!r}; to '
                          f'resume from an earlier checkpoint, move {resumed} into {rundir.CORRUPT_DIR}/ and '
                          f'rerun the same command')


class Divergence:
  """Which seats' values stopped being finite, and when. A single run stops at once with a
  ``TrainingDiverged``; seeds trained together mark the seed and train the others on (its last good
  checkpoint kept, its ``final_metrics.json`` saying so)."""

  def __init__(self, seats: Seats):
    self.seats, self.at = seats, {}

  def live(self) -> list[int]:
    return [i for i in range(len(self.seats.workdirs)) if i not in self.at]

  def mark(self, i: int, what: str, step: int, detail: str = '') -> None:
    """Seat i's ``what`` ('non-finite parameters') found at ``step``; ``detail`` ends a single run's error."""
    if i in self.at:
      return
    if len(self.seats.workdirs) == 1:
      raise diverged(f'{what} at step {step}{detail}', self.seats.workdirs[0], self.seats.start_step, step,
                     self.seats.managers[0])
    self.at[i] = step
    print(f'WARNING: {self.seats.names[i]} diverged at step {step} ({what}); its last good checkpoint is kept',
          file=sys.stderr)


def announce(model_config: ModelConfig, params, task: tasks.Task, mesh, workdir: str, start_step: int) -> None:
  """The run's first lines (process 0): what trains, on what, where, and from which step."""
  if jax.process_index() != 0:
    return
  print(f'symjax: {model_config.kind} model, {sum(x.size for x in jax.tree.leaves(params)):,} parameters, task '
        f'{task.name!r} (vocabulary {len(task.vocab)}), mesh {dict(mesh.shape)}, workdir {workdir}')
  if start_step > 0:
    print(f'resuming from step {start_step}')


def evaluator(run: CompiledRun, task: tasks.Task, config: ml_collections.ConfigDict, put):
  """``evaluate(params, split)``: the metrics of ``params`` over every batch of the split."""
  return lambda params, split: metrics_lib.evaluate(run.eval_step, params, task.scored_batches(
      split, config.batch_size, config.data_seed), config.top_ks, put)


def close_files(writer: rundir.MetricWriter, manager, failure: BaseException | None) -> None:
  """Closes the metrics and finishes the checkpoint being saved. While a full disk is what stopped the run
  (``failure``), their own failure to flush is that same failure, not an error of its own."""
  with rundir.unless_full(failure):
    writer.close()
  if manager is not None:
    with rundir.unless_full(failure):
      manager.wait_until_finished()
    manager.close()


def final_metrics(seats: Seats, state, task: tasks.Task, validation: list[dict], out: Divergence, step: int
                  ) -> list[dict]:
  """Each seat's metrics of its final parameters on every split (the validation metrics of the last
  evaluation where there were some), or ``{'step', 'diverged'}`` for a seed whose parameters or metrics are
  not finite; a single run's such values are a ``TrainingDiverged``, and its final_metrics.json is left as it
  was."""
  kept = f'; {rundir.FINAL_FILE} is left as it was'
  for i, ok in enumerate(seats.all_finite(state.params)):
    if not ok:
      out.mark(i, 'non-finite parameters', step, kept)
  splits = ('train', 'validation', 'test', *task.eval_splits)
  per_split = {split: validation if split == 'validation' and validation else seats.evaluate(state.params, split)
               for split in splits}
  finals = []
  for i in range(len(seats.workdirs)):
    final = {split: per_split[split][i] for split in splits}
    if i not in out.at and not all(math.isfinite(v) for m in final.values() for v in m.values()):
      out.mark(i, 'non-finite final metrics', step, kept)
    finals.append({'step': step, 'diverged': out.at[i]} if i in out.at else {'step': step, **final})
  return finals


# ----------------------------------------------------------------------------------------------------------
# The training loop, for one run or several seeds.
# ----------------------------------------------------------------------------------------------------------
def train_seats(config: ml_collections.ConfigDict, s: Setup, seats: Seats, disk, bar: bool, verbose: bool
                ) -> list[dict]:
  """Trains every seat from its start step to ``config.total_steps``: each logged step's metrics, each
  evaluation's validation metrics and checkpoint, then each seat's final metrics, written to its work directory
  (``final_metrics.json``) and returned."""
  task, model_config, lead, one = s.task, s.model_config, jax.process_index() == 0, len(seats.workdirs) == 1
  progress = Progress(seats, config.total_steps, bar, len(seats.workdirs) * config.batch_size * task.seq_len,
                      s.schedule, verbose)
  out, managers = Divergence(seats), seats.managers
  state, start_step = seats.state, seats.start_step
  step, validation, run_files_written = start_step, [], False
  try:
    while step < config.total_steps:
      state, metrics = seats.step(state, step)
      step += 1
      disk.check()  # a save that found the disk full in the background stops the run here
      if step == start_step + 1:
        progress.first_step(metrics['loss'])
      if step % config.log_every_steps == 0 or step == config.total_steps:
        logged = [{k: float(v) for k, v in seats.part(jax.device_get(metrics), i).items()}
                  for i in range(len(seats.workdirs))]
        for i, m in enumerate(logged):
          if not all(math.isfinite(v) for v in m.values()):
            out.mark(i, 'non-finite training metrics', step, f': {m}')
        progress.log(step, logged, out.live())
      progress.stepped()
      if step % config.eval_every_steps == 0 or step == config.total_steps:
        for i, ok in enumerate(seats.all_finite(state.params)):
          if not ok:
            out.mark(i, 'non-finite parameters', step)
        validation = seats.evaluate(state.params, 'validation')
        progress.validated(step, validation, out.live())
        if not run_files_written:  # the folders now hold checkpoints this config trained
          for w, c in zip(seats.workdirs, seats.configs):
            rundir.save_run_files(w, c, task, model_config, start_step)
          run_files_written = True
        for i in out.live():
          managers[i] = managers[i] or rundir.checkpoint_manager(seats.workdirs[i], config.keep_checkpoints,
                                                                 config.best_metric)
          rundir.save_state(managers[i], step, seats.part(state, i), validation[i])
        if one and progress.reached(validation[0], config.stop_at_accuracy):
          break
  except BaseException as e:  # a divergence, an interrupt or a bug: finish what was being saved, then fail
    if mesh_lib.peer_failure(e):  # the save in flight waits on the lost process: not waited for
      for writer in progress.writers:
        writer.close()
      raise peer_lost(e, step, seats.workdirs[0]) from None
    for writer, manager in zip(progress.writers, managers):
      close_files(writer, manager, e)
    raise
  finally:
    progress.close()

  # --- Final evaluation of the final parameters; final_metrics.json is never replaced by non-finite ones.
  try:
    for manager in managers:
      if manager is not None:
        manager.wait_until_finished()
    finals = final_metrics(seats, state, task, validation, out, step)
    for writer, final in zip(progress.writers, finals):
      if 'test' in final:
        writer.write(step, 'test', final['test'])
  finally:
    for writer, manager in zip(progress.writers, managers):
      close_files(writer, manager, sys.exc_info()[1])  # the error in flight, if any
  if lead:
    if one and verbose:
      metrics_lib.print_table(f'final metrics at step {step}', {k: v for k, v in finals[0].items() if k != 'step'})
    for w, final in zip(seats.workdirs, finals):
      files.write_atomically(os.path.join(w, rundir.FINAL_FILE), json.dumps(final, indent=1))
  return finals


def one_run(config: ml_collections.ConfigDict, s: Setup, mesh, workdir: str) -> Seats:
  """A single run's seat: its compiled steps over the mesh, its state resumed from the latest valid checkpoint
  of ``workdir`` or initialised anew. Call under ``jax.set_mesh(mesh)``."""
  put = mesh_lib.batch_putter(mesh)
  rng = jax.random.key(config.seed)
  run, step_at = compile_steps(config, s, mesh, rng)
  manager, state = restore_latest(run, workdir, config.keep_checkpoints, config.best_metric)
  if state is None:
    state = task_init(run.init(rng), s.task, s.model_config, run.shardings)
  announce(s.model_config, state.params, s.task, mesh, workdir, int(state.step))

  def step(state, i):
    return step_at(i)(state, put(s.task.batch('train', i, config.batch_size, config.seed)))
  evaluate = evaluator(run, s.task, config, put)
  return Seats([workdir], [config], [workdir], step, lambda params, split: [evaluate(params, split)],
               lambda params: [bool(run.all_finite(params))], lambda tree, i: tree, [manager], state,
               int(state.step))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, dict[str, float]]:
  """Trains (or resumes) in ``workdir``; returns the final metrics per split."""
  # --- Config, processes and mesh.
  host.prepare(config.get('model', {}).get('kind'))
  spec = config_lib.validate(config)
  host.use_compilation_cache(config.compilation_cache_dir)
  mesh_lib.maybe_initialize_distributed(config.distributed)
  mesh = mesh_lib.make_mesh(config.mesh.data, config.mesh.vocab, config.batch_size)

  # --- The work directory, held by this run alone (symjax.run.lock) and stopped in one line when its file
  # system fills up; data, model and optimizer (every process builds the same global batches and keeps its
  # devices' rows); compiled steps and the state; the loop.
  with rundir.stops_when_full(workdir) as disk, lock.owned(workdir, jax.process_index() == 0), jax.set_mesh(mesh):
    s = setup(spec, [(workdir, config)], vocab_shards=mesh.shape[mesh_lib.VOCAB_AXIS])
    final = train_seats(config, s, one_run(config, s, mesh, workdir), disk, config.progress_bar, verbose=True)[0]
  return {k: v for k, v in final.items() if k != 'step'}
