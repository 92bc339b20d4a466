"""How heads and FFN channels exchange information: the mixings of "The Dual-Stream Transformer" (Kerce &
Fox 2026), at the attention's value map, its output map and the FFN.

A hidden vector ``[..., d_model]`` is read as ``[..., heads, head_dim]`` (channel h holds features
``h * head_dim : (h + 1) * head_dim``). Three strengths of mixing, from none to a standard transformer's:

- independent: channel h maps to channel h alone, through its own ``[head_dim, head_dim]`` matrix (the value
  map; as the output map it is no map at all, since a per-head map after the read composes with the one
  before it) or its own MLP (the FFN);
- kronecker: W ⊗ I_{head_dim}, H² parameters: channel h receives a weighted sum of every channel, each
  feature from the same feature ("Symbolic Transformers", eq. 10; ``symbolic.KroneckerValue``);
- dense: one ``[d_model, d_model]`` matrix, or the standard MLP.

Every value and output map starts at the identity, so that at initialisation the three mixings compute
the same function and a comparison of them measures what each lets the model learn, not where it starts.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from symjax.model import intermediates as names
from symjax.model.symbolic import KroneckerValue
from symjax.ops.channels import merge_channels, split_channels
from symjax.system.mesh import EMBED, HEAD_DIM, HEADS, MLP

Array = jax.Array


def _identity(key, shape, dtype=jnp.float32):
  """Per head the identity: ``[heads, d, d]`` of eyes, or a ``[d_model, heads, head_dim]`` kernel that maps
  every feature to itself."""
  del key
  if len(shape) == 3 and shape[1] == shape[2]:
    return jnp.broadcast_to(jnp.eye(shape[1], dtype=dtype), shape)
  return jnp.eye(shape[0], dtype=dtype).reshape(shape)


class HeadwiseMap(nn.Module):
  """y_h = x_h W[h], one ``[head_dim, head_dim]`` matrix per channel, from the identity. Input
  ``[..., d_model]``, output ``[..., heads, head_dim]``."""

  num_heads: int

  @nn.compact
  def __call__(self, x: Array) -> Array:
    xh = split_channels(x, self.num_heads)
    init = nn.with_logical_partitioning(_identity, (HEADS, HEAD_DIM, None))
    w = self.param('kernel', init, (self.num_heads, xh.shape[-1], xh.shape[-1]))
    return jnp.einsum('...hd,hde->...he', xh, nn.meta.unbox(w).astype(x.dtype))


class DenseMap(nn.Module):
  """y = x W, one ``[d_model, heads, head_dim]`` matrix over every channel, from the identity. Input
  ``[..., d_model]``, output ``[..., heads, head_dim]``."""

  num_heads: int

  @nn.compact
  def __call__(self, x: Array) -> Array:
    d = x.shape[-1]
    init = nn.with_logical_partitioning(_identity, (EMBED, HEADS, HEAD_DIM))
    w = self.param('kernel', init, (d, self.num_heads, d // self.num_heads))
    return jnp.einsum('...d,dhe->...he', x, nn.meta.unbox(w).astype(x.dtype))


def head_map(mixing: str, num_heads: int, name: str, kronecker_init: str = 'identity') -> nn.Module:
  """The map over heads a mixing names: 'independent' (``HeadwiseMap``), 'kronecker' (W ⊗ I) or 'dense'."""
  if mixing == 'independent':
    return HeadwiseMap(num_heads, name=name)
  if mixing == 'kronecker':
    return KroneckerValue(num_heads, kronecker_init, name=name)
  return DenseMap(num_heads, name=name)


class ChannelMLP(nn.Module):
  """The independent FFN: channel h's own MLP W2[h] gelu(x_h W1[h] + b1[h]) + b2[h], head_dim → ff_dim / heads →
  head_dim (GELU: tanh approximation), so no feature of one channel reaches another. Input and output
  ``[..., d_model]``; the hidden units ``[..., ff_dim]`` (channel h's are ``h * ff_dim / heads`` onward) pass
  the site ``ffn.hidden``."""

  num_heads: int
  ff_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    xh = split_channels(x, self.num_heads)
    H, dh, width = self.num_heads, xh.shape[-1], self.ff_dim // self.num_heads
    init = lambda axes: nn.with_logical_partitioning(nn.initializers.normal(0.02), axes)
    wi = nn.meta.unbox(self.param('wi', init((HEADS, HEAD_DIM, MLP)), (H, dh, width)))
    bi = self.param('bi', nn.initializers.zeros, (H, width))
    wo = nn.meta.unbox(self.param('wo', init((HEADS, MLP, HEAD_DIM)), (H, width, dh)))
    bo = self.param('bo', nn.initializers.zeros, (H, dh))
    hidden = nn.gelu(jnp.einsum('...hd,hdf->...hf', xh.astype(self.dtype), wi.astype(self.dtype)) + bi)
    hidden = split_channels(names.hook(self, 'ffn.hidden', merge_channels(hidden)), H)
    out = jnp.einsum('...hf,hfd->...hd', hidden, wo.astype(self.dtype)) + bo
    return merge_channels(out.astype(self.dtype))
