"""Attention: mask predicates, ALiBi with learned slopes, and multi-head attention.

The Token-Factored attention of "Symbolic Transformers" (Kerce & Fox 2025, eqs. 6-12) and the standard
baseline share one module here; they differ only in where the values come from and whether an output
projection follows.

Shapes: ``[batch, time, heads, head_dim]`` for queries, keys and values; ``[batch, heads, q_time, k_time]``
for attention weights; ``[heads, q_time, k_time]`` for position biases.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from symjax.mesh import EMBED, HEAD_DIM, HEADS

Array = jax.Array


# --------------------------------------------------------------------------------------------------------
# Masks as predicates on (query position i, key position j).
#
# Following the view of attention masks as logical constraints on index pairs (PyNeuraLogic's
# "Beyond standard attention aggregation"), a mask is a boolean predicate that composes with &, | and ~.
# --------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Mask:
  """A predicate ``(i, j) -> bool`` saying whether query position i may attend to key position j."""

  fn: Callable[[Array, Array], Array]
  name: str

  def __call__(self, i: Array, j: Array) -> Array:
    return self.fn(i, j)

  def __and__(self, other: Mask) -> Mask:
    return Mask(lambda i, j: self(i, j) & other(i, j), f'({self.name} & {other.name})')

  def __or__(self, other: Mask) -> Mask:
    return Mask(lambda i, j: self(i, j) | other(i, j), f'({self.name} | {other.name})')

  def __invert__(self) -> Mask:
    return Mask(lambda i, j: ~self(i, j), f'~{self.name}')

  def matrix(self, q_len: int, k_len: int | None = None) -> Array:
    """The ``[q_len, k_len]`` boolean matrix of the predicate (queries and keys start at position 0)."""
    k_len = q_len if k_len is None else k_len
    i = jnp.arange(q_len)[:, None]
    j = jnp.arange(k_len)[None, :]
    return jnp.broadcast_to(self(i, j), (q_len, k_len))


full = Mask(lambda i, j: jnp.ones(jnp.broadcast_shapes(i.shape, j.shape), bool), 'full')
causal = Mask(lambda i, j: j <= i, 'causal')


def sliding_window(width: int) -> Mask:
  """Keys at most ``width - 1`` positions away (Sparse Transformer's local head, both directions)."""
  if width < 1:
    raise ValueError(f'sliding_window width must be >= 1, got {width}')
  return Mask(lambda i, j: jnp.abs(i - j) < width, f'window({width})')


def strided(stride: int) -> Mask:
  """Keys whose distance is a multiple of ``stride`` (Sparse Transformer's strided head)."""
  if stride < 1:
    raise ValueError(f'strided stride must be >= 1, got {stride}')
  return Mask(lambda i, j: (i - j) % stride == 0, f'stride({stride})')


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
    raise ValueError(f'num_heads must be >= 1, got {num_heads}')

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

  def __call__(self, q_len: int, k_len: int) -> Array:
    distance = jnp.abs(jnp.arange(q_len)[:, None] - jnp.arange(k_len)[None, :]).astype(jnp.float32)
    return -self.slopes()[:, None, None] * distance[None]


def dot_product_attention(q: Array, k: Array, v: Array, bias: Array | None, mask: Array | None
                          ) -> tuple[Array, Array]:
  """softmax(q kᵀ / sqrt(d) + bias) v over allowed keys.

  Args:
    q: ``[batch, q_time, heads, head_dim]``.
    k, v: ``[batch, k_time, heads, head_dim]``.
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
  if mask is not None:
    logits = jnp.where(mask, logits, -jnp.inf)
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    logits = jnp.where(jnp.isfinite(row_max), logits, 0.0)
  weights = jax.nn.softmax(logits, axis=-1)
  if mask is not None:
    weights = jnp.where(mask, weights, 0.0)
  out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)
  return out, weights


class Attention(nn.Module):
  """Multi-head self-attention.

  Queries and keys are projected from ``x`` (eq. 7, no biases). Values are either given by the caller —
  the Token-Factored and Symbolic blocks compute them from X_t alone (eqs. 8 and 27) — or projected from
  ``x`` as in a standard transformer. ``output_projection=False`` returns the concatenated heads as they
  are: the factored architectures have no output projection, so each head writes its own channel of X_t.

  Sows ``weights`` ``[batch, heads, q_time, k_time]`` into ``intermediates``.
  """

  num_heads: int
  head_dim: int
  mask: Mask = causal
  alibi: bool = True
  learned_slopes: bool = True
  output_projection: bool = False
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  kernel_init: Callable = nn.initializers.normal(0.02)

  @nn.compact
  def __call__(self, x: Array, values: Array | None = None, key_mask: Array | None = None,
               deterministic: bool = True) -> Array:
    """x: ``[batch, time, d_model]``; values: ``[batch, time, heads, head_dim]``; key_mask: ``[batch, time]``.

    Returns ``[batch, time, d_model]``.
    """
    batch, time, d_model = x.shape
    heads = (self.num_heads, self.head_dim)
    named = lambda names: nn.with_logical_partitioning(self.kernel_init, names)
    dense = lambda name: nn.DenseGeneral(heads, use_bias=False, dtype=self.dtype,
                                         kernel_init=named((EMBED, HEADS, HEAD_DIM)), name=name)
    q, k = dense('query')(x), dense('key')(x)
    v = dense('value')(x) if values is None else values.astype(self.dtype)

    bias = ALiBi(self.num_heads, self.learned_slopes, name='alibi')(time, time) if self.alibi else None
    mask = self.mask.matrix(time, time)[None, None]
    if key_mask is not None:
      mask = mask & key_mask[:, None, None, :].astype(bool)
    out, weights = dot_product_attention(q, k, v, bias, mask)
    self.sow('intermediates', 'weights', weights)
    if self.dropout_rate > 0.0 and not deterministic:
      # Dropout on the weights after they are sown: the readable weights are the model's own.
      weights = nn.Dropout(self.dropout_rate)(weights, deterministic=False)
      out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)

    if self.output_projection:
      return nn.DenseGeneral(d_model, axis=(-2, -1), use_bias=False, dtype=self.dtype,
                             kernel_init=named((HEADS, HEAD_DIM, EMBED)), name='out')(out)
    return out.reshape(batch, time, self.num_heads * self.head_dim)
