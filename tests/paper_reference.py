"""An independent NumPy transcription of the equations of "Symbolic Transformers" (Kerce & Fox 2025).

Written from the paper, not from symjax's modules: explicit loops over heads and positions, float64,
the Kronecker product built explicitly. Tests compare symjax against these functions.
Matrices act on row vectors (x W), as in the paper's eqs. 7-8.
"""

from __future__ import annotations

import math

import numpy as np


def rel_err(actual, expected) -> float:
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return float(np.max(np.abs(actual - expected)) / max(np.max(np.abs(expected)), 1e-30))


def softmax(x, axis=-1):
  x = x - np.max(x, axis=axis, keepdims=True)
  e = np.exp(x)
  return e / e.sum(axis=axis, keepdims=True)


def gelu(x):
  """GELU, tanh approximation (Hendrycks & Gimpel)."""
  return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, gamma, beta, eps):
  """Standard LayerNorm over the last axis: γ (x − μ) / sqrt(σ² + ε) + β."""
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return gamma * (x - mu) / np.sqrt(var + eps) + beta


def alibi_slopes(n):
  """The ALiBi authors' get_slopes, transcribed."""
  def get_slopes_power_of_2(n):
    start = 2 ** (-2 ** -(math.log2(n) - 3))
    ratio = start
    return [start * ratio ** i for i in range(n)]

  if math.log2(n).is_integer():
    return get_slopes_power_of_2(n)
  closest_power_of_2 = 2 ** math.floor(math.log2(n))
  return (get_slopes_power_of_2(closest_power_of_2)
          + alibi_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2])


def channel_layer_norm(x, gamma, beta, num_heads, eps):
  """Eqs. 17-18: N_h(x_h) = γ_h (x_h − μ_h) / (σ_h + ε) + β_h, channel by channel.

  gamma, beta: [H, d_head] (vector form) or [H] / [H, 1] (scalar form).
  """
  d = x.shape[-1] // num_heads
  out = np.empty_like(x, dtype=np.float64)
  for h in range(num_heads):
    xh = x[..., h * d:(h + 1) * d]
    mu = xh.mean(-1, keepdims=True)
    sigma = np.sqrt(((xh - mu) ** 2).mean(-1, keepdims=True))
    g = np.reshape(gamma[h], (-1,))
    b = np.reshape(beta[h], (-1,))
    out[..., h * d:(h + 1) * d] = g * (xh - mu) / (sigma + eps) + b
  return out


def kronecker_value(x, w_head, head_dim):
  """Eqs. 9-10: (W_head ⊗ I_{d_head}) applied to each position's column vector x."""
  w_tilde = np.kron(w_head, np.eye(head_dim))
  return x @ w_tilde.T


def vocab_projection(z_h, e_h, tau_h):
  """Eqs. 21-22 for one channel: α = softmax(z_h E^(h)ᵀ / τ_h), output α E^(h)."""
  alpha = softmax(z_h @ e_h.T / tau_h)
  return alpha @ e_h, alpha


def vocab_ffn(x, w1, b1, w2, b2, table, tau, num_heads):
  """Eqs. 19-22: ⊕_h VocabProj_h(W2_h gelu(W1_h x_h + b1_h) + b2_h). Returns output and α per head."""
  d = x.shape[-1] // num_heads
  out = np.empty_like(x, dtype=np.float64)
  alphas = []
  for h in range(num_heads):
    z = gelu(x[..., h * d:(h + 1) * d] @ w1[h] + b1[h]) @ w2[h] + b2[h]
    out[..., h * d:(h + 1) * d], alpha = vocab_projection(z, table[:, h * d:(h + 1) * d], tau[h])
    alphas.append(alpha)
  return out, alphas


def dense_vocab_ffn(x, w1, b1, w2, b2, table, tau, num_heads):
  """The opt-in ``vocab_ffn='dense'``: z = W2 gelu(W1 x + b1) + b2 over the whole state (as eq. 14), then
  eqs. 21-22 on each channel of z. Returns output and α per head."""
  d = x.shape[-1] // num_heads
  z = gelu(x @ w1 + b1) @ w2 + b2
  out = np.empty_like(x, dtype=np.float64)
  alphas = []
  for h in range(num_heads):
    out[..., h * d:(h + 1) * d], alpha = vocab_projection(z[..., h * d:(h + 1) * d], table[:, h * d:(h + 1) * d],
                                                          tau[h])
    alphas.append(alpha)
  return out, alphas


def attention(q, k, v, slopes, num_heads, causal, alibi=True):
  """Per head h and query i: Σ_j softmax_j(q_i·k_j/sqrt(d) + m_h (j − i)) v_j (eq. 11).

  q, k, v: [T, D] for one sequence. Causal: keys j > i excluded. Bidirectional: bias −m_h |i − j|.
  Returns the concatenated heads [T, D] and weights [H, T, T].
  """
  t, dim = q.shape
  d = dim // num_heads
  out = np.zeros((t, dim))
  weights = np.zeros((num_heads, t, t))
  for h in range(num_heads):
    sl = slice(h * d, (h + 1) * d)
    for i in range(t):
      keys = range(i + 1) if causal else range(t)
      logits = np.array([q[i, sl] @ k[j, sl] / math.sqrt(d)
                         - (slopes[h] * abs(i - j) if alibi else 0.0) for j in keys])
      a = softmax(logits)
      for n, j in enumerate(keys):
        weights[h, i, j] = a[n]
        out[i, sl] += a[n] * v[j, sl]
  return out, weights


def token_factored_block(x_t, x_e, p, num_heads, causal, eps):
  """Eqs. 6-15 for one sequence. p: dict of float64 parameters (see tests for the mapping)."""
  d = x_t.shape[-1] // num_heads
  x_attn = layer_norm(x_t + x_e, p['ln1_g'], p['ln1_b'], eps)                        # eq. 6
  q, k = x_attn @ p['w_q'], x_attn @ p['w_k']                                         # eq. 7
  v = kronecker_value(x_t, p['w_head'], d)                                            # eq. 8
  delta_t, weights = attention(q, k, v, p['slopes'], num_heads, causal)               # eq. 11
  x_t = x_t + delta_t                                                                 # eq. 12
  x_ffn = layer_norm(x_t + x_e, p['ln2_g'], p['ln2_b'], eps)                          # eq. 13
  delta_e = gelu(x_ffn @ p['w1'] + p['b1']) @ p['w2'] + p['b2']                       # eq. 14
  return x_t, x_e + delta_e, weights                                                  # eq. 15


def symbolic_block(x_t, x_e, table, p, num_heads, causal, eps):
  """Algorithm 1 for one sequence. Returns X_t, X_e, attention weights, value α and FFN α per head."""
  d = x_t.shape[-1] // num_heads
  x_norm1 = channel_layer_norm(x_t + x_e, p['cln1_g'], p['cln1_b'], num_heads, eps)   # line 1
  x_qk = x_norm1 + p.get('qk_position', 0.0)     # opt-in model.qk_positions: queries and keys only
  q, k = x_qk @ p['w_q'], x_qk @ p['w_k']                                             # line 2
  pre_v = kronecker_value(x_t, p['w_head'], d)                                        # line 3
  v = np.empty_like(pre_v)
  value_alphas = []
  for h in range(num_heads):
    sl = slice(h * d, (h + 1) * d)
    v[:, sl], alpha = vocab_projection(pre_v[:, sl], table[:, sl], p['tau_v'][h])
    value_alphas.append(alpha)
  delta_t, weights = attention(q, k, v, p['slopes'], num_heads, causal)               # line 4
  x_t = x_t + delta_t                                                                 # line 5
  x_norm2 = channel_layer_norm(x_t + x_e, p['cln2_g'], p['cln2_b'], num_heads, eps)   # line 6
  ffn = dense_vocab_ffn if p.get('f_dense') else vocab_ffn
  delta_e, ffn_alphas = ffn(x_norm2, p['f_w1'], p['f_b1'], p['f_w2'], p['f_b2'], table,
                            p['tau_f'], num_heads)                                    # line 7
  return x_t, x_e + delta_e, weights, value_alphas, ffn_alphas                        # line 8


def standard_block(x, p, num_heads, causal, eps, alibi):
  """Pre-LayerNorm block: x + Attn(LN(x)) W_O, then + MLP(LN(x))."""
  h = layer_norm(x, p['ln1_g'], p['ln1_b'], eps)
  heads, weights = attention(h @ p['w_q'], h @ p['w_k'], h @ p['w_v'], p['slopes'], num_heads, causal,
                             alibi=alibi)
  x = x + heads @ p['w_o']
  h = layer_norm(x, p['ln2_g'], p['ln2_b'], eps)
  return x + gelu(h @ p['w1'] + p['b1']) @ p['w2'] + p['b2'], weights
