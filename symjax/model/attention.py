"""Attention: mask predicates, ALiBi with learned slopes, and multi-head attention.

The Token-Factored attention of "Symbolic Transformers" (Kerce & Fox 2025, eqs. 6-12) and the standard
baseline share one module here; they differ only in where the values come from and whether an output
projection follows.

Shapes: ``[batch, time, heads, head_dim]`` for queries, keys and values; ``[batch, heads, q_time, k_time]``
for attention weights; ``[heads, q_time, k_time]`` for position biases.
"""

from __future__ import annotations

import ast
import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from symjax.model import intermediates as names
from symjax.ops import dense as dense_ops
from symjax.ops.attention import (  # noqa: F401
  ATTENTION_IMPLS,
  BlockPlan,
  block_plan,
  blocked_attention,
  dot_product_attention,
  fused_attention,
  gather_key_blocks,
  kernel_width,
  relational_logits,
  require_gpu,
  scatter_weights,
  softmax_over_allowed,
)
from symjax.system.errors import InputError
from symjax.system.mesh import EMBED, HEAD_DIM, HEADS

Array = jax.Array


def straight_through(weights: Array) -> Array:
  """One-hot at the argmax of ``weights`` over the last axis in the forward pass, with the gradient of
  ``weights`` (the straight-through estimator). Ties go to the first index, as NumPy's argmax does."""
  hard = jax.nn.one_hot(jnp.argmax(weights, -1), weights.shape[-1], dtype=weights.dtype)
  return weights + jax.lax.stop_gradient(hard - weights)


# The random stream of program training's Gumbel noise (``model.gumbel_scale``): the train step passes it,
# evaluation does not, so evaluation and the decompiled program take the noiseless argmax.
GUMBEL_RNG = 'gumbel'


def gumbel_perturbed(weights: Array, key: Array, scale: Any) -> Array:
  """softmax(log weights + scale·g), g standard Gumbel noise: its argmax is a sample from ``weights``
  sharpened to temperature ``scale`` (the Gumbel-max trick; scale 1 samples ``weights`` itself), and it is
  the soft weights whose gradient the straight-through estimate takes ("Learning Transformer Programs" §3.2,
  after Jang et al.'s Gumbel-softmax). Zero weights (masked keys, padding rows) stay zero."""
  live = weights > 0
  # log of 1 where a weight is 0, so that no gradient passes through log 0; a finite floor where -inf would
  # make a row with no live weight (a padding query) NaN.
  logits = jnp.log(jnp.where(live, weights, 1.0))
  noisy = logits + scale * jax.random.gumbel(key, weights.shape, logits.dtype)
  return jax.nn.softmax(jnp.where(live, noisy, jnp.finfo(logits.dtype).min), -1)


def sampling(module: nn.Module) -> bool:
  """Whether a hard module samples its argmaxes in this call: it has a Gumbel scale (a float, or the
  trainer's annealed value, traced) and the GUMBEL_RNG stream (passed by the train step only)."""
  return module.hard and module.gumbel_scale is not None and module.has_rng(GUMBEL_RNG)


def predicate_weights(scores: Array, allowed: Array, hard: bool, key: Array | None = None,
                      scale: Any = 0.0) -> Array:
  """The weights of a numerical head, S_ij: 1 for every allowed key whose score is above 0 (a learned
  predicate), 0 elsewhere ("Learning Transformer Programs"' numerical attention, which sums where softmax
  attention averages). ``hard=False`` gives the soft version, sigmoid(score) in place of the 0/1 predicate;
  ``hard=True`` the 0/1 one in the forward pass with the soft one's gradient. With ``key``, the score is
  perturbed by ``scale`` times logistic noise first (the difference of two Gumbels: an entry-wise
  Gumbel-sigmoid, the form that paper names for predicates with several keys per query).
  scores, allowed: ``[..., q_time, k_time]`` (allowed broadcastable)."""
  allowed = jnp.broadcast_to(allowed, scores.shape)
  if key is not None:
    scores = scores + scale * jax.random.logistic(key, scores.shape, scores.dtype)
  soft = jnp.where(allowed, jax.nn.sigmoid(jnp.where(allowed, scores, 0.0)), 0.0)
  if not hard:
    return soft
  chosen = (allowed & (scores > 0)).astype(soft.dtype)
  return soft + jax.lax.stop_gradient(chosen - soft)


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

  def matrix(self, q_len: int, k_len: int | None = None) -> np.ndarray:
    """The ``[q_len, k_len]`` boolean matrix of the predicate (queries and keys start at position 0), a
    NumPy constant (predicates are built from operators that NumPy evaluates at trace time)."""
    k_len = q_len if k_len is None else k_len
    i = np.arange(q_len)[:, None]
    j = np.arange(k_len)[None, :]
    return np.broadcast_to(self(i, j), (q_len, k_len))


full = Mask(lambda i, j: np.ones(np.broadcast_shapes(i.shape, j.shape), bool), 'full')
causal = Mask(lambda i, j: j <= i, 'causal')


def sliding_window(width: int) -> Mask:
  """Keys at most ``width - 1`` positions away (Sparse Transformer's local head, both directions)."""
  if width < 1:
    raise InputError(f'sliding_window width must be >= 1, got {width}')
  return Mask(lambda i, j: abs(i - j) < width, f"window({width})")


def strided(stride: int) -> Mask:
  """Keys whose distance is a multiple of ``stride`` (Sparse Transformer's strided head)."""
  if stride < 1:
    raise InputError(f'strided stride must be >= 1, got {stride}')
  return Mask(lambda i, j: (i - j) % stride == 0, f'stride({stride})')


MASK_NAMES = {'full': full, 'causal': causal}
MASK_FUNCTIONS = {'window': sliding_window, 'stride': strided}
MASK_GRAMMAR = ("names full, causal; calls window(n), stride(n) with an integer n >= 1; combined with "
                "& (and), | (or), ~ (not) and parentheses; '; ' between per-head masks")


def parse_mask(text: str) -> Mask:
  """The mask an expression of the algebra names, e.g. ``'causal & (window(8) | stride(8))'``.

  Parsed with Python's ``ast`` and evaluated over the names above only (nothing else is evaluated).
  """
  def fail(why: str):
    raise InputError(f'model.mask {text!r}: {why}; allowed: {MASK_GRAMMAR}')

  def build(node) -> Mask:
    if isinstance(node, ast.Name):
      if node.id not in MASK_NAMES:
        fail(f'unknown mask {node.id!r}')
      return MASK_NAMES[node.id]
    if isinstance(node, ast.Call):
      name = getattr(node.func, 'id', None)
      if name not in MASK_FUNCTIONS:
        fail(f'unknown mask function {ast.unparse(node.func)!r}')
      args = node.args
      if (len(args) != 1 or node.keywords or not isinstance(args[0], ast.Constant)
          or type(args[0].value) is not int or args[0].value < 1):
        fail(f'{name}() takes one integer >= 1, got {ast.unparse(node)!r}')
      return MASK_FUNCTIONS[name](args[0].value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
      left, right = build(node.left), build(node.right)
      return left & right if isinstance(node.op, ast.BitAnd) else left | right
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
      return ~build(node.operand)
    fail(f'cannot read {ast.unparse(node)!r}')

  if not isinstance(text, str) or not text.strip():
    raise InputError(f'model.mask must be a non-empty expression, got {text!r}; allowed: {MASK_GRAMMAR}')
  try:
    tree = ast.parse(text.strip(), mode='eval')
  except SyntaxError:
    fail('not an expression')
  return build(tree.body)


def parse_head_masks(text: str, num_heads: int) -> tuple[Mask, ...]:
  """One mask per head from ``'m'`` (every head) or ``'m_1; ...; m_g'`` (g divides the heads: heads
  ``[k·H/g, (k+1)·H/g)`` use m_{k+1}, as the Sparse Transformer splits its heads between patterns)."""
  parts = text.split(';')
  if any(not p.strip() for p in parts):
    raise InputError(f'model.mask {text!r}: an empty mask between semicolons; allowed: {MASK_GRAMMAR}')
  if num_heads % len(parts):
    raise InputError(f'model.mask {text!r} gives {len(parts)} per-head masks, which must divide '
                     f'model.num_heads = {num_heads}')
  masks = [parse_mask(p) for p in parts]
  return tuple(m for m in masks for _ in range(num_heads // len(parts)))


def head_mask_matrix(masks: Mask | tuple[Mask, ...], q_len: int, k_len: int) -> np.ndarray:
  """The static ``[heads or 1, q_len, k_len]`` boolean matrix of one mask or of per-head masks (NumPy, so
  that it is a trace-time constant and its block structure can be read)."""
  masks = masks if isinstance(masks, tuple) else (masks,)
  i, j = np.arange(q_len)[:, None], np.arange(k_len)[None, :]
  return np.stack([np.broadcast_to(np.asarray(m(i, j)), (q_len, k_len)) for m in masks])


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

  def __call__(self, q_len: int, k_len: int) -> Array:
    distance = jnp.abs(jnp.arange(q_len)[:, None] - jnp.arange(k_len)[None, :]).astype(jnp.float32)
    return -self.slopes()[:, None, None] * distance[None]


@flax.struct.dataclass
class Edges:
  """A batch of graphs for relational attention. ``ids`` ``[batch, n, n]``: the token id of the edge
  i -> j (row i, column j), −1 where there is none (node i may attend to node j where there is one);
  ``table`` ``[vocab, d_model]``: the embedding rows the ids name; ``values`` ``[vocab, heads, head_dim]``:
  the edge part of a value for each edge token (None: the attention projects ``table`` with its own learned
  map). Edge projections are computed once per vocabulary row and picked per pair through ``onehot``."""

  ids: Array
  table: Array
  values: Array | None = None

  @property
  def mask(self) -> Array:
    return self.ids >= 0

  @property
  def onehot(self) -> Array:
    """``[batch, n, n, vocab]``: which token each edge has (all zero where there is no edge)."""
    return jax.nn.one_hot(self.ids, self.table.shape[0], dtype=jnp.float32)


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
    out = dense_ops.product(x.reshape(*lead, -1), kernel.reshape(math.prod(kernel.shape[:len(in_shape)]), -1))
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

  Sows ``weights`` ``[batch, heads, q_time, k_time]`` into ``intermediates``.
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

  @nn.compact
  def __call__(self, x: Array, values: Array | None = None, key_mask: Array | None = None,
               deterministic: bool = True, edges: Edges | None = None, positions: Array | None = None) -> Array:
    """x: ``[batch, time, d_model]``; values: ``[batch, time, heads, head_dim]``; key_mask: ``[batch, time]``;
    positions: ``[time, d_model]`` rows added to the queries' and keys' input of the categorical heads only
    (the numerical heads read ``x`` alone; ``numerical_positions=False``).

    Returns ``[batch, time, d_model]``.
    """
    batch, time, d_model = x.shape
    heads = (self.num_heads, self.head_dim)
    named = lambda names: nn.with_logical_partitioning(self.kernel_init, names)
    dense = lambda name, pad=0: Projection(heads, dtype=self.dtype, kernel_init=named((EMBED, HEADS, HEAD_DIM)),
                                           out_pad=pad, name=name)
    query, key = dense('query'), dense('key')
    q, k = query(x), key(x)
    if positions is not None:
      if not self.numerical_heads or self.numerical_positions:
        raise InputError('attention positions apart from x are for numerical heads without positions '
                         '(model.numerical_positions = False)')
      # The maps are linear: W(x + p) = Wx + Wp, so the categorical heads read what they would with p added.
      categorical = (jnp.arange(self.num_heads) < self.num_heads - self.numerical_heads)[:, None]
      q, k = q + jnp.where(categorical, query(positions), 0), k + jnp.where(categorical, key(positions), 0)
    hooked = names.active()  # a hook session reads every site: the explicit path, dense weights
    static = head_mask_matrix(self.mask, time, time)                          # [heads or 1, q, k]
    if static.shape[0] not in (1, self.num_heads):
      raise InputError(f'attention has {self.num_heads} heads but {static.shape[0]} per-head masks')
    plan = block_plan(static, self.block_size) if self.block_size and edges is None and not hooked else None
    if plan is not None and plan.scored_fraction == 1.0:
      plan = None  # every block is needed: the dense computation does the same work in fewer steps
    alibi = ALiBi(self.num_heads, self.learned_slopes, name='alibi') if self.alibi and edges is None else None
    fused = (self.impl != 'explicit' and not self.is_mutable_collection(names.COLLECTION) and not hooked
             and (self.dropout_rate == 0.0 or deterministic))
    # Where the fused kernel runs wider than the heads (ALiBi in the products), the value projection writes
    # that width and the output projection reads it, through zero columns and rows of their kernels.
    wide = 0
    if fused and plan is None and edges is None and values is None and self.output_projection:
      wide = kernel_width(static, time, self.head_dim, self.impl, alibi is not None) - self.head_dim
    v = dense('value', wide)(x) if values is None else values.astype(self.dtype)
    if hooked:
      q, k, v = names.hook(self, 'attn.q', q), names.hook(self, 'attn.k', k), names.hook(self, 'attn.values', v)
    edge_values = None

    if (self.hard or self.numerical_heads) and (plan is not None or edges is not None or self.impl != 'explicit'):
      raise InputError('hard attention (model.hard) and numerical heads are computed by the explicit dense '
                       'attention only')
    if plan is not None:
      out, blocked = blocked_attention(q, k, v, alibi.slopes() if alibi else None, plan, key_mask)
      weights = scatter_weights(blocked, plan, time) if self.is_mutable_collection(names.COLLECTION) else None
      if weights is not None:
        names.hook(self, 'attn.pattern', weights)  # sown (no session reaches this path)
    else:
      mask = jnp.asarray(static)[None]
      if key_mask is not None:
        mask = mask & key_mask[:, None, None, :].astype(bool)
      if edges is None:
        bias = alibi(time, time) if alibi and not fused else None  # a fused kernel takes the slopes
        if bias is not None and self.numerical_heads and not self.numerical_positions:
          bias = bias.at[self.num_heads - self.numerical_heads:].set(0.0)  # a predicate on tokens alone
        if fused:
          # ALiBi is the only bias here (numerical heads are computed explicitly).
          out = fused_attention(q, k, v, None, static, key_mask, self.impl, alibi.slopes() if alibi else None)
          weights = None
        elif hooked or self.numerical_heads:
          logits = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
          logits = logits / jnp.sqrt(jnp.float32(q.shape[-1])) + (0.0 if bias is None else bias)
          scores = names.hook(self, 'attn.scores', jnp.where(mask, logits, -jnp.inf))
          weights = softmax_over_allowed(scores, mask)
          noise = sampling(self)
          keys = jax.random.split(self.make_rng(GUMBEL_RNG)) if noise else (None, None)
          if noise:
            weights = gumbel_perturbed(weights, keys[0], self.gumbel_scale)
          weights = straight_through(weights) if self.hard else weights
          if self.numerical_heads:
            first = self.num_heads - self.numerical_heads
            allowed = jnp.broadcast_to(mask, scores.shape)[:, first:]
            weights = jnp.concatenate(
                [weights[:, :first], predicate_weights(scores[:, first:], allowed, self.hard, keys[1],
                                                       self.gumbel_scale)], axis=1)
            # A numerical head's value is the constant 1 (the "ones" variable): it outputs n = Σ_j S_ij,
            # the number of keys it selects (RASP's selector_width), on every one of its dimensions.
            v = v.at[:, :, first:].set(1.0)
          weights = names.hook(self, 'attn.pattern', weights)
          out = self._read(weights, v, None)
        else:
          out, weights = dot_product_attention(q, k, v, bias, mask)
          if self.hard:
            if sampling(self):
              weights = gumbel_perturbed(weights, self.make_rng(GUMBEL_RNG), self.gumbel_scale)
            weights = straight_through(weights)
            out = self._read(weights, v, None)
          names.hook(self, 'attn.pattern', weights)  # sown (no session reaches this path)
      else:
        e, onehot = edges.table.astype(self.dtype), edges.onehot
        logits = relational_logits(q, k, dense('edge_query')(e), dense('edge_key')(e), onehot)
        allowed = mask & edges.mask[:, None]
        if hooked:
          logits = names.hook(self, 'attn.scores', jnp.where(allowed, logits, -jnp.inf))
        weights = softmax_over_allowed(logits, allowed)
        weights = names.hook(self, 'attn.pattern', weights)
        edge_values = (dense('edge_value')(e) if edges.values is None else edges.values.astype(self.dtype),
                       onehot)
        out = self._read(weights, v, edge_values)
    if self.dropout_rate > 0.0 and not deterministic:
      # Dropout on the weights after they are sown: the readable weights are the model's own.
      drop = nn.Dropout(self.dropout_rate)
      if plan is not None:
        blocked = drop(blocked, deterministic=False)
        out = jnp.einsum('bhnqk,bnkhd->bnqhd', blocked.astype(v.dtype),
                         gather_key_blocks(v, plan)).reshape(batch, -1, *heads)[:, :time]
      else:
        out = self._read(drop(weights, deterministic=False), v, edge_values)

    if hooked:
      out = names.hook(self, 'attn.z', out)
    if self.output_projection:
      result = Projection(d_model, in_axes=2, dtype=self.dtype, kernel_init=named((HEADS, HEAD_DIM, EMBED)),
                          in_pad=wide, name='out')(out)
    else:
      result = out.reshape(batch, time, self.num_heads * self.head_dim)
    return names.hook(self, 'attn.out', result)

  @staticmethod
  def _read(weights: Array, v: Array, edge_values: tuple[Array, Array] | None) -> Array:
    """Σ_j a_ij (v_j + ve_ij): ``[batch, q_time, heads, head_dim]``. ``edge_values``: the per-token edge
    values ``[vocab, heads, head_dim]`` and the edges' one-hot tokens; Σ_j a_ij ve_ij is then the weight
    each query gives each edge token, times that token's value."""
    out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)
    if edge_values is not None:
      per_token, onehot = edge_values
      mass = jnp.einsum('bhqk,bqkv->bhqv', weights, onehot)
      out = out + jnp.einsum('bhqv,vhd->bqhd', mass.astype(v.dtype), per_token)
    return out
