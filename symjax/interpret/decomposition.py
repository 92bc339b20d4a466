"""The residual stream of one cached pass taken apart, with TransformerLens's names: per head
(``stack_head_results``), per block (``decompose_resid``), block by block (``accumulated_resid``), through
the final norm with its scale frozen (``apply_ln_to_stack``) and onto the logits of chosen tokens
(``logit_attrs``). ``symjax.interpret.hooks.Cache`` has each as a method.

The final state is a sum of terms, X = embedding + Σ_l (attention update + FFN update). The standard model
adds both updates to one residual stream; the two-stream models add the attention update to X_t and the FFN
update to X_e ("Symbolic Transformers" §4, eqs. 12 and 15) — or, in the dual-stream family's 'cascade' and
'single' modes, both to X_e or both to X_t — and each label names its stream. A head's term: in a
two-stream model head h writes only channel h (no output projection: the heads' outputs are concatenated,
eq. 12), so its term is that channel of ``attn.out`` and zero elsewhere; through a Kronecker or dense output
map (``model.head_mixing``), and in the standard model, it is z_h through the map's rows of head h, and the
heads' terms sum to ``attn.out``.

The final norm is LN_f(X) = a(X) ⊙ (X − μ(X)) + β with a = γ / s(X) (``core.final_norm_affine``; per channel
for the symbolic model's channel LayerNorm, eq. 18). With a evaluated at the cached X and frozen, LN_f is
linear, so for terms c summing to X
  logits = Σ_c [a ⊙ (c − μ(c))] Eᵀ + β Eᵀ,
exactly: ``apply_ln_to_stack`` gives a ⊙ (c − μ(c)) for each term, ``logit_attrs`` its logit for chosen
tokens, and ``ln_bias_logits`` the β Eᵀ part no term owns. Everything is computed in float64 from the
cached float32 arrays, so the terms sum to the cached logits to float32 rounding.

Shapes: a stack is ``[components, batch, time, d_model]``, or ``[components, batch, d_model]`` with an integer
``pos_slice``.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import numpy as np

from symjax.interpret import core
from symjax.model import ModelConfig
from symjax.system.errors import InputError


def _positions(x: np.ndarray, pos_slice: int | slice | None, time_axis: int) -> np.ndarray:
  """``x`` with ``pos_slice`` (an int drops the axis, a slice keeps it) applied along ``time_axis``."""
  if pos_slice is None:
    return x
  time = x.shape[time_axis]
  if isinstance(pos_slice, (int, np.integer)):
    if not -time <= pos_slice < time:
      raise InputError(f'position {pos_slice} is outside the input of {time} tokens (allowed: {-time}..{time - 1})')
    return np.take(x, int(pos_slice), axis=time_axis)
  if isinstance(pos_slice, slice):
    index = [slice(None)] * x.ndim
    index[time_axis] = pos_slice
    return x[tuple(index)]
  raise InputError(f'pos_slice must be None, an integer position or a slice, got {pos_slice!r}')


def _layer_count(cfg: ModelConfig, layer: int | None) -> int:
  """How many blocks a stack ``up to layer`` covers: all of them for None or -1 (TransformerLens's spelling)."""
  if layer is None or (isinstance(layer, (int, np.integer)) and not isinstance(layer, bool) and layer == -1):
    return cfg.num_layers
  if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer <= cfg.num_layers:
    raise InputError(f'layer must be None or -1 (every block) or an integer in 0..{cfg.num_layers} (the blocks '
                     f'before it are stacked), got {layer!r}')
  return int(layer)


def block_terms(cfg: ModelConfig, inter: dict[str, Any]) -> list[tuple[str, np.ndarray]]:
  """(label, term ``[batch, time, d_model]``) for the embedding and each block's attention and FFN update,
  float64: ``core.components`` (the sown states' differences, which sum to the final state; X_e starts at
  zero) labelled as TransformerLens's ``decompose_resid`` labels them, with the stream a two-stream term is
  added to."""
  parts = core.components(cfg, inter)
  if cfg.kind == 'standard':
    labels = ['embed'] + [f'{l}_{part}' for l in range(cfg.num_layers) for part in ('attn_out', 'mlp_out')]
  else:
    attn, ffn = cfg.writes('attention'), cfg.writes('ffn')
    labels = ['embed.x_t'] + [f'{l}_{part}' for l in range(cfg.num_layers)
                              for part in (f'attn_out.{attn}', f'ffn_out.{ffn}')]
  return [(label, np.asarray(term, np.float64)) for label, term in zip(labels, parts.values())]


def final_state(cfg: ModelConfig, inter: dict[str, Any]) -> np.ndarray:
  """The state the final norm reads, ``[batch, time, d_model]`` float64 (X_t + X_e for two streams)."""
  return np.sum([term for _, term in block_terms(cfg, inter)], axis=0)


def head_terms(cfg: ModelConfig, params, arrays: dict[str, np.ndarray], layer: int) -> np.ndarray:
  """Each head's term in block ``layer``'s attention update, ``[heads, batch, time, d_model]`` float64."""
  out = np.asarray(arrays[f'blocks.{layer}.attn.out'], np.float64)
  h, dh = cfg.num_heads, cfg.head_dim
  if cfg.kind == 'standard':  # z_h W_O[h]: the output projection's rows of head h
    z = np.asarray(arrays[f'blocks.{layer}.attn.z'], np.float64)                       # [b, t, heads, dh]
    w_o = np.asarray(nn.meta.unbox(params)[f'layer_{layer}']['attention']['out']['kernel'], np.float64)
    return np.einsum('bthd,hde->hbte', z, w_o)
  mixing = cfg.streams.head_mixing
  if mixing == 'independent':  # two streams: head h writes channel h (eq. 12)
    terms = np.zeros((h, *out.shape))
    for head in range(h):
      terms[head, ..., head * dh:(head + 1) * dh] = out[..., head * dh:(head + 1) * dh]
    return terms
  # The dual-stream family's output maps, linear in the heads: head h's term is its z_h through them.
  z = np.asarray(arrays[f'blocks.{layer}.attn.z'], np.float64)                         # [b, t, heads, dh]
  w = np.asarray(nn.meta.unbox(params)[f'layer_{layer}']['attention']['head_mix'][
      'w_head' if mixing == 'kronecker' else 'kernel'], np.float64)
  if mixing == 'kronecker':  # channel g receives W[g, h] z_h
    return np.einsum('gh,bthd->hbtgd', w, z).reshape(h, *out.shape)
  return np.einsum('bthd,hdge->hbtge', z, w.reshape(h, dh, h, dh)).reshape(h, *out.shape)


def frozen_norm(cfg: ModelConfig, params, inter: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
  """(a, β) of the final norm at the cached final state, ``[batch, time, d_model]`` each."""
  return core.final_norm_affine(cfg, params, final_state(cfg, inter))


def readout_rows(cfg: ModelConfig, params, tokens) -> np.ndarray:
  """The readout rows of ``tokens`` (ids, any shape), ``[*tokens.shape, d_model]`` float64."""
  tokens = np.asarray(tokens)
  if not np.issubdtype(tokens.dtype, np.integer) or tokens.size and not (
      0 <= tokens.min() and tokens.max() < cfg.vocab_size):
    raise InputError(f'tokens must be integer ids in 0..{cfg.vocab_size - 1}, got {tokens.tolist()!r}')
  return core.readout_table(cfg, params)[tokens]


def token_logits(stack: np.ndarray, rows: np.ndarray) -> np.ndarray:
  """Σ_d stack[..., d] rows[..., d], the token rows broadcast over the stack's leading component axis:
  ``rows`` is ``[batch, d_model]`` or ``[batch, time, d_model]``, matching the stack after its first axis."""
  if rows.shape != stack.shape[1:]:
    raise InputError(f'the tokens give readout rows of shape {rows.shape[:-1]}, the stack has '
                     f'{stack.shape[1:-1]} (batch, and time unless one position was taken): pass one token per '
                     f'batch row and position of the stack')
  return np.einsum('c...d,...d->c...', stack, rows)


def attribution_of(cfg, params, inter) -> dict[str, np.ndarray]:
  """``stream_attribution`` of a pass already run: ``inter``, its sown intermediates (a cache's, with the
  hooks and key mask it was made with)."""
  final = core.streams(cfg, inter)[-1]['x']
  a, beta = core.final_norm_affine(cfg, params, final)
  table = core.readout_table(cfg, params)
  out = {name: (a * core.centre(cfg, c)) @ table.T for name, c in core.components(cfg, inter).items()}
  out['bias'] = beta @ table.T
  return out
