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
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from symjax.model import intermediates as names
from symjax.model.program import GUMBEL_RNG, gumbel_perturbed, sampling, straight_through
from symjax.ops.channels import heads_major, merge_channels, split_channels, tokens_major  # noqa: F401
from symjax.ops.projection import (  # noqa: F401
  VOCAB_PROJECTIONS,
  attention_vocab_projection,
  cudnn_vocab_projection,
  direct_vocab_projection,
  nonnegative_vocab_projection,
  streamed_vocab_projection,
)
from symjax.system.errors import InputError
from symjax.system.mesh import EMBED, HEAD_DIM, HEADS, MLP

Array = jax.Array


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
      raise InputError(f"KroneckerValue init must be one of {sorted(inits)}, got '{self.weight_init}'")
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
      raise InputError(f"ChannelLayerNorm scale must be 'vector' or 'scalar', got '{self.scale}'")
    xh = split_channels(x, self.num_heads).astype(jnp.float32)
    head_dim = xh.shape[-1]
    shape = (self.num_heads, head_dim) if self.scale == 'vector' else (self.num_heads, 1)
    gamma = self.param('scale', nn.initializers.ones, shape)
    beta = self.param('bias', nn.initializers.zeros, shape)
    mean = xh.mean(-1, keepdims=True)
    std = jnp.sqrt(jnp.square(xh - mean).mean(-1, keepdims=True))
    y = gamma * (xh - mean) / (std + self.epsilon) + beta
    return merge_channels(y).astype(x.dtype)


# What each channel's VocabFFN reads (config ``vocab_ffn``): its own channel (eq. 20) or the whole state.
VOCAB_FFN_MIXING = ('channel', 'dense')
# The weights of the FFN's projections (config ``ffn_mixture``): a convex mixture (eq. 22) or non-negative
# weights of free mass (``nonnegative_vocab_projection``).
FFN_MIXTURES = ('convex', 'nonnegative')

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
  hard: bool = False  # program training: the forward pass mixes one token, the argmax (straight-through)
  gumbel_scale: Any = None  # hard only: sample the token at this scale while training (program.sampling)

  @nn.compact
  def __call__(self, z: Array, table: Array) -> Array:
    """z: ``[..., heads, head_dim]``; table: ``[vocab, d_model]``. Returns ``[..., heads, head_dim]``."""
    if self.impl not in VOCAB_PROJECTIONS:
      raise InputError(f"vocab_projection must be one of {sorted(VOCAB_PROJECTIONS)}, got '{self.impl}'")
    if not (math.isfinite(self.tau_init) and self.tau_init > 0):
      raise InputError(f'tau_init must be a finite number > 0, got {self.tau_init}')
    log_tau = self.param('log_tau', nn.initializers.constant(math.log(self.tau_init)), (self.num_heads,))
    if self.weights not in FFN_MIXTURES:
      raise InputError(f'model.ffn_mixture must be one of {list(FFN_MIXTURES)}, got {self.weights!r}')
    if self.weights == 'nonnegative':
      if self.impl != 'direct':
        raise InputError(f"model.ffn_mixture='nonnegative' is computed by the direct projection only; set "
                         f"model.vocab_projection='direct', got {self.impl!r}")
      out, alpha = nonnegative_vocab_projection(z, split_channels(table, self.num_heads), jnp.exp(log_tau),
                                                self.num_valid)
    else:
      out, alpha = VOCAB_PROJECTIONS[self.impl](z, split_channels(table, self.num_heads), jnp.exp(log_tau),
                                                self.chunk_size, self.num_valid)
    if self.hard:
      if alpha is None:
        raise InputError(f"model.hard needs model.vocab_projection='direct', got {self.impl!r}")
      alpha = straight_through(_sampled(self, alpha))
      channels = jnp.swapaxes(split_channels(table, self.num_heads), 0, 1).astype(alpha.dtype)
      out = tokens_major(jnp.einsum('hnv,hvd->hnd', heads_major(alpha), channels), z.shape[:-2])
    if alpha is not None:
      local = 'attn.v_mixture' if self.name == 'value_projection' else 'ffn.mixture'
      replaced = names.hooked(names.site(self, local))
      alpha = names.hook(self, local, alpha)
      if replaced:  # the output is the mixture of the (new) weights: α E per channel
        channels = jnp.swapaxes(split_channels(table, self.num_heads), 0, 1).astype(alpha.dtype)
        out = tokens_major(jnp.einsum('hnv,hvd->hnd', heads_major(alpha), channels), z.shape[:-2])
    if self.gain:
      log_gain = self.param('log_gain', nn.initializers.zeros, (self.num_heads,))
      out = out * jnp.exp(log_gain)[:, None].astype(out.dtype)
    return out.astype(z.dtype)


def _sampled(module: nn.Module, alpha: Array) -> Array:
  """``alpha`` perturbed by the module's Gumbel noise while training (``model.gumbel_scale``, passed the
  GUMBEL_RNG stream), ``alpha`` itself otherwise."""
  if sampling(module):
    return gumbel_perturbed(alpha, module.make_rng(GUMBEL_RNG), module.gumbel_scale)
  return alpha


class CountProjection(nn.Module):
  """What a numerical head writes: a token chosen by the number n of keys it selected (``attention``'s
  numerical heads output n), from a learned table of logits over the vocabulary, one row per n = 0..max_len
  ("Learning Transformer Programs" count with numerical attention and map the count to a categorical
  variable with a lookup-table MLP; here the table is the head's own). It writes the mixture
  softmax(row_n) of channel h's embeddings (eq. 23's form), the argmax token when ``hard``. The soft n is
  not an integer: the row is interpolated between its neighbours, which is also how the hard model's
  gradient reaches the predicate (forward at the integer n, gradient row_{n+1} − row_n). Heads
  ``first..num_heads-1`` are numerical; the others pass through. It sows nothing: the stream after it
  (``blocks.{l}.x_t_mid``) holds what it wrote. z: ``[..., heads, head_dim]`` (a numerical head's n on every
  dimension); table: ``[vocab, d_model]``."""

  num_heads: int
  first: int
  max_len: int
  num_valid: int | None = None
  hard: bool = False
  gumbel_scale: Any = None

  @nn.compact
  def __call__(self, z: Array, table: Array) -> Array:
    vocab = table.shape[0]
    logits = self.param('count_logits', nn.initializers.normal(1.0),
                        (self.num_heads - self.first, self.max_len + 1, vocab))
    n = jnp.clip(z[..., self.first:, 0].astype(jnp.float32), 0, self.max_len)              # [..., k]
    low = jax.lax.stop_gradient(jnp.minimum(jnp.floor(n), self.max_len - 1)).astype(jnp.int32)
    at = lambda i: jax.nn.one_hot(i, self.max_len + 1)
    rows = at(low) + (n - low)[..., None] * (at(low + 1) - at(low))
    scores = jnp.einsum('...hn,hnv->...hv', rows, logits)
    if self.num_valid is not None and self.num_valid < vocab:
      scores = jnp.where(jnp.arange(vocab) < self.num_valid, scores, -jnp.inf)
    alpha = jax.nn.softmax(scores, -1)
    alpha = straight_through(_sampled(self, alpha)) if self.hard else alpha
    channels = split_channels(table, self.num_heads)[:, self.first:]                      # [vocab, k, d]
    out = jnp.einsum('...hv,vhd->...hd', alpha, channels.astype(alpha.dtype))
    return jnp.concatenate([z[..., :self.first, :], out.astype(z.dtype)], axis=-2)


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
  hard: bool = False
  gumbel_scale: Any = None

  @nn.compact
  def __call__(self, x: Array, table: Array) -> Array:
    if self.mixing not in VOCAB_FFN_MIXING:
      raise InputError(f'model.vocab_ffn must be one of {VOCAB_FFN_MIXING}, got {self.mixing!r}')
    named = lambda init, names: nn.with_logical_partitioning(init, names)
    if self.mixing == 'dense':
      d, f = x.shape[-1], self.ff_dim
      w1 = self.param('w1', named(self.kernel_init, (EMBED, MLP)), (d, f))
      b1 = self.param('b1', named(nn.initializers.zeros, (MLP,)), (f,))
      w2 = self.param('w2', named(self.kernel_init, (MLP, EMBED)), (f, d))
      b2 = self.param('b2', named(nn.initializers.zeros, (EMBED,)), (d,))
      x = x.astype(self.dtype)
      hidden = names.hook(self, 'ffn.hidden', nn.gelu(x @ w1.astype(self.dtype) + b1.astype(self.dtype)))
      z = split_channels(hidden @ w2.astype(self.dtype) + b2.astype(self.dtype), self.num_heads)
      out = VocabProjection(self.num_heads, self.tau_init, self.impl, self.chunk_size, self.num_valid,
                            self.gain, self.weights, self.hard, self.gumbel_scale, name='projection')(z, table)
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
    hidden = names.hook(self, 'ffn.hidden', hidden)  # [heads, batch·time, ff]
    z = jnp.einsum('hnf,hfd->hnd', hidden, w2.astype(self.dtype)) + b2[:, None].astype(self.dtype)
    z = tokens_major(z, xh.shape[:-2])
    out = VocabProjection(self.num_heads, self.tau_init, self.impl, self.chunk_size, self.num_valid,
                          self.gain, self.weights, self.hard, self.gumbel_scale, name='projection')(z, table)
    return merge_channels(out)
