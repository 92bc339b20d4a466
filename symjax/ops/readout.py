"""The readout and its loss: logits h Eᵀ over the vocabulary, and the per-token statistics every metric is
built from (cross-entropy, argmax, the target's rank), either from the full logits or streamed over
vocabulary chunks (``symjax.ops.streamed``) without a ``[tokens, vocab]`` tensor.

Shapes: h ``[tokens, d]``; table ``[vocab, d]``; targets ``[tokens]`` int.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from symjax.ops.streamed import NEG_INF, _row_offset, argmax_and_rank, logsumexp, sharded

Array = jax.Array


def logit_stats(logits: Array, targets: Array) -> tuple[Array, Array, Array, Array]:
  """(loss, argmax, #logits above the target's, #equal to it) from logits ``[..., vocab]``: the one place
  where the transformers' direct readout and the baselines (n-gram, uniform) are scored."""
  target_logit = jnp.take_along_axis(logits, targets[..., None], -1)
  loss = jax.nn.logsumexp(logits, -1) - target_logit[..., 0]
  return (loss, jnp.argmax(logits, -1).astype(jnp.int32), jnp.sum(logits > target_logit, -1).astype(jnp.int32),
          jnp.sum(logits == target_logit, -1).astype(jnp.int32))


def readout_stats(h: Array, table: Array, targets: Array, chunk: int, num_valid: int | None = None
                  ) -> tuple[Array, Array, Array, Array]:
  """Cross-entropy of ``targets`` under logits h Eᵀ, the argmax, and how many logits are above and equal
  to the target's; each ``[tokens]``.

  h ``[tokens, d]``, table ``[vocab, d]``, targets ``[tokens]`` int. Differentiable in h and the table
  through the loss only.
  """
  def local(h, targets, t, axis):
    lse = logsumexp(h, t, chunk, axis, num_valid)
    row = targets - _row_offset(t, axis)
    inside = (row >= 0) & (row < t.shape[0])
    target_logit = jnp.where(inside, jnp.einsum('nd,nd->n', h, t[jnp.clip(row, 0, t.shape[0] - 1)],
                                                preferred_element_type=jnp.float32), 0.0)
    if axis is not None:
      target_logit = jax.lax.psum(target_logit, axis)
    prediction, above, tied = argmax_and_rank(jax.lax.stop_gradient(h), jax.lax.stop_gradient(t), targets,
                                              chunk, axis, num_valid)
    return lse - target_logit, prediction, above, tied

  return sharded(local, 2, 4)(h, targets, table)


@jax.custom_vjp
def readout_logits(h: Array, table: Array) -> Array:
  """h Eᵀ ``[tokens, vocab]`` in float32 from h ``[tokens, d]`` and E ``[vocab, d]`` of the compute dtype.

  The backward pass rounds the logits' cotangent to the compute dtype before its two products, as every
  other product of a bfloat16 backward pass does; without it a float32 cotangent against bfloat16 operands
  promotes the step's two largest products to float32. For float32 operands this is exactly autodiff's
  gradient.
  """
  return jnp.einsum('nd,vd->nv', h, table, preferred_element_type=jnp.float32)


def _readout_logits_fwd(h, table):
  return readout_logits(h, table), (h, table)


def _readout_logits_bwd(res, g):
  h, table = res
  g = g.astype(h.dtype)
  dh = jnp.einsum('nv,vd->nd', g, table, preferred_element_type=jnp.float32).astype(h.dtype)
  dtable = jnp.einsum('nv,nd->vd', g, h, preferred_element_type=jnp.float32).astype(table.dtype)
  return dh, dtable


readout_logits.defvjp(_readout_logits_fwd, _readout_logits_bwd)


def logits(h: Array, table: Array) -> Array:
  """The readout: logits h Eᵀ ``[..., vocab]`` in float32 from h ``[..., d]``, with the table in h's compute
  dtype and ``readout_logits``' backward pass. The one place the model, the trainer and the losses form
  logits."""
  out = readout_logits(h.reshape(-1, h.shape[-1]), table.astype(h.dtype))
  return out.reshape(*h.shape[:-1], table.shape[0])


def direct_readout_stats(h: Array, table: Array, targets: Array, num_valid: int | None = None
                         ) -> tuple[Array, Array, Array, Array]:
  """The same as ``readout_stats`` through the full ``[tokens, vocab]`` logits."""
  return _direct_stats(h, table, targets, num_valid)


def one_pass_stats(logits: Array, targets: Array) -> tuple[Array, Array, Array, Array, Array]:
  """``logit_stats`` of logits ``[tokens, vocab]``, and their log-sum-exp, with one read of the logits
  for the loss and both rank counts (the argmax, which the training step drops, is a pass of its own).

  ``jax.nn.logsumexp`` reads the logits twice, for their maximum and then for the sum of exponentials,
  and the counts were a third pass; at a large vocabulary each read is the step's largest tensor. The
  reduction here carries (maximum m, Σ exp(x - m), #above, #tied) and merges two partial sums with the
  online softmax's rescaling. Not differentiable: ``_direct_stats`` writes its gradient.
  """
  target_logit = jnp.take_along_axis(logits, targets[:, None], -1)

  def merge(a, b):
    (m1, s1, above1, tied1), (m2, s2, above2, tied2) = a, b
    # Equal maxima (two -inf padding rows included) scale nothing; a NaN spreads to m and s.
    decay = jnp.exp(jnp.where(m1 == m2, 0.0, -jnp.abs(m1 - m2)))
    s = jnp.where(m1 >= m2, s1 + s2 * decay, s1 * decay + s2)
    return jnp.maximum(m1, m2), s, above1 + above2, tied1 + tied2

  operands = (logits, jnp.ones_like(logits), (logits > target_logit).astype(jnp.int32),
              (logits == target_logit).astype(jnp.int32))
  init = (jnp.float32(-jnp.inf), jnp.float32(0), jnp.int32(0), jnp.int32(0))
  peak, total, above, tied = jax.lax.reduce(operands, init, merge, (1,))
  lse = peak + jnp.log(total)
  return lse - target_logit[:, 0], jnp.argmax(logits, -1).astype(jnp.int32), above, tied, lse


def two_pass_stats(logits: Array, targets: Array) -> tuple[Array, Array, Array, Array, Array]:
  """``one_pass_stats`` as ``logit_stats`` sums them: the maximum, then the exponentials, then the counts."""
  loss, prediction, above, tied = logit_stats(logits, targets)
  return loss, prediction, above, tied, loss + jnp.take_along_axis(logits, targets[:, None], -1)[:, 0]


def loss_stats(logits: Array, targets: Array) -> tuple[Array, Array, Array, Array, Array]:
  """The direct loss's statistics and log-sum-exp, summed the way that is faster on the platform the step is
  compiled for: in one pass on an NVIDIA GPU, where each pass is a read of the float32 logits from the
  device's memory; in two passes elsewhere, where XLA:CPU's loop for the merged reduction was the slower
  (``docs/performance.md``, "The loss's statistics in one pass"). ROCm and TPU keep the two passes: not
  measured there."""
  return jax.lax.platform_dependent(logits, targets, cuda=one_pass_stats, default=two_pass_stats)


def _valid_logits(h: Array, table: Array, num_valid: int | None) -> Array:
  scores = jnp.einsum('nd,vd->nv', h, table, preferred_element_type=jnp.float32)
  if num_valid is not None and num_valid < table.shape[0]:
    scores = jnp.where(jnp.arange(table.shape[0]) < num_valid, scores, NEG_INF)
  return scores


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _direct_stats(h: Array, table: Array, targets: Array, num_valid: int | None):
  """``logit_stats`` of h Eᵀ with the cross-entropy's gradient written out: the backward pass reads the
  float32 logits once and writes (softmax - one-hot) × the loss's cotangent in the compute dtype, where
  autodiff wrote the float32 softmax gradient and then rounded it in a second pass over the largest tensor
  of the step. For float32 operands it is autodiff's gradient to rounding (the same formula, its operations
  in another order: a few float32 ulps apart); the statistics other than the loss carry none."""
  return loss_stats(_valid_logits(h, table, num_valid), targets)[:4]


def _direct_stats_fwd(h, table, targets, num_valid):
  scores = _valid_logits(h, table, num_valid)
  *stats, lse = loss_stats(scores, targets)
  return tuple(stats), (h, table, targets, scores, lse)


def _direct_stats_bwd(num_valid, res, cotangents):
  h, table, targets, scores, lse = res
  g = cotangents[0].astype(jnp.float32)[:, None]
  onehot = jnp.arange(table.shape[0]) == targets[:, None]
  dscores = ((jnp.exp(scores - lse[:, None]) - onehot) * g).astype(h.dtype)
  dh = jnp.einsum('nv,vd->nd', dscores, table, preferred_element_type=jnp.float32).astype(h.dtype)
  dtable = jnp.einsum('nv,nd->vd', dscores, h, preferred_element_type=jnp.float32).astype(table.dtype)
  return dh, dtable, None


_direct_stats.defvjp(_direct_stats_fwd, _direct_stats_bwd)
