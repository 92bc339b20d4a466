"""Relational attention (Diao & Loynd 2022, as "Beyond Transformers with PyNeuraLogic" writes it) over the
edges of a graph: node i attends only to the j an edge allows, its query and key for the pair are
q_i + W_qe e_ij and k_j + W_ke e_ij, and the value it reads is v_j + ve_ij. Edge projections are computed
once per vocabulary row and picked per pair through one-hot edge tokens.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from symjax.ops.attention import relational_logits, softmax_over_allowed

Array = jax.Array


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


def read(weights: Array, v: Array, edge_values: tuple[Array, Array] | None) -> Array:
  """Σ_j a_ij (v_j + ve_ij): ``[batch, q_time, heads, head_dim]``. ``edge_values``: the per-token edge
  values ``[vocab, heads, head_dim]`` and the edges' one-hot tokens; Σ_j a_ij ve_ij is then the weight
  each query gives each edge token, times that token's value."""
  out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v)
  if edge_values is not None:
    per_token, onehot = edge_values
    mass = jnp.einsum('bhqk,bqkv->bhqv', weights, onehot)
    out = out + jnp.einsum('bhqv,vhd->bqhd', mass.astype(v.dtype), per_token)
  return out


def weights(q: Array, k: Array, edge_q: Array, edge_k: Array, edges: Edges, allowed: Array, hook) -> Array:
  """The attention weights over the edges' allowed pairs ``[batch, heads, q_time, k_time]``; ``hook``
  passes the scores and the weights through their named sites."""
  logits = relational_logits(q, k, edge_q, edge_k, edges.onehot)
  allowed = allowed & edges.mask[:, None]
  scores = hook('attn.scores', jnp.where(allowed, logits, -jnp.inf))
  return hook('attn.pattern', softmax_over_allowed(scores, allowed))
