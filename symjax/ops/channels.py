"""The channel layout of "Symbolic Transformers" (Kerce & Fox 2025, §5): a hidden vector ``[..., d_model]`` is
read as ``[..., heads, head_dim]``, channel h holding features ``h * head_dim : (h + 1) * head_dim`` (the same
split the attention heads use)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

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
