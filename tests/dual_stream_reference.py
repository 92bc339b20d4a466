"""An independent NumPy transcription of the dual-stream family: "The Dual-Stream Transformer" (Kerce & Fox
2026; its block, head mixings, CASCADE and gated attention) and its per-layer supervision companion, as the
authors' architecture notes write them, over the equations of "Symbolic Transformers" (``paper_reference``).

Written from those texts, not from symjax's modules: loops over layers, heads and positions, float64, every
Kronecker product built. Matrices act on row vectors (x W). One sequence at a time.

  block:     x_attn = CLN(x_t + x_e); q, k = x_attn W_Q, x_attn W_K; v = x_t W_V (the head mixing's value map)
             y_h = Σ_j a_hij v_j (ALiBi or RoPE positions); y_h ← y_h ⊙ σ(g_h W_gate[h]) (gated attention,
             g the query or CLN_gate(x_t)); u = y W_O (the head mixing's output map)
             token-factored: x_t += u; CASCADE: x_e += u; single: x_t += u
             x_ffn = CLN(x_t + x_e); f = FFN(x_ffn); token-factored and CASCADE: x_e += f; single: x_t += f
  output:    logits = LN_f(x_t + x_e) E_outᵀ; per layer (PLS) LN_f(state_l) E_outᵀ, state_l = x_t + x_e or x_e
  PLS loss:  CE_final + weight · Σ_l share_l · CE_l
"""

from __future__ import annotations

import math

import numpy as np
import paper_reference as ref


def rope(x, num_heads):
  """Rotary positions ("RoFormer", eq. 34), half-split pairs: in each head, features i and i + d/2 of the
  row at position p turn by p · 10000^(−2i/d). x: [T, D]."""
  t, dim = x.shape
  d = dim // num_heads
  out = np.array(x, np.float64)
  for h in range(num_heads):
    for p in range(t):
      for i in range(d // 2):
        theta = p * 10000.0 ** (-2.0 * i / d)
        a, b = x[p, h * d + i], x[p, h * d + i + d // 2]
        out[p, h * d + i] = a * math.cos(theta) - b * math.sin(theta)
        out[p, h * d + i + d // 2] = a * math.sin(theta) + b * math.cos(theta)
  return out


def attention(q, k, v, slopes, num_heads, causal, alibi):
  """Per head h, query i: Σ_j softmax_j(q_i·k_j/√d − m_h |i − j|) v_j, the bias only with ALiBi. [T, D]."""
  t, dim = q.shape
  d = dim // num_heads
  out = np.zeros((t, dim))
  for h in range(num_heads):
    sl = slice(h * d, (h + 1) * d)
    for i in range(t):
      keys = list(range(i + 1)) if causal else list(range(t))
      logits = np.array([q[i, sl] @ k[j, sl] / math.sqrt(d) - (slopes[h] * abs(i - j) if alibi else 0.0)
                         for j in keys])
      a = ref.softmax(logits)
      for n, j in enumerate(keys):
        out[i, sl] += a[n] * v[j, sl]
  return out


def head_map(x, mixing, w, num_heads):
  """A map over heads on [T, D]: 'kronecker' x (W ⊗ I)ᵀ; 'independent' per head x_h W[h]; 'dense' x W."""
  d = x.shape[-1] // num_heads
  if mixing == 'kronecker':
    return x @ np.kron(w, np.eye(d)).T
  if mixing == 'independent':
    return np.concatenate([x[:, h * d:(h + 1) * d] @ w[h] for h in range(num_heads)], axis=-1)
  return x @ w


def plain_channel_norm(x, num_heads, eps):
  """The CASCADE stream's one channel LayerNorm, without affine parameters."""
  ones, zeros = np.ones((num_heads, x.shape[-1] // num_heads)), np.zeros((num_heads, x.shape[-1] // num_heads))
  return ref.channel_layer_norm(x, ones, zeros, num_heads, eps)


def ffn(x, p, mixing, num_heads):
  """The MLP: dense, or one per channel ('independent')."""
  if mixing == 'dense':
    return ref.gelu(x @ p['w1'] + p['b1']) @ p['w2'] + p['b2']
  d = x.shape[-1] // num_heads
  return np.concatenate([ref.gelu(x[:, h * d:(h + 1) * d] @ p['w1'][h] + p['b1'][h]) @ p['w2'][h] + p['b2'][h]
                         for h in range(num_heads)], axis=-1)


def model(tokens, p, o):
  """(logits [T, V], per-layer logits [L, T, V]) of one sequence. p: float64 parameters, p['layers'][l] per
  block; o: the options (num_heads, eps, causal, stream, cascade_norm, value_mixing, head_mixing,
  ffn_mixing, gate, rope, pls_source, channel_norm)."""
  H, eps = o['num_heads'], o['eps']

  def norm(x, g, b):
    return ref.channel_layer_norm(x, g, b, H, eps) if o['channel_norm'] else ref.layer_norm(x, g, b, eps)

  x_t = p['embedding'][tokens]
  if o['cascade_norm']:
    x_t = plain_channel_norm(x_t, H, eps)
  x_e = np.zeros_like(x_t)
  per_layer = []
  for lp in p['layers']:
    x_attn = norm(x_t + x_e, lp['ln1_g'], lp['ln1_b'])
    q, k = x_attn @ lp['w_q'], x_attn @ lp['w_k']
    v = head_map(x_t, o['value_mixing'], lp['w_v'], H)
    if o['rope']:
      y = attention(rope(q, H), rope(k, H), v, None, H, o['causal'], alibi=False)
    else:
      y = attention(q, k, v, lp['slopes'], H, o['causal'], alibi=True)
    if o['gate'] != 'none':
      g = q if o['gate'] == 'combined' else ref.channel_layer_norm(x_t, lp['lng_g'], lp['lng_b'], H, eps)
      d = y.shape[-1] // H
      for h in range(H):
        sl = slice(h * d, (h + 1) * d)
        y[:, sl] = y[:, sl] / (1.0 + np.exp(-(g[:, sl] @ lp['w_gate'][h])))
    u = y if o['head_mixing'] == 'independent' else head_map(y, o['head_mixing'], lp['w_o'], H)
    if o['stream'] == 'cascade':
      x_e = x_e + u
    else:
      x_t = x_t + u
    f = ffn(norm(x_t + x_e, lp['ln2_g'], lp['ln2_b']), lp, o['ffn_mixing'], H)
    if o['stream'] == 'single':
      x_t = x_t + f
    else:
      x_e = x_e + f
    decoded = x_e if o['pls_source'] == 'x_e' else x_t + x_e
    per_layer.append(norm(decoded, p['lnf_g'], p['lnf_b']) @ p['readout'].T)
  return norm(x_t + x_e, p['lnf_g'], p['lnf_b']) @ p['readout'].T, np.stack(per_layer)


def pls_shares(decay, num_layers, final_weight):
  """Each layer's share of the per-layer loss weight, as the notes' ``get_layer_weight`` gives it."""
  L = num_layers
  if decay == 'linear':
    return [(i + 1) / (L * (L + 1) / 2) for i in range(L)]
  if decay == 'uniform':
    return [1.0 / L for _ in range(L)]
  if decay == 'exponential':  # weights growing by 2 per layer, normalised to sum to 1
    total = sum(2.0 ** i for i in range(L))
    return [2.0 ** i / total for i in range(L)]
  return [final_weight if i == L - 1 else (1.0 - final_weight) * (i + 1) / ((L - 1) * L / 2) for i in range(L)]


def cross_entropy(logits, targets):
  """Mean −log softmax(logits)[target] over the positions."""
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  return float(-np.mean(logp[np.arange(len(targets)), targets]))
