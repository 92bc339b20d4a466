"""The channel-structured pieces of "Symbolic Transformers" (Kerce & Fox 2025).

- ``KroneckerValue``: the value map W̃_V = W_head ⊗ I_{d_head} (§4.4.1, eqs. 9-10), applied as a contraction
  over the head axis so that the D×D Kronecker product never exists.
- ``ChannelLayerNorm``: LayerNorm with statistics per head channel (Definition 5.1, eqs. 17-18).
- ``vocab_projection`` / ``VocabProjection``: per channel h, α_h = softmax(z_h E^(h)ᵀ / τ_h) and output
  α_h E^(h) (eqs. 21-22), where E^(h) is the h-th d_head slice of the input token embedding table.
- ``VocabFFN``: per-channel two-layer FFN followed by the vocabulary projection (Definition 5.3,
  eqs. 19-22).

A hidden vector ``[..., d_model]`` is read as ``[..., heads, head_dim]``: channel h holds features
``h * head_dim : (h + 1) * head_dim``, the same split the attention heads use.
"""

from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from symjax import streamed
from symjax.attention import require_gpu
from symjax.mesh import EMBED, HEAD_DIM, HEADS, MLP

Array = jax.Array


def split_channels(x: Array, num_heads: int) -> Array:
  """``[..., d_model]`` -> ``[..., heads, head_dim]``."""
  return x.reshape(*x.shape[:-1], num_heads, x.shape[-1] // num_heads)


def merge_channels(x: Array) -> Array:
  """``[..., heads, head_dim]`` -> ``[..., d_model]``."""
  return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def heads_major(x: Array) -> Array:
  """``[..., heads, k]`` -> ``[heads, tokens, k]`` with every leading axis flattened into tokens."""
  return jnp.swapaxes(x.reshape(-1, *x.shape[-2:]), 0, 1)


def tokens_major(x: Array, lead: tuple[int, ...]) -> Array:
  """``[heads, tokens, k]`` -> ``[*lead, heads, k]``, the inverse of ``heads_major``."""
  return jnp.swapaxes(x, 0, 1).reshape(*lead, *x.shape[::2])


class KroneckerValue(nn.Module):
  """v_h = Σ_j W_head[h, j] x_j: the map (W_head ⊗ I_{d_head}) x of eq. 10, with H² parameters.

  ``weight_init``: ``'identity'`` (each channel starts as its own value) or ``'normal'`` (N(0, 0.02²)).
  Input ``[..., d_model]``, output ``[..., heads, head_dim]``.
  """

  num_heads: int
  weight_init: str = 'identity'

  @nn.compact
  def __call__(self, x: Array) -> Array:
    inits = {'identity': lambda key, shape: jnp.eye(shape[0], dtype=jnp.float32),
             'normal': nn.initializers.normal(0.02)}
    if self.weight_init not in inits:
      raise ValueError(f"KroneckerValue init must be one of {sorted(inits)}, got '{self.weight_init}'")
    w_head = self.param('w_head', inits[self.weight_init], (self.num_heads, self.num_heads))
    return jnp.einsum('hg,...gd->...hd', w_head.astype(x.dtype), split_channels(x, self.num_heads))


class ChannelLayerNorm(nn.Module):
  """N_h(x_h) = γ_h (x_h − μ_h) / (σ_h + ε) + β_h for each channel h (eq. 18).

  μ_h and σ_h are the mean and (biased) standard deviation over the channel's d_head features; ε is added
  to σ as the paper writes it. ``scale='vector'`` learns γ_h, β_h ∈ R^{d_head}; ``scale='scalar'`` learns one
  γ_h and one β_h per channel. Input and output ``[..., d_model]``; statistics in float32.
  """

  num_heads: int
  scale: str = 'vector'
  epsilon: float = 1e-5

  @nn.compact
  def __call__(self, x: Array) -> Array:
    if self.scale not in ('vector', 'scalar'):
      raise ValueError(f"ChannelLayerNorm scale must be 'vector' or 'scalar', got '{self.scale}'")
    xh = split_channels(x, self.num_heads).astype(jnp.float32)
    head_dim = xh.shape[-1]
    shape = (self.num_heads, head_dim) if self.scale == 'vector' else (self.num_heads, 1)
    gamma = self.param('scale', nn.initializers.ones, shape)
    beta = self.param('bias', nn.initializers.zeros, shape)
    mean = xh.mean(-1, keepdims=True)
    std = jnp.sqrt(jnp.square(xh - mean).mean(-1, keepdims=True))
    y = gamma * (xh - mean) / (std + self.epsilon) + beta
    return merge_channels(y).astype(x.dtype)


def direct_vocab_projection(z: Array, table: Array, tau: Array, chunk: int = 0,
                            num_valid: int | None = None) -> tuple[Array, Array]:
  """α = softmax(z Eᵀ / τ) per channel, and α E (eqs. 21-22), computed in one piece.

  Args:
    z: ``[..., heads, head_dim]``.
    table: ``[vocab, heads, head_dim]`` — the embedding table split into channels, E^(h) = table[:, h].
    tau: ``[heads]``, positive.
    chunk: unused (the streamed implementation's chunk size).
    num_valid: rows from this index on are padding and get no weight.

  Returns:
    The projection ``[..., heads, head_dim]`` and the mixture α ``[..., heads, vocab]``, float32 (float64
    for float64 inputs under ``jax.enable_x64``). Memory is O(tokens · heads · vocab).
  """
  del chunk
  vocab = table.shape[0]
  if num_valid is not None and num_valid < vocab:
    valid = jnp.arange(vocab) < num_valid
    return _weighted_rows(z, table, tau, lambda logits: jax.nn.softmax(jnp.where(valid, logits, -jnp.inf), -1))
  return _weighted_rows(z, table, tau, lambda logits: jax.nn.softmax(logits, -1))


def _weighted_rows(z: Array, table: Array, tau: Array, weigh: Callable[[Array], Array]) -> tuple[Array, Array]:
  """(α E per channel, α) with α = weigh(z Eᵀ / τ) ``[heads, tokens, vocab]``: the one computation the
  direct projections share."""
  # Heads-major products ([heads, tokens, ...], the head axis leading as a batch axis): on CPU the
  # backward pass of the tokens-major einsum transposes every operand and runs about 1.6× slower.
  # 1/τ scales the queries ([h, n, d]) rather than the logits ([h, n, v], usually the larger).
  zh, th = heads_major(z / tau[:, None].astype(z.dtype)), jnp.swapaxes(table, 0, 1)  # [h, n, d], [h, v, d]
  acc = jnp.promote_types(z.dtype, jnp.float32)  # float32 for the model; float64 for the float64 readings
  logits = jnp.einsum('hnd,hvd->hnv', zh, th.astype(z.dtype), preferred_element_type=acc)
  alpha = weigh(logits)                                                  # [h, n, v]
  out = jnp.einsum('hnv,hvd->hnd', alpha, th.astype(acc))
  return tokens_major(out, z.shape[:-2]), tokens_major(alpha, z.shape[:-2])


def nonnegative_vocab_projection(z: Array, table: Array, tau: Array, num_valid: int | None = None
                                 ) -> tuple[Array, Array]:
  """Opt-in, not eq. 22: α = softplus(z Eᵀ / τ) / |V| per channel, and α E. Every weight is positive but
  they need not sum to 1, so the output is a non-negative combination of the channel's token embeddings of
  any mass (at z = 0 the mass is log 2). Same arguments and shapes as ``direct_vocab_projection``;
  ``|V|`` counts the valid rows only and padding rows get weight 0."""
  vocab = table.shape[0]
  valid = vocab if num_valid is None else min(num_valid, vocab)
  if valid < vocab:
    keep = jnp.arange(vocab) < valid
    return _weighted_rows(z, table, tau, lambda logits: jnp.where(keep, jax.nn.softplus(logits) / valid, 0.0))
  return _weighted_rows(z, table, tau, lambda logits: jax.nn.softplus(logits) / valid)


def streamed_vocab_projection(z: Array, table: Array, tau: Array, chunk: int = 1024,
                              num_valid: int | None = None) -> tuple[Array, None]:
  """The same projection streamed over ``chunk`` vocabulary rows (``streamed.softmax_mix``), sharded over
  the 'vocab' mesh axis when one is active. Memory is O(tokens · heads · chunk); α is not kept.

  τ divides the queries outside the custom-gradient op, so its gradient comes from autodiff.
  """
  q = z / tau[:, None].astype(z.dtype)
  heads, dim = z.shape[-2:]
  out = streamed.vocab_mix(q.reshape(-1, heads, dim), table, chunk, num_valid)
  return out.reshape(z.shape), None


def attention_vocab_projection(z: Array, table: Array, tau: Array, chunk: int = 0,
                               num_valid: int | None = None, implementation: str = 'cudnn'
                               ) -> tuple[Array, None]:
  """The same projection as one attention call: for channel h, softmax(q_h E^(h)ᵀ) E^(h) with q_h = z_h / τ_h
  is attention with the tokens as queries and the vocabulary rows as both keys and values (scale 1).
  ``implementation='cudnn'`` runs it through cuDNN's fused flash-attention kernel (NVIDIA GPU, 16-bit
  inputs; forward and backward stream over vocabulary blocks with an online softmax, so α never exists in
  memory); ``'xla'`` is the same call through XLA (it forms α; for checking on any backend). Padding rows
  are excluded through the key length. Gradients reach the table through both the keys and the values, and
  τ through the queries. The vocabulary is not sharded here: under a 'vocab' mesh axis XLA gathers it.
  """
  del chunk
  if implementation == 'cudnn':
    require_gpu('model.vocab_projection', implementation, ('direct', 'streamed'))
  heads, dim = z.shape[-2:]
  q = (z / tau[:, None].astype(z.dtype)).reshape(1, -1, heads, dim)       # [1, tokens, heads, head_dim]
  kv = table.astype(q.dtype)[None]                                         # [1, vocab, heads, head_dim]
  vocab = table.shape[0]
  if implementation == 'cudnn' and vocab % 64:
    # cuDNN refused |V| = 50,257 keys for training ("Unsupported sequence length" on an H100): zero rows pad
    # the table to a multiple of 64 and the key length excludes them.
    kv = jnp.pad(kv, ((0, 0), (0, -vocab % 64), (0, 0), (0, 0)))
    num_valid = vocab if num_valid is None else num_valid
  lengths = None if num_valid is None else jnp.full((1,), num_valid, jnp.int32)
  out = jax.nn.dot_product_attention(q, kv, kv, scale=1.0, key_value_seq_lengths=lengths,
                                     implementation=implementation)
  return out.reshape(z.shape), None


def cudnn_vocab_projection(z: Array, table: Array, tau: Array, chunk: int = 0,
                           num_valid: int | None = None) -> tuple[Array, None]:
  """``attention_vocab_projection`` through cuDNN's fused flash attention (NVIDIA GPUs, bfloat16)."""
  return attention_vocab_projection(z, table, tau, chunk, num_valid, 'cudnn')


# What each channel's VocabFFN reads (config ``vocab_ffn``): its own channel (eq. 20) or the whole state.
VOCAB_FFN_MIXING = ('channel', 'dense')
# The weights of the FFN's projections (config ``ffn_mixture``): a convex mixture (eq. 22) or non-negative
# weights of free mass (``nonnegative_vocab_projection``).
FFN_MIXTURES = ('convex', 'nonnegative')

# Implementations of the vocabulary projection, chosen by name (config ``vocab_projection``). Each maps
# (z, table, tau, chunk, num_valid) to (projection, mixture or None).
VOCAB_PROJECTIONS: dict[str, Callable[..., tuple[Array, Array | None]]] = {
    'direct': direct_vocab_projection,
    'streamed': streamed_vocab_projection,
    'cudnn': cudnn_vocab_projection,
}


class VocabProjection(nn.Module):
  """VocabProj_h(z_h) = α_h E^(h) with α_h = softmax(z_h E^(h)ᵀ / τ_h) (eqs. 21-22).

  τ_h is learned per channel through its logarithm, which keeps it positive. ``table`` is the model's input
  embedding table ``[vocab, d_model]`` (shared, not a parameter of this module), so the output of every
  channel lies in the convex hull of that channel's token embeddings (eq. 23).

  Sows ``mixture`` α ``[..., heads, vocab]`` into ``intermediates`` when the implementation provides it.
  """

  num_heads: int
  tau_init: float = 1.0
  impl: str = 'direct'
  chunk_size: int = 1024
  num_valid: int | None = None  # rows of the table from this index on are padding
  gain: bool = False  # opt-in: scale channel h by a learned g_h = exp(log_gain_h) > 0 (starts at 1)
  weights: str = 'convex'  # 'convex' (eq. 22) or 'nonnegative' (opt-in: nonnegative_vocab_projection)

  @nn.compact
  def __call__(self, z: Array, table: Array) -> Array:
    """z: ``[..., heads, head_dim]``; table: ``[vocab, d_model]``. Returns ``[..., heads, head_dim]``."""
    if self.impl not in VOCAB_PROJECTIONS:
      raise ValueError(f"vocab_projection must be one of {sorted(VOCAB_PROJECTIONS)}, got '{self.impl}'")
    if not (math.isfinite(self.tau_init) and self.tau_init > 0):
      raise ValueError(f'tau_init must be a finite number > 0, got {self.tau_init}')
    log_tau = self.param('log_tau', nn.initializers.constant(math.log(self.tau_init)), (self.num_heads,))
    if self.weights not in FFN_MIXTURES:
      raise ValueError(f'model.ffn_mixture must be one of {list(FFN_MIXTURES)}, got {self.weights!r}')
    if self.weights == 'nonnegative':
      if self.impl != 'direct':
        raise ValueError(f"model.ffn_mixture='nonnegative' is computed by the direct projection only; set "
                         f"model.vocab_projection='direct', got {self.impl!r}")
      out, alpha = nonnegative_vocab_projection(z, split_channels(table, self.num_heads), jnp.exp(log_tau),
                                                self.num_valid)
    else:
      out, alpha = VOCAB_PROJECTIONS[self.impl](z, split_channels(table, self.num_heads), jnp.exp(log_tau),
                                                self.chunk_size, self.num_valid)
    if alpha is not None:
      self.sow('intermediates', 'mixture', alpha)
    if self.gain:
      log_gain = self.param('log_gain', nn.initializers.zeros, (self.num_heads,))
      out = out * jnp.exp(log_gain)[:, None].astype(out.dtype)
    return out.astype(z.dtype)


class VocabFFN(nn.Module):
  """VocabFFN(x) = ⊕_h VocabProj_h(FFN_h(x_h)) (eqs. 19-20).

  FFN_h(x_h) = W2_h gelu(W1_h x_h + b1_h) + b2_h maps d_head -> ff_dim -> d_head for every channel at once
  (one contraction with a head axis). GELU is the tanh approximation. Input and output ``[..., d_model]``.

  ``mixing='dense'`` (opt-in, not eq. 20): z = W2 gelu(W1 x + b1) + b2 reads the whole normalised state,
  d_model -> ff_dim -> d_model (the Token-Factored FFN's shape), and channel h of z goes through
  VocabProj_h. Only the FFN's input differs: every update is still a convex mixture of channel h's
  embeddings (eq. 23), so the model reads exactly as tokens as the paper's does.
  """

  num_heads: int
  ff_dim: int
  tau_init: float = 1.0
  impl: str = 'direct'
  chunk_size: int = 1024
  num_valid: int | None = None
  dtype: jnp.dtype = jnp.float32
  gain: bool = False
  kernel_init: Callable = nn.initializers.normal(0.02)
  mixing: str = 'channel'  # 'channel' (eq. 20: FFN_h reads x_h) or 'dense' (every FFN_h reads all of x)
  weights: str = 'convex'  # the projection's weights: 'convex' (eq. 22) or 'nonnegative' (opt-in)

  @nn.compact
  def __call__(self, x: Array, table: Array) -> Array:
    if self.mixing not in VOCAB_FFN_MIXING:
      raise ValueError(f'model.vocab_ffn must be one of {VOCAB_FFN_MIXING}, got {self.mixing!r}')
    named = lambda init, names: nn.with_logical_partitioning(init, names)
    if self.mixing == 'dense':
      d, f = x.shape[-1], self.ff_dim
      w1 = self.param('w1', named(self.kernel_init, (EMBED, MLP)), (d, f))
      b1 = self.param('b1', named(nn.initializers.zeros, (MLP,)), (f,))
      w2 = self.param('w2', named(self.kernel_init, (MLP, EMBED)), (f, d))
      b2 = self.param('b2', named(nn.initializers.zeros, (EMBED,)), (d,))
      x = x.astype(self.dtype)
      hidden = nn.gelu(x @ w1.astype(self.dtype) + b1.astype(self.dtype))
      z = split_channels(hidden @ w2.astype(self.dtype) + b2.astype(self.dtype), self.num_heads)
      out = VocabProjection(self.num_heads, self.tau_init, self.impl, self.chunk_size, self.num_valid,
                            self.gain, self.weights, name='projection')(z, table)
      return merge_channels(out)
    xh = split_channels(x, self.num_heads).astype(self.dtype)
    head_dim = xh.shape[-1]
    h, f = self.num_heads, self.ff_dim
    w1 = self.param('w1', named(self.kernel_init, (HEADS, HEAD_DIM, MLP)), (h, head_dim, f))
    b1 = self.param('b1', named(nn.initializers.zeros, (HEADS, MLP)), (h, f))
    w2 = self.param('w2', named(self.kernel_init, (HEADS, MLP, HEAD_DIM)), (h, f, head_dim))
    b2 = self.param('b2', named(nn.initializers.zeros, (HEADS, HEAD_DIM)), (h, head_dim))
    # Heads-major, as in direct_vocab_projection: the per-channel products are batched over the head axis.
    hidden = nn.gelu(jnp.einsum('hnd,hdf->hnf', heads_major(xh), w1.astype(self.dtype))
                     + b1[:, None].astype(self.dtype))
    z = jnp.einsum('hnf,hfd->hnd', hidden, w2.astype(self.dtype)) + b2[:, None].astype(self.dtype)
    z = tokens_major(z, xh.shape[:-2])
    out = VocabProjection(self.num_heads, self.tau_init, self.impl, self.chunk_size, self.num_valid,
                          self.gain, self.weights, name='projection')(z, table)
    return merge_channels(out)
