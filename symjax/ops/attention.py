"""Attention kernels: the computations behind ``symjax.model.attention.Attention``, apart from the module.

Every kernel computes softmax(q kᵀ / sqrt(d) + bias) v over the allowed keys ("Symbolic Transformers",
Kerce & Fox 2025, eqs. 7-12, and the standard transformer alike); they differ in how:
- ``dot_product_attention``: the explicit form, every score materialised (portable; the reference).
- ``fused_attention``: ``jax.nn.dot_product_attention`` (XLA's or cuDNN's fused kernel).
- ``blocked_attention``: only the (query block, key block) pairs a static mask allows (sliding windows).
- ``relational_logits``: the scores of relational attention, with edge terms per pair.

Shapes: ``[batch, time, heads, head_dim]`` for queries, keys and values; ``[batch, heads, q_time, k_time]``
for attention weights.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from symjax.system.errors import InputError

Array = jax.Array


def softmax_over_allowed(logits: Array, mask: Array | None) -> Array:
  """Softmax over the last axis where ``mask`` holds; a row with no allowed key gets zeros, not NaN.

  Written out (exp(x − max) / Σ, as ``jax.nn.softmax`` computes it, the max held constant for the
  gradient) so that the masked row takes one max and one sum: ``jax.nn.softmax`` after a masked max would
  take the max again, which costs as much as the sum at a small model's attention."""
  if mask is None:
    return jax.nn.softmax(logits, axis=-1)
  logits = jnp.where(mask, logits, -jnp.inf)
  row_max = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  unnormalised = jnp.exp(logits - jnp.where(jnp.isfinite(row_max), row_max, 0.0))  # 0 where masked
  total = jnp.sum(unnormalised, axis=-1, keepdims=True)
  return unnormalised / jnp.where(total > 0.0, total, 1.0)


def dot_product_attention(q: Array, k: Array, v: Array, bias: Array | None, mask: Array | None
                          ) -> tuple[Array, Array]:
  """softmax(q kᵀ / sqrt(d) + bias) v over allowed keys.

  Args:
    q: ``[batch, q_time, heads, head_dim]``.
    k: ``[batch, k_time, heads, head_dim]``.
    v: ``[batch, k_time, heads, head_dim]``, the same shape as ``k``.
    bias: broadcastable to ``[batch, heads, q_time, k_time]``, or None.
    mask: boolean, broadcastable to ``[batch, heads, q_time, k_time]``; False removes a key. Or None.

  Returns:
    The output ``[batch, q_time, heads, head_dim]`` and the weights ``[batch, heads, q_time, k_time]``
    (float32). A query with no allowed key gets all-zero weights rather than NaN.
  """
  logits = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
  logits = logits / jnp.sqrt(jnp.float32(q.shape[-1]))
  if bias is not None:
    logits = logits + bias
  weights = softmax_over_allowed(logits, mask)
  out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)
  return out, weights


# Implementations of dense attention (config ``model.attention_impl``). 'explicit' is the einsum above,
# the only one that returns the weights; 'xla' and 'cudnn' are ``jax.nn.dot_product_attention`` with that
# implementation ('cudnn': cuDNN's fused flash attention, NVIDIA GPUs, 16-bit inputs). The fused ones are
# used where no weights are read (training and evaluation steps); a model whose intermediates are
# collected, or that drops attention weights out, computes its attention explicitly whatever the setting.
ATTENTION_IMPLS = ('explicit', 'xla', 'cudnn')


def require_gpu(field: str, value: str, portable: tuple[str, ...]) -> None:
  """cuDNN kernels exist only on NVIDIA GPUs: a clear error elsewhere, at trace time."""
  if jax.default_backend() != 'gpu':
    raise InputError(f"{field}={value!r} needs an NVIDIA GPU (cuDNN), but this run's backend is "
                     f"{jax.default_backend()!r}; the portable choices are {list(portable)}")


def fused_attention(q: Array, k: Array, v: Array, bias: Array | None, static: np.ndarray,
                    key_mask: Array | None, implementation: str, slopes: Array | None = None) -> Array:
  """``dot_product_attention``'s output through ``jax.nn.dot_product_attention`` (no weights kept).

  ``static`` is the ``[heads or 1, q_time, k_time]`` mask matrix: a plain causal one becomes
  ``is_causal`` (cuDNN then skips the blocks above the diagonal), any other is passed as a mask.
  ``slopes`` ``[heads]`` adds the ALiBi bias ``-slopes_h |i - j|`` (with ``bias`` None); under a mask that
  allows no key after its query it goes into the products instead (``alibi_in_products``).
  The scale is 1/sqrt(head_dim) of the queries, as in ``dot_product_attention``. ``v`` may be wider than
  ``q``, up to ``kernel_width``, with zeros in its extra widths: the output has ``v``'s width, so that a
  caller whose products already read and write the kernel's width copies no slice or pad. A query with no
  allowed key (a padding row) gets an unspecified output here instead of zeros; no other position reads it.
  """
  if implementation == 'cudnn':
    require_gpu('model.attention_impl', implementation, ('explicit', 'xla'))
  if bias is not None and slopes is not None:
    raise ValueError('fused_attention takes a bias or ALiBi slopes, not both')
  time, head_dim, values_width = q.shape[1], q.shape[-1], v.shape[-1]
  is_causal = bool(np.array_equal(static, np.tril(np.ones((1, time, k.shape[1]), bool))))
  mask = None if is_causal else jnp.asarray(static)[None]
  if key_mask is not None:
    keys = key_mask[:, None, None, :].astype(bool)
    mask = keys if mask is None else mask & keys
    # cuDNN adds the mask as a bias, which must span the whole [q_time, k_time] block.
    mask = jnp.broadcast_to(mask, (q.shape[0], mask.shape[1], time, k.shape[1]))
  width = kernel_width(static, k.shape[1], head_dim, implementation, slopes is not None)
  if values_width not in (head_dim, width):
    raise ValueError(f'fused_attention: values {values_width} wide, but the queries are {head_dim} and the '
                     f'kernel {width}')
  if slopes is not None:
    if width > head_dim:
      q, k, v = alibi_in_products(q, k, v, slopes)
    else:
      distance = np.abs(np.arange(time)[:, None] - np.arange(k.shape[1])[None, :]).astype(np.float32)
      bias = -slopes[:, None, None] * distance[None]
  if bias is not None:
    bias = bias[None].astype(q.dtype)  # [1, heads, q_time, k_time]
  out = jax.nn.dot_product_attention(q, k, v.astype(q.dtype), bias=bias, mask=mask, is_causal=is_causal,
                                     scale=1.0 / np.sqrt(head_dim), implementation=implementation)
  return out[..., :values_width]


def kernel_width(static: np.ndarray, k_time: int, head_dim: int, implementation: str, alibi: bool) -> int:
  """The head width ``fused_attention``'s kernel runs at: ``alibi_head_dim`` where ALiBi rides in the
  products (a mask that allows no key after its query, keys up to ``ALIBI_MAX_TIME``, and a width cuDNN
  takes), else ``head_dim``."""
  past_only = not np.triu(static, 1).any()
  fits = k_time <= ALIBI_MAX_TIME and (implementation != 'cudnn'
                                       or alibi_head_dim(head_dim) <= CUDNN_MAX_HEAD_DIM)
  return alibi_head_dim(head_dim) if alibi and past_only and fits else head_dim


CUDNN_MAX_HEAD_DIM = 128  # cuDNN's fused attention takes head dimensions up to 128, in multiples of 8
_ALIBI_DIGIT = 32  # key positions as two base-32 digits, each exact in bfloat16 (integers up to 256)
ALIBI_MAX_TIME = _ALIBI_DIGIT * 256


def alibi_head_dim(head_dim: int) -> int:
  """The head dimension of ``alibi_in_products``' queries: three more, rounded up to a multiple of 8."""
  return -(-(head_dim + 3) // 8) * 8


def alibi_in_products(q: Array, k: Array, v: Array, slopes: Array) -> tuple[Array, Array, Array]:
  """q, k, v widened so that the scaled products carry ALiBi: q'_i·k'_j / sqrt(d) = q_i·k_j / sqrt(d) + m_h j.

  Why: on a mask that allows no key after its query, the bias -m_h (i - j) differs from m_h j only by
  -m_h i, constant along the softmax's row, so the weights are the same. m_h j is a product: key j gets its
  position as two base-32 digits (integers up to 256 are exact in bfloat16, so up to ``ALIBI_MAX_TIME``
  positions), query i gets 32 m_h sqrt(d) and m_h sqrt(d), and the kernel accumulates their products in
  float32. A fused kernel then needs no [heads, time, time] bias, and the slopes' gradient comes from the
  queries' (cuDNN computes a bias's gradient in a separate, slower pass). In bfloat16 the slope is rounded
  once, where a bfloat16 bias rounds every m_h |i - j| (to a multiple of 4 above 512).

  The gradient: a flash kernel may round the score gradient dS to 16 bits before dq = dS k', so a row of
  its dS need not sum to zero, and m_h j alone would weigh that rounding by j instead of j - i. A third
  dimension, key 1 against query (-m_h sqrt(d) i minus itself), is zero forward and gives the slopes back
  -i Σ_j dS_ij: their gradient is the bias's, -Σ_ij dS_ij |i - j|, for whatever dS the kernel used.
  v is padded with zeros to the same width (if it is not that wide already); the caller keeps the first d
  dimensions of the output, or reads the rest as zeros.
  """
  batch, k_time, heads, head_dim = k.shape
  width = alibi_head_dim(head_dim)
  root = np.sqrt(head_dim).astype(np.float32)
  keys = jnp.arange(k_time)
  digits = jnp.stack([keys // _ALIBI_DIGIT, keys % _ALIBI_DIGIT, jnp.ones_like(keys)], -1).astype(k.dtype)
  m = slopes.astype(jnp.float32) * root                                       # [heads]
  row = -m[None, :] * jnp.arange(q.shape[1], dtype=jnp.float32)[:, None]      # [q_time, heads]
  rates = jnp.stack([jnp.broadcast_to(_ALIBI_DIGIT * m, row.shape), jnp.broadcast_to(m, row.shape),
                     row - jax.lax.stop_gradient(row)], -1)                   # [q_time, heads, 3]
  zeros_to_width = lambda x: jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])
  q = zeros_to_width(jnp.concatenate([q, jnp.broadcast_to(rates, (*q.shape[:-1], 3)).astype(q.dtype)], -1))
  k = zeros_to_width(jnp.concatenate([k, jnp.broadcast_to(digits[None, :, None, :], (batch, k_time, heads, 3))], -1))
  return q, k, zeros_to_width(v.astype(q.dtype))


@dataclasses.dataclass(frozen=True)
class BlockPlan:
  """Which key blocks each query block reads, from a static mask: ``keys[n]`` lists the key blocks of
  query block n (padded by repeating block 0, with ``valid`` False); ``mask`` is the static mask gathered
  to ``[heads or 1, n_blocks, block, kmax * block]``; ``q_pos`` / ``k_pos`` the positions of every row and
  column of it."""

  block: int
  keys: np.ndarray      # [n_blocks, kmax] int
  mask: np.ndarray      # [heads or 1, n_blocks, block, kmax * block] bool
  q_pos: np.ndarray     # [n_blocks, block]
  k_pos: np.ndarray     # [n_blocks, kmax * block]

  @property
  def scored_fraction(self) -> float:
    """The share of the dense [time × time] scores this plan computes."""
    return self.keys.shape[1] / self.keys.shape[0]


def block_plan(static_mask: np.ndarray, block: int) -> BlockPlan:
  """The blocks of a static ``[heads or 1, time, time]`` mask that hold any allowed pair in any head."""
  heads, time, _ = static_mask.shape
  n = -(-time // block)
  padded = np.zeros((heads, n * block, n * block), bool)
  padded[:, :time, :time] = static_mask
  tiles = padded.reshape(heads, n, block, n, block).any(axis=(0, 2, 4))         # [n, n]
  kmax = max(1, int(tiles.sum(1).max()))
  keys = np.zeros((n, kmax), np.int64)
  valid = np.zeros((n, kmax), bool)
  for qb in range(n):
    needed = np.flatnonzero(tiles[qb])
    keys[qb, :len(needed)], valid[qb, :len(needed)] = needed, True
  cols = (keys[:, :, None] * block + np.arange(block)).reshape(n, kmax * block)  # [n, kmax*block]
  rows = np.arange(n * block).reshape(n, block)
  gathered = padded[:, rows[:, :, None], cols[:, None, :]]                       # [h, n, block, kmax*block]
  gathered &= np.repeat(valid, block, axis=1)[None, :, None, :]
  return BlockPlan(block, keys, gathered, rows, cols)


def _pad_time(x: Array, length: int) -> Array:
  return jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


def gather_key_blocks(x: Array, plan: BlockPlan) -> Array:
  """``[batch, time, ...]`` -> the plan's key blocks of every query block, ``[batch, n_blocks,
  kmax * block, ...]``."""
  (n, kmax), b = plan.keys.shape, plan.block
  blocks = _pad_time(x, n * b).reshape(x.shape[0], n, b, *x.shape[2:])[:, plan.keys]
  return blocks.reshape(x.shape[0], n, kmax * b, *x.shape[2:])


def blocked_attention(q: Array, k: Array, v: Array, slopes: Array | None, plan: BlockPlan,
                      key_mask: Array | None) -> tuple[Array, Array]:
  """``dot_product_attention`` with the ALiBi bias ``-slopes_h |i - j|``, scoring only the (query block,
  key block) pairs of ``plan``: for a sliding window of w keys, O(time · (w + block)) scores instead of
  O(time²). Returns the output and the weights in the plan's blocked layout ``[batch, heads, n_blocks,
  block, kmax * block]`` (``scatter_weights`` makes them dense)."""
  batch, time, heads, dim = q.shape
  n, b = plan.keys.shape[0], plan.block
  q_blocks = _pad_time(q, n * b).reshape(batch, n, b, heads, dim)
  k_blocks, v_blocks = gather_key_blocks(k, plan), gather_key_blocks(v, plan)
  logits = jnp.einsum('bnqhd,bnkhd->bhnqk', q_blocks, k_blocks, preferred_element_type=jnp.float32)
  logits = logits / jnp.sqrt(jnp.float32(dim))
  if slopes is not None:
    distance = np.abs(plan.q_pos[:, :, None] - plan.k_pos[:, None, :]).astype(np.float32)
    logits = logits - slopes[:, None, None, None] * distance[None]
  mask = jnp.asarray(plan.mask)[None]
  if key_mask is not None:
    mask = mask & gather_key_blocks(key_mask.astype(bool), plan)[:, None, :, None, :]
  weights = softmax_over_allowed(logits, mask)
  out = jnp.einsum('bhnqk,bnkhd->bnqhd', weights.astype(v.dtype), v_blocks)
  return out.reshape(batch, n * b, heads, dim)[:, :time], weights


def scatter_weights(weights: Array, plan: BlockPlan, time: int) -> Array:
  """Blocked weights ``[batch, heads, n_blocks, block, kmax * block]`` -> dense ``[batch, heads, time,
  time]`` (zeros where nothing was scored)."""
  batch, heads = weights.shape[:2]
  n, b = plan.keys.shape[0], plan.block
  dense = jnp.zeros((batch, heads, n * b, n * b), weights.dtype)
  dense = dense.at[:, :, plan.q_pos[:, :, None], plan.k_pos[:, None, :]].add(weights)
  return dense[:, :, :time, :time]


def relational_logits(q: Array, k: Array, q_edge: Array, k_edge: Array, onehot: Array) -> Array:
  """(q_i + qe_ij) · (k_j + ke_ij) / sqrt(d) for every pair (Relational Attention: queries and keys are
  node projections plus edge projections), where the edge i -> j has token t (``onehot[b, i, j, t]``, all
  zero without an edge) and qe_ij = q_edge[t], ke_ij = k_edge[t].

  q, k: ``[batch, n, heads, d]``; q_edge, k_edge: ``[vocab, heads, d]``; onehot: ``[batch, n, n, vocab]``.
  Each cross term is formed per edge token and then picked per pair, so no ``[batch, n, n, heads, d]``
  tensor exists. Returns ``[batch, heads, n, n]`` float32.
  """
  f32 = dict(preferred_element_type=jnp.float32)
  onehot = onehot.astype(jnp.float32)
  node = jnp.einsum('bihd,bjhd->bhij', q, k, **f32)
  query_edge_key = jnp.einsum('bhiv,bijv->bhij', jnp.einsum('bihd,vhd->bhiv', q, k_edge, **f32), onehot)
  edge_query_key = jnp.einsum('bhjv,bijv->bhij', jnp.einsum('vhd,bjhd->bhjv', q_edge, k, **f32), onehot)
  edge_edge = jnp.einsum('hv,bijv->bhij', jnp.einsum('vhd,vhd->hv', q_edge, k_edge, **f32), onehot)
  return (node + query_edge_key + edge_query_key + edge_edge) / jnp.sqrt(jnp.float32(q.shape[-1]))


KERNELS = ('explicit', 'blocked', 'fused', 'relational')


def choose(impl: str, block_size: int, static: np.ndarray, *, relational: bool, hooked: bool,
           weights_kept: bool, dropout: bool) -> tuple[str, BlockPlan | None]:
  """(which computation serves an attention call, its block plan): 'relational' over a graph's edges;
  'blocked' where ``block_size`` and the static mask leave blocks out (not under hooks, which read every
  site); 'fused' (``impl``'s kernel, which keeps no weights) where no weights are kept, read or dropped out;
  else 'explicit', the einsum of ``dot_product_attention``."""
  if relational:
    return 'relational', None
  if block_size and not hooked:
    plan = block_plan(static, block_size)
    if plan.scored_fraction < 1.0:  # else the dense computation does the same work in fewer steps
      return 'blocked', plan
  if impl != 'explicit' and not weights_kept and not hooked and not dropout:
    return 'fused', None
  return 'explicit', None
