"""One call that opens every hidden state: ``trace(model, params, tokens)``.

For every layer (0 is the input) and stream — X_t, X_e and X = X_t + X_e in the two-stream models, the
residual stream x in the standard model — the trace keeps the state itself and its channel lens: each
head channel decoded to a distribution over the vocabulary through that channel's embedding slice,
softmax_v(x_h · E^(h)_v / τ_h) (the symbolic model's own projection, eqs. 21-22; τ_h of that layer's value
projection in a symbolic layer, of layer 0 for the input, and 1 elsewhere). It also keeps the logit lens
(LN_f(X) Eᵀ at every layer), all attention weights, every mixture α of the symbolic layers, the exact
mixture trace of an all-symbolic model, and for the other two-stream layers how far each channel state is
from its channel's vocabulary cone {Σ_v w_v E^(h)_v : w ≥ 0}.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import optimize

from symjax.interpret import core, mixtures
from symjax.model import Transformer
from symjax.model.symbolic import split_channels


@dataclasses.dataclass
class Trace:
  config: object                                   # the ModelConfig
  tokens: np.ndarray                               # [batch, time]
  logits: np.ndarray                               # [batch, time, vocab]
  streams: list[dict[str, np.ndarray]]             # per layer: stream name -> [batch, time, d_model]
  lens: list[dict[str, np.ndarray]]                # per layer: stream name -> [batch, time, heads, vocab]
  logit_lens: list[np.ndarray]                     # per layer: LN_f(X) Eᵀ, [batch, time, vocab]
  attention: np.ndarray                            # [layers, batch, heads, time, time]
  value_mixtures: list[np.ndarray | None]          # per layer α_v [batch, time, heads, vocab] (symbolic)
  ffn_mixtures: list[np.ndarray | None]            # per layer α_f (mass 1; free with ffn_mixture='nonnegative')
  heads: core.HeadParameters                       # slopes, τ, W_head
  mixture: mixtures.MixtureTrace | None            # all-symbolic models
  cone_cosine: list[dict[str, np.ndarray]] | None  # per layer: stream -> [batch, time, heads] (see cone)

  def top_tokens(self, layer: int, stream: str = 'x', k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """The k most probable tokens of the channel lens: ids and probabilities ``[batch, time, heads, k]``."""
    probs = self.lens[layer][stream]
    ids = np.argsort(-probs, axis=-1, kind='stable')[..., :k]
    return ids, np.take_along_axis(probs, ids, -1)

  def lens_table(self, layer: int, stream: str, decode, k: int = 2, sequence: int = 0) -> list[list[str]]:
    """Rows per position, one cell per head: ``'tok 0.93 / tok 0.05'``."""
    ids, probs = self.top_tokens(layer, stream, k)
    return [[' / '.join(f'{decode([int(v)])} {p:.2f}' for v, p in zip(ids[sequence, i, h], probs[sequence, i, h]))
             for h in range(ids.shape[2])] for i in range(ids.shape[1])]


def cone(x: np.ndarray, table: np.ndarray, num_heads: int, vocab_size: int) -> np.ndarray:
  """Cosine between each channel state x_h and its nearest point in the vocabulary cone
  {Σ_v w_v E^(h)_v : w ≥ 0} (non-negative least squares), ``[..., heads]``. 1 means the state is a
  non-negative token mixture; a symbolic stream is always 1."""
  xh = split_channels(np.asarray(x, np.float64), num_heads)
  eh = split_channels(np.asarray(table, np.float64)[:vocab_size], num_heads)   # [vocab, heads, d_head]
  flat = xh.reshape(-1, num_heads, xh.shape[-1])
  out = np.zeros(flat.shape[:2])
  for n in range(flat.shape[0]):
    for h in range(num_heads):
      v = flat[n, h]
      norm = np.linalg.norm(v)
      if norm == 0:
        out[n, h] = 1.0
        continue
      w, _ = optimize.nnls(eh[:, h].T, v)
      p = eh[:, h].T @ w
      out[n, h] = float(v @ p / (norm * max(np.linalg.norm(p), 1e-300)))
  return out.reshape(xh.shape[:-1])


@core.takes_hooked_model
def trace(model: Transformer, params, tokens, key_mask=None, with_cone: bool = True) -> Trace:
  """Runs the model on ``tokens`` (``[time]`` or ``[batch, time]``) and keeps everything above."""
  model = core.analysis_model(model)
  cfg = model.config
  tokens = core.as_batch(tokens, model.config.vocab_size)
  logits, inter = core.run(model, params, tokens, key_mask)
  heads = core.head_parameters(cfg, params)
  table = core.embedding_table(params)
  stream_list = core.streams(cfg, inter)
  lens, logit_lens, cones = [], [], []
  for l, states in enumerate(stream_list):
    block = max(l - 1, 0)
    tau = heads.tau_value[block] if cfg.projects(block, 'values') else None
    lens.append({name: core.channel_lens(x, table, cfg.num_heads, cfg.vocab_size, tau)
                 for name, x in states.items()})
    logit_lens.append(core.readout(cfg, params, states['x']))
    if with_cone and cfg.kind == 'token_factored':
      cones.append({name: cone(x, table, cfg.num_heads, cfg.vocab_size) for name, x in states.items()})
  attention = core.attention_weights(cfg, inter)
  value_mix = [inter[f'blocks.{l}.attn.v_mixture'] if cfg.projects(l, 'values') else None
               for l in range(cfg.num_layers)]
  ffn_mix = [inter[f'blocks.{l}.ffn.mixture'] if cfg.projects(l, 'ffn') else None
             for l in range(cfg.num_layers)]
  mix = None
  if cfg.exact_mixtures:
    mix = mixtures.from_intermediates(cfg, tokens, inter)
  return Trace(cfg, tokens, logits, stream_list, lens, logit_lens, attention, value_mix, ffn_mix, heads,
               mix, cones if cones else None)
