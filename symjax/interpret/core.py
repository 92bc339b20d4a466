"""Shared pieces of the interpretability tools: running a model for its intermediates, the streams and
updates of every layer, the channel lens, the final normalisation written out, and the learned
per-head parameters (ALiBi slopes, τ, W_head).

Notation ("Symbolic Transformers"): after layer l the two-stream models hold X_t^l and X_e^l
(``[batch, time, d_model]``); the standard model holds one residual stream x^l. Channel h of a vector is
its slice ``[h·d_head, (h+1)·d_head)``; E^(h) is the same slice of the input embedding table.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from symjax import model as model_lib
from symjax.model import ModelConfig, Transformer, symbolic
from symjax.model import attention as attn
from symjax.model import intermediates as names
from symjax.model.symbolic import split_channels
from symjax.system.errors import InputError


def takes_hooked_model(fn):
  """Lets ``fn(model, params, ...)`` be called as ``fn(hm, ...)`` with a ``HookedModel`` or a loaded run
  (anything with ``.model`` and ``.params``), whose model and parameters it then reads."""
  @functools.wraps(fn)
  def wrapper(model, *args, **kw):
    if not isinstance(model, nn.Module) and hasattr(model, 'model') and hasattr(model, 'params'):
      if getattr(model, '_hooks', None):  # not silently dropped: the answer would not be the hooked model's
        raise InputError(f'{fn.__name__} runs the model without the hooks added to this HookedModel (add_hook, '
                         f'hooks()): call it after hm.reset_hooks() or outside the with block')
      return fn(model.model, model.params, *args, **kw)
    return fn(model, *args, **kw)
  return wrapper


def analysis_model(model) -> Transformer:
  """The same model (same parameters) with the direct vocabulary projection, which keeps the mixtures
  α, and without rematerialisation. LSTMs have no attention or streams to read."""
  cfg: ModelConfig = model.config
  if cfg.kind in ('lstm', 'program'):
    code = ' (read a program run as code: python -m symjax.decompile)' if cfg.kind == 'program' else ''
    raise InputError(f"the interpretability tools read attention and streams; model.kind {cfg.kind!r} has "
                     f"neither{code}: use 'standard', 'token_factored' or 'symbolic'")
  return _analysis(cfg)


@functools.lru_cache(maxsize=64)
def _analysis(cfg: ModelConfig) -> Transformer:
  """One analysis model per config: the engine's compiled programs are keyed on it."""
  return Transformer(cfg.replace(vocab_projection='direct', remat='none'))


# Parameter trees known to hold plain arrays (no Flax partitioning boxes), by identity, with a reference that
# keeps each alive so that its id is not reused: a HookedModel registers its own, so that each of its calls
# skips ``nn.meta.unbox``, a walk of the whole tree that costs as much as a small model's compiled pass
# takes to dispatch. In-place edits of such a tree cannot add boxes, so they stay valid.
_PLAIN: collections.OrderedDict = collections.OrderedDict()
_PLAIN_KEPT = 8


def plain_params(params):
  """``nn.meta.unbox(params)``, registered as plain (``unboxed`` then returns it as it is)."""
  params = unboxed(params)
  _PLAIN[id(params)] = params
  _PLAIN.move_to_end(id(params))
  while len(_PLAIN) > _PLAIN_KEPT:
    _PLAIN.popitem(last=False)
  return params


def unboxed(params):
  """``params`` without Flax's partitioning boxes: itself where it is registered as plain."""
  if _PLAIN.get(id(params)) is params:
    return params
  return nn.meta.unbox(params)


def as_batch(tokens, vocab_size: int | None = None) -> np.ndarray:
  """``[time]`` or ``[batch, time]`` ids -> ``[batch, time]`` int32, each id checked to be in
  ``[0, vocab_size)``: an embedding lookup out of range gives NaN, not an error."""
  tokens = np.asarray(tokens)
  if tokens.ndim == 1:
    tokens = tokens[None]
  if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
    raise InputError(f'tokens must be integer ids of shape [time] or [batch, time], got '
                     f'{tokens.dtype} {tokens.shape}')
  if not tokens.size:
    raise InputError(f'tokens must hold at least one id per prompt, got shape {tokens.shape}')
  if vocab_size is not None:
    model_lib.check_token_ids(tokens, vocab_size)
  return tokens.astype(np.int32)


def _unwrap(tree):
  """Sown values are 1-tuples; returns the same tree with each as a float64 NumPy array."""
  if isinstance(tree, tuple) and len(tree) == 1:
    return np.asarray(tree[0], np.float64)
  if isinstance(tree, dict) or hasattr(tree, 'items'):
    return {k: _unwrap(v) for k, v in tree.items()}
  return np.asarray(tree, np.float64)


@takes_hooked_model
def run(model: Transformer, params, tokens, key_mask=None) -> tuple[np.ndarray, dict[str, Any]]:
  """Logits ``[batch, time, vocab]`` and every sown site (``symjax.model.intermediates.SOWN``) as float64,
  by name (``blocks.1.attn.pattern``...)."""
  tokens = as_batch(tokens, model.config.vocab_size)
  km = None if key_mask is None else jnp.asarray(np.asarray(key_mask, bool).reshape(tokens.shape))
  logits, state = model.apply({'params': nn.meta.unbox(params)}, jnp.asarray(tokens), km,
                              mutable=['intermediates'])
  sown = names.flat(state[names.COLLECTION])
  return np.asarray(logits, np.float64), {n: np.asarray(v, np.float64) for n, v in sown.items()}


def stream_names(cfg: ModelConfig) -> tuple[str, ...]:
  return ('x',) if cfg.kind == 'standard' else ('x_t', 'x_e', 'x')


def streams(cfg: ModelConfig, inter) -> list[dict[str, np.ndarray]]:
  """Per layer l = 0..L (0 is the input): {'x_t', 'x_e', 'x'} (standard: {'x'}), ``[batch, time, d]``."""
  out = names.streams(cfg.kind, cfg.num_layers, inter)
  return [{'x': s['x']} for s in out] if cfg.kind == 'standard' else out


def components(cfg: ModelConfig, inter) -> dict[str, np.ndarray]:
  """The terms whose sum is the final state: 'embedding', then per layer 'attention_l' and 'ffn_l', each
  sublayer's update of the stream it writes (``ModelConfig.writes``: X_t and X_e in the paper's two
  streams, X_e alone in 'cascade', X_t alone in 'single'); standard: the input (token + position) and the
  two residual updates."""
  out = {}
  if cfg.kind == 'standard':
    prev = out['embedding'] = inter['embed']
    for l in range(cfg.num_layers):
      mid, post = inter[f'blocks.{l}.resid_mid'], inter[f'blocks.{l}.resid']
      out[f'attention_{l}'], out[f'ffn_{l}'] = mid - prev, post - mid
      prev = post
    return out
  prev = out['embedding'] = inter['embed']
  stream = {'x_t': prev, 'x_e': np.zeros_like(prev)}
  for l in range(cfg.num_layers):
    for part, suffix in (('attention', '_mid'), ('ffn', '')):
      # Only the written stream changes: its difference is the update exactly, with no rounding of a sum.
      written = cfg.writes(part)
      new = inter[f'blocks.{l}.{written}{suffix}']
      out[f'{part}_{l}'] = new - stream[written]
      stream[written] = new
  return out


def attention_weights(cfg: ModelConfig, inter) -> np.ndarray:
  """Every layer's sown attention weights, ``[layers, batch, heads, time, time]``."""
  return np.stack([inter[f'blocks.{l}.attn.pattern'] for l in range(cfg.num_layers)])


def valid_keys(tokens: np.ndarray, key_mask=None) -> np.ndarray:
  """The boolean key mask of a ``[batch, time]`` batch of tokens: every position when ``key_mask`` is None."""
  shape = np.shape(tokens)
  return np.ones(shape, bool) if key_mask is None else np.asarray(key_mask, bool).reshape(shape)


def softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
  z = z - z.max(axis, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis, keepdims=True)


def channel_lens(x: np.ndarray, table: np.ndarray, num_heads: int, vocab_size: int,
                 tau: np.ndarray | None = None) -> np.ndarray:
  """softmax_v(x_h · E^(h)_v / τ_h) over the real vocabulary, per channel: ``[..., heads, vocab]``.

  The symbolic model's own vocabulary projection (``symbolic.direct_vocab_projection``, eqs. 21-22)
  applied to a stream, run in float64 like the rest of the readings; τ = 1 where the model has none."""
  table = np.asarray(table, np.float64)[:vocab_size]
  tau = np.ones(num_heads) if tau is None else np.asarray(tau, np.float64)
  with jax.enable_x64(True):
    _, alpha = symbolic.direct_vocab_projection(
        jnp.asarray(split_channels(np.asarray(x, np.float64), num_heads)),
        jnp.asarray(split_channels(table, num_heads)), jnp.asarray(tau))
    return np.asarray(alpha, np.float64)


def embedding_table(params) -> np.ndarray:
  """The input embedding table E ``[padded vocab, d_model]``, float64."""
  return np.asarray(nn.meta.unbox(params)['embed']['embedding'], np.float64)


def readout_table(cfg: ModelConfig, params) -> np.ndarray:
  params = nn.meta.unbox(params)
  table = params['embed']['embedding'] if cfg.tie_embeddings else params['readout']
  return np.asarray(table, np.float64)[:cfg.vocab_size]


def final_norm_affine(cfg: ModelConfig, params, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The final normalisation of the state x written as LN_f(x) = a ⊙ (x − μ(x)) + β, with a = γ / s(x)
  evaluated at x: returns (a, β) broadcastable to x. Freezing a makes LN_f linear in its input, which is
  the basis of direct logit attribution.

  Standard and Token-Factored: LayerNorm over d_model, s = sqrt(var + ε). Symbolic (and Token-Factored with
  ``channel_norm``): channel LayerNorm, μ and s per channel, s = σ_h + ε (eq. 18)."""
  p = nn.meta.unbox(params)['norm_final']
  x = np.asarray(x, np.float64)
  gamma, beta = np.asarray(p['scale'], np.float64), np.asarray(p['bias'], np.float64)
  eps = cfg.layer_norm_epsilon
  if cfg.channel_norms:
    xh = split_channels(x, cfg.num_heads)
    std = np.sqrt(np.square(xh - xh.mean(-1, keepdims=True)).mean(-1, keepdims=True))
    a = np.broadcast_to(gamma, xh.shape) / (std + eps)
    return a.reshape(x.shape), np.broadcast_to(beta, xh.shape).reshape(x.shape)
  var = np.square(x - x.mean(-1, keepdims=True)).mean(-1, keepdims=True)
  return gamma / np.sqrt(var + eps), np.broadcast_to(beta, x.shape)


def centre(cfg: ModelConfig, x: np.ndarray) -> np.ndarray:
  """x − μ(x), over d_model, or per channel for a channel LayerNorm (linear in x)."""
  if cfg.channel_norms:
    xh = split_channels(x, cfg.num_heads)
    return (xh - xh.mean(-1, keepdims=True)).reshape(x.shape)
  return x - x.mean(-1, keepdims=True)


def readout(cfg: ModelConfig, params, x: np.ndarray) -> np.ndarray:
  """Logits LN_f(x) Eᵀ of any state x ``[..., d_model]`` (the logit lens; at the last layer, the model's
  own logits)."""
  a, beta = final_norm_affine(cfg, params, x)
  return (a * centre(cfg, x) + beta) @ readout_table(cfg, params).T


@dataclasses.dataclass
class HeadParameters:
  """Learned per-head quantities, ``[layers, heads]`` (NaN where a layer has none)."""

  slopes: np.ndarray | None      # ALiBi slopes m_h (None: learned positions, standard model)
  tau_value: np.ndarray          # τ_h of the value projection (symbolic layers)
  tau_ffn: np.ndarray            # τ_h of the VocabFFN projection (symbolic layers)
  w_head: np.ndarray | None      # [layers, heads, heads] value maps over channels (two-stream; value_mixing)


def head_parameters(cfg: ModelConfig, params) -> HeadParameters:
  p = nn.meta.unbox(params)
  L, H = cfg.num_layers, cfg.num_heads
  alibi = cfg.attention.positions == 'alibi'
  slopes = None
  if alibi:
    if cfg.attention.learned_slopes:
      slopes = np.stack([np.exp(np.asarray(p[f'layer_{l}']['attention']['alibi']['log_slope'], np.float64))
                         for l in range(L)])
    else:
      slopes = np.tile(np.asarray(attn.alibi_slopes(H), np.float64), (L, 1))
  tau_v, tau_f = np.full((L, H), np.nan), np.full((L, H), np.nan)
  for l in range(L):
    if cfg.projects(l, 'values'):
      tau_v[l] = np.exp(np.asarray(p[f'layer_{l}']['value_projection']['log_tau'], np.float64))
    if cfg.projects(l, 'ffn'):
      tau_f[l] = np.exp(np.asarray(p[f'layer_{l}']['ffn']['projection']['log_tau'], np.float64))
  w_head = None
  if cfg.kind != 'standard':
    w_head = np.stack([value_mixing(cfg, p[f'layer_{l}']) for l in range(L)])
  return HeadParameters(slopes, tau_v, tau_f, w_head)


def value_mixing(cfg: ModelConfig, layer_params) -> np.ndarray:
  """``[heads, heads]``: how much channel g of X_t enters head h's values. The Kronecker map's W_head
  itself (signed); for the dual-stream family's other value maps the RMS of block (h, g) of the map, which
  is |W_head[h, g]| for a Kronecker map; the identity without a map."""
  H, dh, value_map = cfg.num_heads, cfg.head_dim, cfg.symbolic.value_map
  if value_map == 'none':
    return np.eye(H)
  w = np.asarray(layer_params['value_map']['w_head' if value_map.startswith('kronecker_') else 'kernel'], np.float64)
  if value_map.startswith('kronecker_'):
    return w
  if value_map == 'independent':                                  # [H, dh, dh]: channel h to head h
    return np.diag(np.sqrt(np.square(w).mean((1, 2))))
  blocks = w.reshape(H, dh, H, dh)                                # [d_model, H, dh]: (g, ·, h, ·)
  return np.sqrt(np.square(blocks).mean((1, 3))).T


# Characters that print as nothing, shown as visible signs in tables and figures.
VISIBLE = {' ': '␣', '\n': '⏎', '\t': '⇥', '\r': '␍'}


def show_token(text: str) -> str:
  """A token as a person can see it: spaces, line ends and tabs as ␣ ⏎ ⇥, the empty string as ∅."""
  return ''.join(VISIBLE.get(c, c) for c in text) if text else '∅'


def visible(decode):
  """``decode`` whose output is shown with ``show_token``."""
  return lambda ids: show_token(decode(ids))

