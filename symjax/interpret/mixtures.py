"""The exact token-mixture decomposition of a Symbolic Transformer's streams ("Symbolic Transformers",
Property 5.6 and Theorem 6.4).

In an all-symbolic model every update is a convex mixture of each channel's embedding rows E^(h):
X_t^0 is the token's own row, each attention update is Σ_s A[h, i, s] α_v[s, h] E^(h) and each FFN update
is α_f[i, h] E^(h). So after layer l, channel h of X_t at position i equals w_t[i, h] E^(h) with
non-negative coefficients summing to l + 1, and X_e equals w_e[i, h] E^(h) with coefficients summing to l.
``mixture_trace`` builds these coefficient tensors — and every term on its own, each of mass 1 — from the
sown attention weights and mixtures; they are the explicit decomposition, not an approximation, and
``reconstruct`` checks them against the streams.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from symjax.interpret import core
from symjax.model import Transformer
from symjax.system.errors import InputError


@dataclasses.dataclass
class MixtureTrace:
  """Coefficients ``[batch, time, heads, vocab]``; lists are indexed by layer (0 is the input)."""

  x_t: list[np.ndarray]          # X_t after each layer: Σ of the input term and the attention terms
  x_e: list[np.ndarray]          # X_e after each layer: Σ of the FFN terms
  attention_terms: list[np.ndarray]  # layer l's attention update Σ_s A[h,i,s] α_v[s,h]: mass 1 each
  ffn_terms: list[np.ndarray]        # layer l's FFN update α_f: mass 1 each
  streams_t: list[np.ndarray]    # the model's own X_t after each layer, [batch, time, d_model]
  streams_e: list[np.ndarray]

  @property
  def x(self) -> list[np.ndarray]:
    """Coefficients of the whole state X = X_t + X_e (mass 2l + 1)."""
    return [t + e for t, e in zip(self.x_t, self.x_e)]


@core.takes_hooked_model
def mixture_trace(model: Transformer, params, tokens, key_mask=None) -> MixtureTrace:
  """Runs the model and returns the mixture coefficients of every stream after every layer.

  Needs an all-symbolic model. A model trained with the streamed projection is run with the direct one
  (same parameters), which keeps the mixtures α.
  """
  cfg = model.config
  if not cfg.exact_mixtures:
    raise InputError('the exact mixture trace needs every layer symbolic with both sites projected, no '
                     'gain and convex FFN mixtures (model.kind="symbolic", symbolic_layers=None, '
                     'symbolic_sites="both", projection_gain=False, ffn_mixture="convex"); this model has '
                     f'layers {cfg.layer_kinds()}, symbolic_sites {cfg.symbolic.symbolic_sites!r}, projection_gain='
                     f'{cfg.symbolic.projection_gain}, ffn_mixture {cfg.symbolic.ffn_mixture!r}')
  model = core.analysis_model(model)
  tokens = core.as_batch(tokens, model.config.vocab_size)
  _, inter = core.run(model, params, tokens, key_mask)
  return from_intermediates(cfg, tokens, inter)


def from_intermediates(cfg, tokens: np.ndarray, inter) -> MixtureTrace:
  """The same from the intermediates of a run already made (``core.run`` of an all-symbolic model with
  the direct projection) on ``tokens`` ``[batch, time]``."""
  vocab = cfg.padded_vocab_size
  w_t = np.repeat(np.eye(vocab)[tokens][:, :, None, :], cfg.num_heads, axis=2)
  w_e = np.zeros_like(w_t)
  trace = MixtureTrace([w_t], [w_e], [], [], [inter['embed']], [np.zeros_like(inter['embed'])])
  for l in range(cfg.num_layers):
    b = f'blocks.{l}.'
    attention = inter[b + 'attn.pattern']                           # [b, h, i, s]
    alpha_v = inter[b + 'attn.v_mixture']                           # [b, s, h, v]
    term_t = np.einsum('bhis,bshv->bihv', attention, alpha_v)
    term_e = inter[b + 'ffn.mixture']
    w_t, w_e = w_t + term_t, w_e + term_e
    trace.attention_terms.append(term_t)
    trace.ffn_terms.append(term_e)
    trace.x_t.append(w_t)
    trace.x_e.append(w_e)
    trace.streams_t.append(inter[b + 'x_t'])
    trace.streams_e.append(inter[b + 'x_e'])
  return trace


def reconstruct(weights: np.ndarray, table: np.ndarray, num_heads: int) -> np.ndarray:
  """Σ_v w[..., h, v] E^(h)_v for every channel: ``[..., heads, vocab]`` -> ``[..., d_model]``."""
  table = np.asarray(table, np.float64)
  head_dim = table.shape[1] // num_heads
  per_head = np.einsum('...hv,vhd->...hd', weights, table.reshape(table.shape[0], num_heads, head_dim))
  return per_head.reshape(*per_head.shape[:-2], -1)


def reconstruction_errors(trace: MixtureTrace, table, num_heads: int) -> dict[str, list[float]]:
  """Relative error max|Σ w E^(h) − X| / max|X| of X_t, X_e and X_t + X_e after every layer."""
  errors: dict[str, list[float]] = {'x_t': [], 'x_e': [], 'x': []}
  for l in range(len(trace.x_t)):
    pairs = {'x_t': (trace.x_t[l], trace.streams_t[l]), 'x_e': (trace.x_e[l], trace.streams_e[l]),
             'x': (trace.x_t[l] + trace.x_e[l], trace.streams_t[l] + trace.streams_e[l])}
    for name, (w, x) in pairs.items():
      scale = max(np.abs(x).max(), 1e-30)
      errors[name].append(float(np.abs(reconstruct(w, table, num_heads) - x).max() / scale))
  return errors


def reconstruction_error(trace: MixtureTrace, table, num_heads: int) -> float:
  """The largest relative error over layers and streams (see ``reconstruction_errors``)."""
  return max(max(v) for v in reconstruction_errors(trace, table, num_heads).values())
