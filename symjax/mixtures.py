"""The exact token-mixture decomposition of a Symbolic Transformer's streams ("Symbolic Transformers",
Property 5.6 and Theorem 6.4).

In an all-symbolic model every update is a convex mixture of each channel's embedding rows E^(h):
X_t^0 is the token's own row, each attention update is Σ_s A[h, i, s] α_v[s, h] E^(h) and each FFN update
is α_f[i, h] E^(h). So after layer l, channel h of X_t at position i equals w_t[i, h] E^(h) with
non-negative coefficients summing to l + 1, and X_e equals w_e[i, h] E^(h) with coefficients summing to l.
``mixture_trace`` builds these coefficient tensors from the sown attention weights and mixtures; they are
the explicit decomposition, not an approximation, and ``reconstruct`` checks them against the streams.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from symjax.model import Transformer


@dataclasses.dataclass
class MixtureTrace:
  """Per layer l (index 0 is the input): coefficients ``[batch, time, heads, vocab]`` of X_t and X_e."""

  x_t: list[np.ndarray]
  x_e: list[np.ndarray]
  streams_t: list[np.ndarray]  # the model's own X_t after each layer, [batch, time, d_model]
  streams_e: list[np.ndarray]


def mixture_trace(model: Transformer, params, tokens) -> MixtureTrace:
  """Runs the model and returns the mixture coefficients of every stream after every layer.

  Needs an all-symbolic model with the direct vocabulary projection (the streamed one keeps no α).
  """
  cfg = model.config
  if cfg.layer_kinds() != ('symbolic',) * cfg.num_layers:
    raise ValueError('the exact mixture trace needs every layer symbolic (model.kind="symbolic", '
                     f'symbolic_layers=None); this model has layers {cfg.layer_kinds()}')
  if cfg.vocab_projection != 'direct':
    raise ValueError("the exact mixture trace reads the mixtures α: use model.vocab_projection='direct'")
  tokens = jnp.asarray(tokens)
  _, state = model.apply({'params': params}, tokens, mutable=['intermediates'])
  inter = jax.tree.map(lambda x: np.asarray(x, np.float64), state['intermediates'])
  vocab = cfg.padded_vocab_size
  w_t = np.repeat(np.eye(vocab)[np.asarray(tokens)][:, :, None, :], cfg.num_heads, axis=2)
  w_e = np.zeros_like(w_t)
  trace = MixtureTrace([w_t], [w_e], [inter['x_t_0'][0]], [inter['x_e_0'][0]])
  for l in range(cfg.num_layers):
    layer = inter[f'layer_{l}']
    attention = layer['attention']['weights'][0]                       # [b, h, i, s]
    alpha_v = layer['value_projection']['mixture'][0]                  # [b, s, h, v]
    w_t = w_t + np.einsum('bhis,bshv->bihv', attention, alpha_v)
    w_e = w_e + layer['ffn']['projection']['mixture'][0]
    trace.x_t.append(w_t)
    trace.x_e.append(w_e)
    trace.streams_t.append(layer['x_t_ffn'][0])
    trace.streams_e.append(layer['x_e_ffn'][0])
  return trace


def reconstruct(weights: np.ndarray, table: np.ndarray, num_heads: int) -> np.ndarray:
  """Σ_v w[..., h, v] E^(h)_v for every channel: ``[..., heads, vocab]`` -> ``[..., d_model]``."""
  table = np.asarray(table, np.float64)
  head_dim = table.shape[1] // num_heads
  per_head = np.einsum('...hv,vhd->...hd', weights, table.reshape(table.shape[0], num_heads, head_dim))
  return per_head.reshape(*per_head.shape[:-2], -1)


def reconstruction_error(trace: MixtureTrace, table, num_heads: int) -> float:
  """The largest relative error of Σ w E^(h) against the model's own streams, over layers and streams."""
  errors = []
  for weights, streams in ((trace.x_t, trace.streams_t), (trace.x_e, trace.streams_e)):
    for w, x in zip(weights, streams):
      scale = max(np.abs(x).max(), 1e-30)
      errors.append(np.abs(reconstruct(w, table, num_heads) - x).max() / scale)
  return float(max(errors))
