"""Stream-specific distillation ("Symbolic Transformers", Kerce & Fox 2025, §8.2): a student learns from a
trained teacher through its logits and through stream-matched hidden states.

The student (any kind) trains with the usual trainer; ``config.distill.teacher`` names the teacher's work
directory, and the step's objective becomes

  label_weight · CE(student, targets)
  + logits_weight · T² · KL(softmax(teacher / T) ‖ softmax(student / T))
  + Σ_s  w_s · mean over layers l of  ‖rms(S_s^l) − rms(T_s^{m(l)})‖² / d_model

over the task's scored tokens. s runs over the streams of ``config.distill.streams`` (``'x_t:1,x_e:1'``):

- ``x_t``: the token stream. A two-stream model's X_t^l; for a standard model the part of its residual
  stream its attention wrote: x^0 + Σ_{k≤l} attention updates.
- ``x_e``: the embedding stream. A two-stream model's X_e^l; for a standard model Σ_{k≤l} FFN updates.
- ``x``: the whole hidden state X_t^l + X_e^l (the standard model's residual stream).

A standard teacher's residual stream is the sum of what its attention and its FFNs wrote, so the same split
gives a Token-Factored or Symbolic student "symbolic reasoning demonstrations" for X_t (what attention
moves between positions) and "contextual knowledge" for X_e (what the FFNs add), as §8.2 proposes.
Student layer l (1-based) is matched to teacher layer m(l) = round(l · L_teacher / L_student). ``rms``
divides each token's vector by its root mean square, so streams of different scales compare; it needs
equal ``d_model`` (the error says so otherwise). The teacher is frozen: it runs inside the step, under
``stop_gradient``, on the same batch. The logit loss needs the full ``[tokens, vocabulary]`` logits of both
models, so a distilled step forms them even with ``config.readout = 'streamed'``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp

from symjax import tasks
from symjax.model import ModelConfig
from symjax.model import intermediates as names
from symjax.run import workdir as rundir
from symjax.system import files
from symjax.system.errors import InputError
from symjax.train import config as config_lib


def layer_streams(cfg: ModelConfig, inter) -> list[dict[str, jax.Array]]:
  """{'x_t', 'x_e', 'x'} after each layer l = 1..L (``[batch, time, d_model]``), from the sown
  intermediates of one forward pass (see ``symjax.model``)."""
  if cfg.kind == 'lstm':
    raise InputError("model.kind 'lstm' has no streams to distil; use distill.streams = '' (logits only)")
  return names.streams(cfg.kind, cfg.num_layers, inter)[1:]


def matched_layer(l: int, student_layers: int, teacher_layers: int) -> int:
  """Teacher layer (1-based) for student layer l (1-based): round(l · L_t / L_s), at least 1."""
  return max(1, min(teacher_layers, int(round(l * teacher_layers / student_layers))))


def _rms(x: jax.Array) -> jax.Array:
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def soft_cross_entropy(student_logits, teacher_logits, temperature: float) -> jax.Array:
  """T² · KL(softmax(teacher / T) ‖ softmax(student / T)) per token, ``[batch, time]``."""
  t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature)
  s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature)
  return temperature ** 2 * jnp.sum(jnp.exp(t) * (t - s), axis=-1)


def stream_distance(student, teacher) -> jax.Array:
  """Mean squared distance of the RMS-normalised vectors, per token: ``[batch, time]``."""
  return jnp.mean(jnp.square(_rms(student) - _rms(teacher)), axis=-1)


class Teacher:
  """A trained work directory, frozen, that scores the student's batches."""

  def __init__(self, workdir: str, which: str | int = 'best'):
    self.workdir = workdir
    loaded = rundir.load(workdir, which)
    self.model, self.params, self.config = loaded.model, loaded.params, loaded.model_config
    self.task, self.tokenizer, self.step = loaded.task, loaded.tokenizer, loaded.step

  def outputs(self, batch) -> tuple[jax.Array, list[dict[str, jax.Array]]]:
    """Teacher logits ``[batch, time, vocab]`` and its layer streams, without gradients."""
    logits, state = self.model.apply({'params': self.params}, batch['inputs'], batch['key_mask'],
                                     edges=batch.get('edges'), mutable=['intermediates'])
    streams = layer_streams(self.config, state['intermediates']) if self.config.kind != 'lstm' else []
    return jax.lax.stop_gradient((logits, streams))


def load_teacher(spec: config_lib.RunSpec, task: tasks.Task, student: ModelConfig, workdir: str) -> Teacher:
  """The teacher of ``config.distill.teacher``, checked against the student's task, vocabulary and shape;
  a mismatch is a one-line error naming both sides."""
  d = spec.config.distill
  path = os.path.expanduser(d.teacher)
  if not os.path.isdir(path):
    raise FileNotFoundError(f'config.distill.teacher: no work directory {d.teacher!r}; give the --workdir '
                            f'of a finished training run')
  if os.path.abspath(path) == os.path.abspath(workdir):
    raise InputError('config.distill.teacher is the student\'s own --workdir; give the teacher\'s work directory')
  teacher = Teacher(path, config_lib.checkpoint_choice(str(d.teacher_checkpoint), 'config.distill.teacher_checkpoint'))
  if teacher.task != task.name:
    raise InputError(f'config.distill.teacher {d.teacher!r} was trained on task {teacher.task!r}, the student '
                     f'trains on {task.name!r}; distil from a teacher of the same task')
  teacher_vocab = files.read_json(os.path.join(path, tasks.VOCAB_FILE))
  student_vocab = tasks.vocab_json(task)
  if json.loads(json.dumps(student_vocab)) != teacher_vocab:
    raise InputError(f'config.distill.teacher {d.teacher!r} has another vocabulary than the student\'s task '
                     f'({teacher.config.vocab_size} vs {len(task.vocab)} tokens, or the same tokens in another '
                     f'order); use a teacher trained on the same data with the same tokenizer')
  if teacher.config.vocab_size != student.vocab_size:
    raise InputError(f'config.distill.teacher has {teacher.config.vocab_size} output tokens, the student '
                     f'{student.vocab_size}')
  if task.seq_len > teacher.config.max_len:
    raise InputError(f'config.distill.teacher reads at most {teacher.config.max_len} tokens (its model.max_len); '
                     f'the student trains on {task.seq_len}')
  if spec.streams:
    for side, cfg in (('teacher', teacher.config), ('student', student)):
      if cfg.kind == 'lstm':
        raise InputError(f"config.distill.streams: the {side} is an LSTM, which has no streams; set "
                         f"config.distill.streams = '' (logits only)")
    if teacher.config.d_model != student.d_model:
      raise InputError(f'config.distill.streams needs equal d_model in teacher ({teacher.config.d_model}) and '
                       f"student ({student.d_model}); match them or set config.distill.streams = ''")
  return teacher


def make_objective(student: ModelConfig, teacher: Teacher, spec: config_lib.RunSpec
                   ) -> Callable[..., tuple[jax.Array, dict[str, jax.Array]]]:
  """``objective(ce, logits, inter, batch) -> (loss, metrics)``: ce is the student's mean label loss,
  logits ``[batch, time, vocab]`` and inter its sown intermediates on ``batch``."""
  d, streams = spec.config.distill, {s: float(w) for s, w in spec.streams.items()}

  def objective(ce, logits, inter, batch):
    weights = batch['weights']
    mean = lambda per_token: jnp.sum(per_token * weights) / jnp.maximum(jnp.sum(weights), 1.0)
    t_logits, t_streams = teacher.outputs(batch)
    kl = mean(soft_cross_entropy(logits, t_logits, d.temperature))
    total = d.label_weight * ce + d.logits_weight * kl
    metrics = {'distill/kl': kl}
    if streams:
      s_streams = layer_streams(student, inter)
      for name, w in streams.items():
        dist = jnp.mean(jnp.stack([
            mean(stream_distance(s_streams[l - 1][name],
                                 t_streams[matched_layer(l, student.num_layers, teacher.config.num_layers) - 1][name]))
            for l in range(1, student.num_layers + 1)]))
        metrics[f'distill/{name}'] = dist
        total = total + w * dist
    return total, metrics

  return objective


def teacher_on(mesh, teacher: Teacher) -> Any:
  """The teacher's parameters replicated over ``mesh`` (the student's steps read them as constants)."""
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  teacher.params = jax.device_put(teacher.params, replicated)
  return teacher
