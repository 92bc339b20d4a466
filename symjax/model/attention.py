"""Multi-head attention as "Symbolic Transformers" writes it (eqs. 7-12): queries and keys from the input,
scores q·k/√d plus a learned ALiBi bias, softmax over the allowed keys, the weighted sum of the values.

The Token-Factored and Symbolic blocks pass values computed from X_t alone (eqs. 8 and 27) and take the
heads as they are (each writes its own channel of X_t); the standard baseline projects its values and its
output. What is not the paper's mathematics lives beside it: the mask algebra (``masks``), program
training's weights (``program``), relational edges (``relational``), and the kernels that compute the same
thing faster (``symjax.ops.attention``, which also chooses among them).

Shapes: ``[batch, time, heads, head_dim]`` for queries, keys and values; ``[batch, heads, q_time, k_time]``
for attention weights; ``[heads, q_time, k_time]`` for position biases.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from symjax.model import intermediates as names
from symjax.model import mixing, program, relational
from symjax.model.masks import Mask, causal, head_mask_matrix
from symjax.ops import attention as kernels
from symjax.ops import dense as dense_ops
from symjax.system.errors import InputError
from symjax.system.mesh import EMBED, HEAD_DIM, HEADS

Array = jax.Array


# --------------------------------------------------------------------------------------------------------
# ALiBi ("Train Short, Test Long", Press et al. 2022), with learned per-head slopes as in
# "Symbolic Transformers" eq. 11.
# --------------------------------------------------------------------------------------------------------
def alibi_slopes(num_heads: int) -> np.ndarray:
  """The reference ALiBi slopes: a geometric sequence starting at 2^(-8/n) for n a power of two.

  When ``num_heads`` is not a power of two, the slopes of the nearest lower power of two n are followed by
  every other slope of the sequence for 2n (the ALiBi authors' extension).
  """
  if num_heads < 1:
    raise InputError(f'num_heads must be >= 1, got {num_heads}')

  def power_of_two(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (k + 1) for k in range(n)]

  n = 2 ** int(math.floor(math.log2(num_heads)))
  slopes = power_of_two(n)
  if n < num_heads:
    slopes += power_of_two(2 * n)[0::2][: num_heads - n]
  return np.asarray(slopes, dtype=np.float64)


class ALiBi(nn.Module):
  """Per-head linear distance bias ``-m_h * |i - j|``, ``[heads, q_time, k_time]``.

  For causal attention this is the bias ``m_h * (j - i)`` of eq. 11 on the allowed keys j <= i; the future
  is removed by the causal mask, not here. Slopes are learned through their logarithm, which keeps them
  positive, and start at the reference sequence; ``learned=False`` keeps them fixed.
  """

  num_heads: int
  learned: bool = True

  def setup(self):
    reference = jnp.asarray(alibi_slopes(self.num_heads), jnp.float32)
    if self.learned:
      self.log_slope = self.param('log_slope', lambda _: jnp.log(reference))
    else:
      self.reference = reference

  def slopes(self) -> Array:
    """``[heads]``, positive."""
    return jnp.exp(self.log_slope) if self.learned else self.reference

  def __call__(self, q_len: int, k_len: int, offset: int = 0) -> Array:
    """Queries at positions ``offset…offset + q_len − 1``, keys at ``0…k_len − 1``."""
    queries = jnp.arange(offset, offset + q_len)
    distance = jnp.abs(queries[:, None] - jnp.arange(k_len)[None, :]).astype(jnp.float32)
    return -self.slopes()[:, None, None] * distance[None]


def rotary(x: Array, offset: int = 0, base: float = 10000.0) -> Array:
  """Rotary position embedding ("RoFormer", Su et al. 2021, eq. 34, in the half-split layout): feature
  pairs (i, i + d/2) of position p rotated by the angle p · base^(−2i/d). ``x`` ``[batch, time, heads,
  head_dim]`` holds positions ``offset…``; q·k of rotated queries and keys depends on their distance
  alone."""
  half = x.shape[-1] // 2
  freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle = jnp.arange(offset, offset + x.shape[1], dtype=jnp.float32)[:, None] * freq       # [time, half]
  cos, sin = (f(angle)[None, :, None, :] for f in (jnp.cos, jnp.sin))
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


class Projection(nn.Module):
  """``nn.DenseGeneral`` without a bias over the trailing ``in_axes`` axes of x: the same parameter
  ``kernel`` ``[*in_shape, *features]``, initialised as DenseGeneral initialises it (one flat
  ``[prod(in_shape), prod(features)]`` draw, reshaped), and the same product, computed as one matrix product
  through ``symjax.ops.dense.product`` (its backward pass on the CPU backend is that module's)."""

  features: int | tuple[int, ...]
  in_axes: int = 1
  dtype: Any = jnp.float32
  kernel_init: Callable = nn.initializers.normal(0.02)
  # Zero rows (columns) appended to the kernel's last input (feature) axis in the product, not in the
  # parameter: x's last axis may carry ``in_pad`` more entries, which are not read, and the output's last
  # axis carries ``out_pad`` more, all zero. A fused attention kernel running wider than the heads then
  # reads and writes its own width with no copy in between (``symjax.ops.attention.kernel_width``).
  in_pad: int = 0
  out_pad: int = 0
  # True: return the kernel as the ``[in, out]`` matrix of the product (padded as above) instead of the
  # product, so that a caller whose projections read one input computes them as one wider product.
  as_matrix: bool = False

  @nn.compact
  def __call__(self, x: Array) -> Array:
    features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
    lead, in_shape = x.shape[:x.ndim - self.in_axes], x.shape[x.ndim - self.in_axes:]
    in_shape = (*in_shape[:-1], in_shape[-1] - self.in_pad)
    flat = (math.prod(in_shape), math.prod(features))

    def init(key, shape, dtype=jnp.float32):
      kernel = self.kernel_init(key, flat, dtype)
      if isinstance(kernel, nn.meta.AxisMetadata):
        return nn.meta.replace_boxed(kernel, jnp.reshape(kernel.unbox(), shape))
      return jnp.reshape(kernel, shape)

    kernel = self.param('kernel', init, in_shape + features, jnp.float32)
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
    if self.in_pad or self.out_pad:
      widths = [(0, 0)] * kernel.ndim
      widths[len(in_shape) - 1], widths[-1] = (0, self.in_pad), (0, self.out_pad)
      kernel = jnp.pad(kernel, widths)
    matrix = kernel.reshape(math.prod(kernel.shape[:len(in_shape)]), -1)
    if self.as_matrix:
      return matrix
    out = dense_ops.product(x.reshape(*lead, -1), matrix)
    return out.reshape(*lead, *kernel.shape[len(in_shape):])


class Attention(nn.Module):
  """Multi-head self-attention.

  Queries and keys are projected from ``x`` (eq. 7, no biases). Values are either given by the caller —
  the Token-Factored and Symbolic blocks compute them from X_t alone (eqs. 8 and 27) — or projected from
  ``x`` as in a standard transformer. ``output_projection=False`` returns the concatenated heads as they
  are: the factored architectures have no output projection, so each head writes its own channel of X_t.

  ``mask`` is one ``Mask`` or one per head. ``block_size > 0`` scores only the blocks of
  ``block_size × block_size`` (query, key) pairs that the mask allows anywhere (``blocked_attention``); it
  falls back to the dense computation when every block is needed. ``impl`` picks the dense computation
  (``ATTENTION_IMPLS``): a fused one serves only where no weights are read and none are dropped out.

  With ``edges`` (Relational Attention, Diao & Loynd 2022, as "Beyond Transformers with PyNeuraLogic"
  writes it): node i attends only to the j that ``edges.mask`` allows; its query and key for the pair are
  q_i + W_qe e_ij and k_j + W_ke e_ij, and the value it reads is v_j + ve_ij, where ve_ij is
  ``edges.values`` or, without them, W_ve e_ij. No ALiBi bias then: node order means nothing in a graph.

  Every named site (``attn.q``, ``.k``, ``.values``, ``.scores``, ``.pattern``, ``.z``, ``.out``) passes
  through ``symjax.model.intermediates.hook``; the pattern is sown into ``intermediates``.

  ``prefix``, the keys and values of the P positions before x's first (kept from another pass), makes x the
  positions P… of a longer input: its queries read those keys and its own, under the mask's and ALiBi's rows
  for those positions. In a causal model that is the pass over a suffix whose prefix is unchanged (patching
  sweeps recompute only what follows the patched position).
  """

  num_heads: int
  head_dim: int
  mask: Mask | tuple[Mask, ...] = causal
  alibi: bool = True
  learned_slopes: bool = True
  output_projection: bool = False
  dropout_rate: float = 0.0
  block_size: int = 0
  impl: str = 'explicit'
  dtype: jnp.dtype = jnp.float32
  kernel_init: Callable = nn.initializers.normal(0.02)
  hard: bool = False  # program training: each query reads only its argmax key (straight-through)
  numerical_heads: int = 0  # the last heads count the keys with score > 0 (predicate_weights)
  gumbel_scale: Any = None  # hard only: sample the argmax at this scale while training (gumbel_perturbed)
  numerical_positions: bool = True  # False: no ALiBi bias on the numerical heads (and positions go to the rest)
  rope: bool = False  # rotate queries and keys by their positions (``rotary``), after their sites
  # Gated attention (the dual-stream family's): each head's output times σ(g W_gate[h]), g the query
  # ('combined') or the caller's ``gate_input`` ('symbolic'); W_gate from zeros, so every gate starts at ½.
  gate: str = 'none'
  # The factored blocks' output map over heads (``output_projection=False``): 'independent' (none),
  # 'kronecker' or 'dense' (``symjax.model.mixing``).
  head_mixing: str = 'independent'

  @nn.compact
  def __call__(self, x: Array, values: Array | None = None, key_mask: Array | None = None,
               deterministic: bool = True, edges: relational.Edges | None = None,
               positions: Array | None = None, prefix: tuple[Array, Array] | None = None,
               gate_input: Array | None = None, split: tuple | None = None) -> Array:
    """x: ``[batch, time, d_model]``; values: ``[batch, time, heads, head_dim]``; key_mask: ``[batch, keys]``
    (keys = P + time with a prefix); positions: ``[time, d_model]`` rows added to the queries' and keys' input
    of the categorical heads only (the numerical heads read ``x`` alone; ``numerical_positions=False``);
    prefix: keys and values ``[batch, P, heads, head_dim]``; gate_input: ``[batch, time, heads, head_dim]``,
    what the 'symbolic' gate reads; split: per-head inputs ``[batch, time, heads, d_model]`` of the queries, the
    keys and (without ``values``) the values, in place of ``x`` (edge patching). Returns ``[batch, time, d_model]``.
    """
    time, offset = x.shape[1], 0 if prefix is None else prefix[0].shape[1]
    static = head_mask_matrix(self.mask, offset + time, offset + time)[:, offset:]  # [heads or 1, q, k]
    if static.shape[0] not in (1, self.num_heads):
      raise InputError(f'attention has {self.num_heads} heads but {static.shape[0]} per-head masks')
    if prefix is not None and edges is not None:
      raise InputError('attention over a prefix of kept keys and values takes no relational edges')
    kernel, plan = ('explicit', None) if prefix is not None else kernels.choose(
        self.impl, self.block_size, static, relational=edges is not None, hooked=names.active(),
        weights_kept=self.is_mutable_collection(names.COLLECTION),
        dropout=self.dropout_rate > 0.0 and not deterministic)
    self._check_program_kernel(kernel)
    alibi = ALiBi(self.num_heads, self.learned_slopes, name='alibi') if self.alibi and edges is None else None
    slopes = alibi.slopes() if alibi is not None and kernel in ('blocked', 'fused') else None
    wide = self._fused_width(kernel, static, time, values, alibi)
    q, k, v = self._queries_keys_values(x, values, positions, wide, split)  # eqs. 7-8
    if prefix is not None:
      k, v = (jnp.concatenate([kept.astype(new.dtype), new], axis=1) for kept, new in zip(prefix, (k, v)))
    query = q
    if self.rope:  # after the prefix joins: kept keys are rotated by their own positions, as the rest
      q, k = rotary(q, offset), rotary(k)
    mask = jnp.asarray(static)[None]
    if key_mask is not None:
      mask = mask & key_mask[:, None, None, :].astype(bool)
    weights = blocked = edge_values = None
    if kernel == 'relational':
      weights, edge_values = self._relational(q, k, mask, edges)
      out = relational.read(weights, v, edge_values)
    elif kernel == 'blocked':
      out, blocked = kernels.blocked_attention(q, k, v, slopes, plan, key_mask)
      if self.is_mutable_collection(names.COLLECTION):
        weights = names.hook(self, 'attn.pattern', kernels.scatter_weights(blocked, plan, time))
    elif kernel == 'fused':
      out = kernels.fused_attention(q, k, v, None, static, key_mask, self.impl, slopes)
    else:
      weights, v = self._weights(q, k, v, mask, alibi, offset)             # eqs. 9-11
      out = read(weights, v)                                               # eq. 12
    out = self._dropout(out, weights, blocked, plan, v, edge_values, deterministic)
    out = self._gate(out, query if self.gate == 'combined' else gate_input)
    return self._output(names.hook(self, 'attn.z', out), wide, x.shape[-1])

  def _gate(self, out: Array, g: Array | None) -> Array:
    """y_h ← y_h ⊙ σ(g_h W_gate[h]) per head, ``[batch, time, heads, head_dim]`` (the site ``attn.gate``)."""
    if self.gate == 'none':
      return out
    init = nn.with_logical_partitioning(nn.initializers.zeros, (HEADS, HEAD_DIM, None))
    w = nn.meta.unbox(self.param('gate', init, (self.num_heads, self.head_dim, self.head_dim)))
    logits = jnp.einsum('bthd,hde->bthe', g.astype(jnp.float32), w, preferred_element_type=jnp.float32)
    return out * names.hook(self, 'attn.gate', jax.nn.sigmoid(logits)).astype(out.dtype)

  def _weights(self, q: Array, k: Array, v: Array, mask: Array, alibi: ALiBi | None, offset: int
               ) -> tuple[Array, Array]:
    """softmax over the allowed keys of q·k/√d + the ALiBi bias, then program training's weights (which
    give a numerical head the constant value 1); the queries are positions ``offset…``."""
    bias = alibi(q.shape[1], k.shape[1], offset) if alibi is not None else None
    if bias is not None and self.numerical_heads and not self.numerical_positions:
      bias = bias.at[self.num_heads - self.numerical_heads:].set(0.0)  # a predicate on tokens alone
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
    logits = logits / jnp.sqrt(jnp.float32(q.shape[-1])) + (0.0 if bias is None else bias)
    scores = names.hook(self, 'attn.scores', jnp.where(mask, logits, -jnp.inf))
    weights, v = program.weights(self, kernels.softmax_over_allowed(scores, mask), scores, mask, v)
    return names.hook(self, 'attn.pattern', weights), v

  def _projection(self, name: str, pad: int = 0, as_matrix: bool = False) -> Projection:
    init = nn.with_logical_partitioning(self.kernel_init, (EMBED, HEADS, HEAD_DIM))
    return Projection((self.num_heads, self.head_dim), dtype=self.dtype, kernel_init=init, out_pad=pad,
                      as_matrix=as_matrix, name=name)

  def _queries_keys_values(self, x: Array, values: Array | None, positions: Array | None, wide: int,
                           split: tuple | None = None):
    if split is not None:
      if positions is not None or wide:
        raise InputError('per-head inputs (edge patching) are for attention without apart positions or a fused '
                         'kernel')
      d = x.shape[-1]
      kernel = lambda name: self._projection(name, as_matrix=True)(x).reshape(d, self.num_heads, -1)
      own = lambda name, xs: jnp.einsum('bthd,dhe->bthe', xs.astype(self.dtype), kernel(name).astype(self.dtype))
      q, k = own('query', split[0]), own('key', split[1])
      v = own('value', split[2]) if values is None else values.astype(self.dtype)
    elif positions is None:
      q, k, v = self._one_product(x, wide, values is None)
    else:
      if not self.numerical_heads or self.numerical_positions:
        raise InputError('attention positions apart from x are for numerical heads without positions '
                         '(model.numerical_positions = False)')
      query, key = self._projection('query'), self._projection('key')
      # The maps are linear: W(x + p) = Wx + Wp, so the categorical heads read what they would with p added.
      categorical = (jnp.arange(self.num_heads) < self.num_heads - self.numerical_heads)[:, None]
      q = query(x) + jnp.where(categorical, query(positions), 0)
      k = key(x) + jnp.where(categorical, key(positions), 0)
      v = self._projection('value', wide)(x) if values is None else None
    v = v if values is None else values.astype(self.dtype)
    return names.hook(self, 'attn.q', q), names.hook(self, 'attn.k', k), names.hook(self, 'attn.values', v)

  def _one_product(self, x: Array, wide: int, with_values: bool) -> tuple[Array, Array, Array | None]:
    """x W_Q, x W_K (and x W_V) as one product over the kernels side by side: one [d, 3·H·d_h] product
    takes less time than three [d, H·d_h] ones on a CPU (``benchmarks/speed/vs_transformer_lens.py``), and
    each output column is the same dot product either way. The parameters are the three projections' own."""
    kernels = [self._projection(name, pad, as_matrix=True)(x)
               for name, pad in (('query', 0), ('key', 0), ('value', wide))[:3 if with_values else 2]]
    matrix = jnp.concatenate(kernels, axis=1).astype(self.dtype)
    out = dense_ops.product(x.astype(self.dtype).reshape(-1, x.shape[-1]), matrix)
    edges = np.cumsum([m.shape[1] for m in kernels])[:-1]
    parts = [p.reshape(*x.shape[:-1], self.num_heads, -1) for p in jnp.split(out, edges, axis=1)]
    return parts[0], parts[1], parts[2] if with_values else None

  def _relational(self, q: Array, k: Array, mask: Array, edges: relational.Edges):
    e = edges.table.astype(self.dtype)
    weights = relational.weights(q, k, self._projection('edge_query')(e), self._projection('edge_key')(e), edges,
                                 mask, lambda local, value: names.hook(self, local, value))
    per_token = self._projection('edge_value')(e) if edges.values is None else edges.values.astype(self.dtype)
    return weights, (per_token, edges.onehot)

  def _check_program_kernel(self, kernel: str) -> None:
    if (self.hard or self.numerical_heads) and (kernel in ('blocked', 'relational') or self.impl != 'explicit'):
      raise InputError('hard attention (model.hard) and numerical heads are computed by the explicit dense '
                       'attention only')

  def _fused_width(self, kernel: str, static: np.ndarray, time: int, values: Array | None,
                   alibi: ALiBi | None) -> int:
    """Where the fused kernel runs wider than the heads (ALiBi in the products), the value projection writes
    that width and the output projection reads it, through zero columns and rows of their kernels."""
    if kernel != 'fused' or values is not None or not self.output_projection:
      return 0
    return kernels.kernel_width(static, time, self.head_dim, self.impl, alibi is not None) - self.head_dim

  def _dropout(self, out, weights, blocked, plan, v, edge_values, deterministic: bool) -> Array:
    """Dropout on the weights after they are sown: the readable weights are the model's own."""
    if self.dropout_rate == 0.0 or deterministic:
      return out
    drop = nn.Dropout(self.dropout_rate)
    if plan is not None:
      blocked = drop(blocked, deterministic=False)
      return jnp.einsum('bhnqk,bnkhd->bnqhd', blocked.astype(v.dtype), kernels.gather_key_blocks(v, plan)
                        ).reshape(out.shape[0], -1, *out.shape[2:])[:, :out.shape[1]]
    return relational.read(drop(weights, deterministic=False), v, edge_values)

  def _output(self, out: Array, wide: int, d_model: int) -> Array:
    """The standard block's output projection over the heads; the factored blocks' heads as they are, or
    through their output map (``head_mixing``)."""
    if self.output_projection:
      init = nn.with_logical_partitioning(self.kernel_init, (HEADS, HEAD_DIM, EMBED))
      result = Projection(d_model, in_axes=2, dtype=self.dtype, kernel_init=init, in_pad=wide, name='out')(out)
    else:
      result = out.reshape(*out.shape[:2], self.num_heads * self.head_dim)
      if self.head_mixing != 'independent':
        result = mixing.head_map(self.head_mixing, self.num_heads, 'head_mix')(result).reshape(result.shape)
    return names.hook(self, 'attn.out', result)


def read(weights: Array, v: Array) -> Array:
  """Σ_j a_ij v_j: ``[batch, q_time, heads, head_dim]`` (eq. 12)."""
  return jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)
