"""Vocabulary-sized softmaxes without a [tokens × vocabulary] tensor: streamed, and sharded over vocabulary.

The vocabulary projection of "Symbolic Transformers" (eqs. 21-22), softmax(q E^(h)ᵀ) E^(h) per channel, is
cross-attention whose keys and values are both the embedding rows. Computed directly it materialises
[tokens × heads × vocabulary] (eq. 34: the paper's "prohibitively expensive" memory). Here it is streamed
over vocabulary chunks with an online softmax, and its backward pass recomputes each chunk from the saved
log-sum-exp, as memory-efficient attention does (FlashAttention-2's backward: D = rowsum(dO ∘ O),
dS = P ∘ (dP − D)). Keys and values are the same rows, so their gradients land in one buffer.

The same streaming gives the readout's log-sum-exp over the vocabulary, for the LM loss without
[tokens × vocabulary] logits, and the argmax / rank of the target for accuracy and top-k accuracy.

Every function takes ``axis_name``: inside ``jax.shard_map`` with the table split along that mesh axis,
each device streams over its own rows and the partial (max, sum, weighted sum) are combined with
pmax / psum (Megatron's vocabulary-parallel cross-entropy, applied also to the projection). Gradients
of the table stay local to their shard.

Shapes: q ``[tokens, heads, head_dim]``; table ``[vocab, heads, head_dim]``; lse ``[tokens, heads]``.
Accumulation is in float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array
NEG_INF = -jnp.inf


def _chunks(vocab: int, chunk: int) -> tuple[int, int]:
  """(number of chunks, chunk size). The last chunk is read at ``vocab - chunk`` and its rows already
  covered are masked, so the table is never padded or copied."""
  chunk = min(chunk, vocab)
  return -(-vocab // chunk), chunk


def _row_offset(table: Array, axis_name) -> Array | int:
  """Global index of this device's first table row: shards are contiguous blocks along ``axis_name``."""
  return 0 if axis_name is None else jax.lax.axis_index(axis_name) * table.shape[0]


def _chunk_at(table: Array, c: Array, chunk: int, offset=0, num_valid: int | None = None
              ) -> tuple[Array, Array, Array]:
  """Rows of chunk c, their first (local) row index, and which of them count: rows not in an earlier
  chunk, and (with ``num_valid``) whose global index is below it — padding rows never count."""
  vocab = table.shape[0]
  start = jnp.minimum(c * chunk, vocab - chunk)
  rows = jax.lax.dynamic_slice_in_dim(table, start, chunk, axis=0)
  index = start + jnp.arange(chunk)
  use = index >= c * chunk
  if num_valid is not None:
    use = use & (index + offset < num_valid)
  return rows, start, use


def _vma(x) -> frozenset:
  """The manual mesh axes x varies over (its shard_map type); empty outside shard_map."""
  aval = jax.typeof(x)
  mat = getattr(aval, 'mat', None)  # newer JAX keeps them here; older ones in `aval.vma`
  return frozenset(mat.varying if mat is not None else getattr(aval, 'vma', ()))


def _varying(tree, *refs):
  """Marks fresh arrays (scan carries) as varying over the mesh axes its inputs vary over, as
  `jax.shard_map`'s type checks require; a no-op outside shard_map."""
  axes = frozenset().union(*(_vma(r) for r in refs))
  def cast(x):
    missing = tuple(sorted(axes - _vma(x)))
    return jax.lax.pcast(x, missing, to='varying') if missing else x
  return jax.tree.map(cast, tree)


def _reduce_to(cotangent, primal):
  """Sums a cotangent over the mesh axes its primal was invariant (replicated) along."""
  extra = tuple(sorted(_vma(cotangent) - _vma(primal)))
  return jax.lax.psum(cotangent, extra) if extra else cotangent


def _combine(m, l, acc, axis_name):
  """Merges per-device partial softmax statistics along ``axis_name``."""
  if axis_name is None:
    return m, l, acc
  m_all = jax.lax.pmax(m, axis_name)
  scale = jnp.exp(m - m_all)
  l = jax.lax.psum(l * scale, axis_name)
  acc = None if acc is None else jax.lax.psum(acc * scale[..., None], axis_name)
  return m_all, l, acc


# ----------------------------------------------------------------------------------------------------------
# softmax(q Eᵀ) E per head, streamed.
# ----------------------------------------------------------------------------------------------------------
def _heads_first(rows: Array) -> Array:
  """``[rows, heads, dim]`` -> ``[heads, rows, dim]``: heads as the leading batch axis of every product."""
  return jnp.swapaxes(rows, 0, 1)


def _mix_forward(q: Array, table: Array, chunk: int, axis_name, num_valid):
  n_chunks, chunk = _chunks(table.shape[0], chunk)
  tokens, heads, dim = q.shape
  offset = _row_offset(table, axis_name)
  qh = _heads_first(q)                                                 # [h, n, d]

  def body(carry, c):
    m, l, acc = carry
    rows, _, use = _chunk_at(table, c, chunk, offset, num_valid)
    rows = _heads_first(rows)                                          # [h, c, d]
    s = jnp.einsum('hnd,hcd->hnc', qh, rows, preferred_element_type=jnp.float32)
    s = jnp.where(use, s, NEG_INF)
    m_new = jnp.maximum(m, s.max(-1))
    scale = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new[..., None])
    l = l * scale + p.sum(-1)
    acc = acc * scale[..., None] + jnp.einsum('hnc,hcd->hnd', p, rows.astype(jnp.float32))
    return (m_new, l, acc), None

  init = _varying((jnp.full((heads, tokens), NEG_INF, jnp.float32), jnp.zeros((heads, tokens), jnp.float32),
                   jnp.zeros((heads, tokens, dim), jnp.float32)), q, table)
  (m, l, acc), _ = jax.lax.scan(body, init, jnp.arange(n_chunks))
  m, l, acc = _combine(m, l, acc, axis_name)
  return _heads_first(acc / l[..., None]), _heads_first(m + jnp.log(l))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def softmax_mix(q: Array, table: Array, chunk: int = 1024, axis_name: str | None = None,
                num_valid: int | None = None) -> Array:
  """softmax(q_h E_hᵀ) E_h for every token and head, streamed over ``chunk`` rows at a time.

  q ``[tokens, heads, head_dim]`` (already divided by τ), table ``[vocab, heads, head_dim]`` (this
  device's shard under ``axis_name``); rows whose global index is ``>= num_valid`` are padding and get
  no weight. Returns ``[tokens, heads, head_dim]`` in float32.
  """
  return _mix_forward(q, table, chunk, axis_name, num_valid)[0]


def _mix_fwd(q, table, chunk, axis_name, num_valid):
  out, lse = _mix_forward(q, table, chunk, axis_name, num_valid)
  return out, (q, table, out, lse)


def _mix_bwd(chunk, axis_name, num_valid, residuals, d_out):
  q, table, out, lse = residuals
  n_chunks, chunk = _chunks(table.shape[0], chunk)
  offset = _row_offset(table, axis_name)
  tokens = q.shape[0]
  d_out = d_out.astype(jnp.float32)
  delta = _heads_first(jnp.sum(d_out * out, -1)[..., None])[..., 0]  # D = rowsum(dO ∘ O)  [h, n]
  qh, d_out_h, lse_h = _heads_first(q.astype(jnp.float32)), _heads_first(d_out), _heads_first(lse[..., None])
  # E is both key and value, so dE = dSᵀ q + Pᵀ dO is one product over [dS | P] and [q | dO].
  q_and_d_out = jnp.concatenate([qh, d_out_h], axis=1)                 # [h, 2n, d]

  def body(carry, c):
    dq, dtable = carry
    rows, start, use = _chunk_at(table, c, chunk, offset, num_valid)
    rows = _heads_first(rows.astype(jnp.float32))                      # [h, c, d]
    s_and_dp = jnp.einsum('hnd,hcd->hnc', q_and_d_out, rows)           # [q | dO] Eᵀ in one product
    s, dp = s_and_dp[:, :tokens], s_and_dp[:, tokens:]                 # logits, and dP = dO Eᵀ
    p = jnp.where(use, jnp.exp(s - lse_h), 0.0)                        # P, recomputed
    ds = p * (dp - delta[..., None])                                   # dS = P ∘ (dP − D)
    dq = dq + jnp.einsum('hnc,hcd->hnd', ds, rows)
    d_rows = jnp.einsum('hnc,hnd->chd', jnp.concatenate([ds, p], axis=1), q_and_d_out)
    # Accumulated in place: rows masked in this chunk add zero.
    current = jax.lax.dynamic_slice_in_dim(dtable, start, chunk, axis=0)
    dtable = jax.lax.dynamic_update_slice_in_dim(dtable, current + d_rows, start, axis=0)
    return (dq, dtable), None

  init = _varying((jnp.zeros(qh.shape, jnp.float32), jnp.zeros(table.shape, jnp.float32)), q, table, d_out)
  (dq, dtable), _ = jax.lax.scan(body, init, jnp.arange(n_chunks))
  # Each vocabulary shard saw only its rows: sum dq over them. The table gradient stays on its shard
  # (summed only over the batch shards that shared it).
  return (_reduce_to(_heads_first(dq), q).astype(q.dtype),
          _reduce_to(dtable, table).astype(table.dtype))


softmax_mix.defvjp(_mix_fwd, _mix_bwd)


# ----------------------------------------------------------------------------------------------------------
# log Σ_v exp(h · E_v), streamed: the readout's normaliser.
# ----------------------------------------------------------------------------------------------------------
def _lse_forward(h: Array, table: Array, chunk: int, axis_name, num_valid):
  n_chunks, chunk = _chunks(table.shape[0], chunk)
  offset = _row_offset(table, axis_name)

  def body(carry, c):
    m, l = carry
    rows, _, new = _chunk_at(table, c, chunk, offset, num_valid)
    s = jnp.where(new, jnp.einsum('nd,cd->nc', h, rows, preferred_element_type=jnp.float32), NEG_INF)
    m_new = jnp.maximum(m, s.max(-1))
    l = l * jnp.exp(m - m_new) + jnp.exp(s - m_new[:, None]).sum(-1)
    return (m_new, l), None

  init = _varying((jnp.full(h.shape[:1], NEG_INF, jnp.float32), jnp.zeros(h.shape[:1], jnp.float32)),
                  h, table)
  (m, l), _ = jax.lax.scan(body, init, jnp.arange(n_chunks))
  m, l, _ = _combine(m, l, None, axis_name)
  return m + jnp.log(l)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def logsumexp(h: Array, table: Array, chunk: int = 4096, axis_name: str | None = None,
              num_valid: int | None = None) -> Array:
  """log Σ_v exp(h_n · E_v) for h ``[tokens, d]`` and table ``[vocab, d]``; ``[tokens]`` float32."""
  return _lse_forward(h, table, chunk, axis_name, num_valid)


def _lse_fwd(h, table, chunk, axis_name, num_valid):
  lse = _lse_forward(h, table, chunk, axis_name, num_valid)
  return lse, (h, table, lse)


def _lse_bwd(chunk, axis_name, num_valid, residuals, g):
  h, table, lse = residuals
  n_chunks, chunk = _chunks(table.shape[0], chunk)
  offset = _row_offset(table, axis_name)
  hf = h.astype(jnp.float32)

  def body(carry, c):
    dh, dtable = carry
    rows, start, new = _chunk_at(table, c, chunk, offset, num_valid)
    rows = rows.astype(jnp.float32)
    p = jnp.where(new, jnp.exp(jnp.einsum('nd,cd->nc', hf, rows) - lse[:, None]), 0.0) * g[:, None]
    dh = dh + p @ rows
    current = jax.lax.dynamic_slice_in_dim(dtable, start, chunk, axis=0)
    dtable = jax.lax.dynamic_update_slice_in_dim(dtable, current + p.T @ hf, start, axis=0)
    return (dh, dtable), None

  init = _varying((jnp.zeros(h.shape, jnp.float32), jnp.zeros(table.shape, jnp.float32)), h, table, g)
  (dh, dtable), _ = jax.lax.scan(body, init, jnp.arange(n_chunks))
  return _reduce_to(dh, h).astype(h.dtype), _reduce_to(dtable, table).astype(table.dtype)


logsumexp.defvjp(_lse_fwd, _lse_bwd)


def argmax_and_rank(h: Array, table: Array, targets: Array, chunk: int = 4096,
                    axis_name: str | None = None, num_valid: int | None = None
                    ) -> tuple[Array, Array, Array]:
  """The argmax over the vocabulary of h Eᵀ, and the target's rank: how many logits exceed the target's,
  and how many equal it (the target included). No gradient; ``[tokens]`` int32 each.

  Two streamed passes: the first reads each target's logit from the same chunk products the second
  compares against, so a target never outranks itself by rounding.
  """
  n_chunks, chunk = _chunks(table.shape[0], chunk)
  tokens = h.shape[0]
  offset = _row_offset(table, axis_name)

  def logits(c):
    rows, start, new = _chunk_at(table, c, chunk, offset, num_valid)
    s = jnp.einsum('nd,cd->nc', h, rows, preferred_element_type=jnp.float32)
    return jnp.where(new, s, NEG_INF), start + offset, new

  def target_pass(target_logit, c):
    s, start, new = logits(c)
    local = targets - start
    hit = (local >= 0) & (local < chunk)
    hit = hit & jnp.take(new, jnp.clip(local, 0, chunk - 1))
    value = jnp.take_along_axis(s, jnp.clip(local, 0, chunk - 1)[:, None], -1)[:, 0]
    return jnp.where(hit, value, target_logit), None

  target_logit, _ = jax.lax.scan(target_pass, _varying(jnp.full((tokens,), NEG_INF, jnp.float32), h, table,
                                                      targets), jnp.arange(n_chunks))
  if axis_name is not None:
    target_logit = jax.lax.pmax(target_logit, axis_name)

  def rank_pass(carry, c):
    best, best_idx, above, tied = carry
    s, start, _ = logits(c)
    idx = jnp.argmax(s, -1)
    val = jnp.take_along_axis(s, idx[:, None], -1)[:, 0]
    best_idx = jnp.where(val > best, start + idx, best_idx)
    above = above + jnp.sum(s > target_logit[:, None], -1)
    tied = tied + jnp.sum(s == target_logit[:, None], -1)
    return (jnp.maximum(best, val), best_idx, above, tied), None

  zeros = jnp.zeros((tokens,), jnp.int32)
  init = _varying((jnp.full((tokens,), NEG_INF, jnp.float32), zeros, zeros, zeros), h, table, targets)
  (best, best_idx, above, tied), _ = jax.lax.scan(rank_pass, init, jnp.arange(n_chunks))
  if axis_name is not None:
    best_all = jax.lax.pmax(best, axis_name)
    best_idx = jax.lax.pmin(jnp.where(best == best_all, best_idx, jnp.iinfo(jnp.int32).max), axis_name)
    above, tied = jax.lax.psum(above, axis_name), jax.lax.psum(tied, axis_name)
  return best_idx, above, tied


# ----------------------------------------------------------------------------------------------------------
# Mesh-aware entry points. Under `jax.set_mesh` with a 'vocab' axis of size > 1, the table is split along
# it and each function runs under `jax.shard_map`; the batch (leading) axis is split along 'data'.
# ----------------------------------------------------------------------------------------------------------
from symjax.system.mesh import DATA_AXIS, VOCAB_AXIS  # noqa: E402  (re-exported: the entry points' axes)


def _vocab_mesh():
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or VOCAB_AXIS not in mesh.axis_names or mesh.shape[VOCAB_AXIS] == 1:
    return None
  return mesh


def sharded(fn, n_batch_args: int, n_out: int):
  """``fn(*batch_args, table, axis_name)`` run per vocabulary shard when a vocab mesh is active."""
  mesh = _vocab_mesh()
  if mesh is None:
    return lambda *args: fn(*args, None)
  P = jax.sharding.PartitionSpec
  batch = P(DATA_AXIS) if DATA_AXIS in mesh.axis_names else P()
  out = batch if n_out == 1 else (batch,) * n_out
  return jax.shard_map(lambda *args: fn(*args, VOCAB_AXIS),
                       in_specs=(batch,) * n_batch_args + (P(VOCAB_AXIS),), out_specs=out)


def vocab_mix(q: Array, table: Array, chunk: int, num_valid: int | None = None) -> Array:
  """softmax(q_h E_hᵀ) E_h, q ``[tokens, heads, head_dim]``, table ``[vocab, heads, head_dim]``."""
  return sharded(lambda q, t, axis: softmax_mix(q, t, chunk, axis, num_valid), 1, 1)(q, table)
