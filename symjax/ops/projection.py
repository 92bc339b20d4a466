"""The vocabulary projection of "Symbolic Transformers" (Kerce & Fox 2025, eqs. 21-22), per channel h:
α_h = softmax(z_h E^(h)ᵀ / τ_h) and output α_h E^(h), in the implementations ``model.vocab_projection``
chooses from by name (``VOCAB_PROJECTIONS``), and the opt-in non-negative variant. The module that owns τ
and sows α is ``symjax.model.symbolic.VocabProjection``.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from symjax.ops import streamed
from symjax.ops.attention import require_gpu
from symjax.ops.channels import heads_major, tokens_major

Array = jax.Array


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


# Implementations of the vocabulary projection, chosen by name (config ``vocab_projection``). Each maps
# (z, table, tau, chunk, num_valid) to (projection, mixture or None).
VOCAB_PROJECTIONS: dict[str, Callable[..., tuple[Array, Array | None]]] = {
    'direct': direct_vocab_projection,
    'streamed': streamed_vocab_projection,
    'cudnn': cudnn_vocab_projection,
}
