"""Finding heads by what they do, and a program-like readout of a forward pass.

Head scores, from attention weights ``[layers, batch, heads, time, time]``:
  - previous-token score: the mean weight a position puts on the position just before it;
  - induction score: at a position whose token occurred earlier, the weight on the positions right after
    those earlier occurrences (the copy step of an induction circuit; "In-context Learning and Induction
    Heads" defines the pattern, "Learning Transformer Programs" §4.1 the task).

The program view ("Learning Transformer Programs" in spirit): per layer and head, for each position the
position it attends to most (and with what weight), and the token the head writes — the top of its
mixture in a symbolic layer (the coefficients of the head's X_t update, exact), the top of the channel
lens of its output in a token-factored layer, and the top of its output read through the unembedding in a
standard block.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import numpy as np

from symjax.interpret import core, interventions
from symjax.interpret.patterns import (  # noqa: F401 (the detectors are this module's API too)
                                       HEAD_PATTERNS,
                                       detect_head,
                                       detection_pattern,
                                       induction_scores,
                                       induction_targets,
                                       previous_token_scores,
)
from symjax.system.errors import InputError


@dataclasses.dataclass
class Circuit:
  """The strongest previous-token and induction heads, and every head within ``share`` of the strongest
  score (circuits are often spread over several heads that each write their own channel)."""

  previous_token_head: tuple[int, int]       # (layer, head)
  induction_head: tuple[int, int]
  previous_token_heads: list[tuple[int, int]]
  induction_heads: list[tuple[int, int]]
  previous_token_scores: np.ndarray          # [layers, heads]
  induction_scores: np.ndarray

  def describe(self) -> str:
    (pl, ph), (il, ih) = self.previous_token_head, self.induction_head
    name = lambda heads: ', '.join(f'L{l}.H{h}' for l, h in heads)
    bl, bh = np.unravel_index(np.argmax(self.previous_token_scores), self.previous_token_scores.shape)
    why = ''
    if (bl, bh) != (pl, ph):  # the circuit's previous-token head must act before its induction head
      why = (f'; L{bl}.H{bh} scores higher ({self.previous_token_scores[bl, bh]:.2f}) but is not in a block '
             f'before the induction head, so it cannot feed it')
    return (f'previous-token head L{pl}.H{ph} (mean weight on the previous position '
            f'{self.previous_token_scores[pl, ph]:.2f}; all such heads: {name(self.previous_token_heads)}{why}); '
            f'induction head L{il}.H{ih} (mean weight on the successor of the earlier occurrence '
            f'{self.induction_scores[il, ih]:.2f}; all such heads: {name(self.induction_heads)})')


@core.takes_hooked_model
def attention_stack(model, params, tokens, key_mask=None) -> np.ndarray:
  """All attention weights ``[layers, batch, heads, time, time]``."""
  model = core.analysis_model(model)
  _, inter = core.run(model, params, tokens, key_mask)
  return core.attention_weights(model.config, inter)


@core.takes_hooked_model
def find_induction_circuit(model, params, tokens, key_mask=None, ignore=frozenset(),
                           previous_queries: np.ndarray | None = None, share: float = 0.75) -> Circuit:
  """The head with the highest induction score, and the best previous-token head in an earlier layer
  (any layer if the induction head is in layer 0). ``ignore``: token ids that are never induction queries;
  ``previous_queries``: the positions where a previous-token head is expected to act (default: all)."""
  attention = attention_stack(model, params, tokens, key_mask)
  tokens = core.as_batch(tokens, model.config.vocab_size)
  km = None if key_mask is None else np.asarray(key_mask, bool)
  prev = previous_token_scores(attention, km, previous_queries)
  ind = induction_scores(attention, tokens, km, ignore)
  il, ih = np.unravel_index(np.argmax(ind), ind.shape)
  earlier = prev[:il] if il > 0 else prev
  pl, ph = np.unravel_index(np.argmax(earlier), earlier.shape)
  near = lambda scores, best: [(int(l), int(h)) for l, h in zip(*np.nonzero(scores >= share * best))]
  return Circuit((int(pl), int(ph)), (int(il), int(ih)), near(earlier, earlier[pl, ph]),
                 near(ind, ind[il, ih]), prev, ind)


# --- Program view ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class HeadStep:
  layer: int
  head: int
  position: int
  attends: int          # the position with the largest weight
  weight: float
  writes: int           # token id the head writes most
  write_weight: float   # its coefficient / probability


@core.takes_hooked_model
def head_writes(model, params, tokens, key_mask=None) -> tuple[np.ndarray, np.ndarray]:
  """Per layer, the distribution of what each head writes, ``[layers, batch, time, heads, vocab]``, and the
  attention ``[layers, batch, heads, time, time]``."""
  model = core.analysis_model(model)
  cfg = model.config
  tokens = core.as_batch(tokens, model.config.vocab_size)
  _, inter = core.run(model, params, tokens, key_mask)
  comps = core.components(cfg, inter)
  p = nn.meta.unbox(params)
  table = np.asarray(p['embed']['embedding'], np.float64)
  writes, attention = [], []
  for l, kind in enumerate(cfg.layer_kinds()):
    A = inter[f'blocks.{l}.attn.pattern']
    attention.append(A)
    if cfg.projects(l, 'values') and not cfg.symbolic.projection_gain:
      # the head's update is Σ_s A[i, s] α_v[s] E^(h): coefficients of mass 1
      w = np.einsum('bhis,bshv->bihv', A, inter[f'blocks.{l}.attn.v_mixture'])[..., :cfg.vocab_size]
    elif kind != 'standard':
      w = core.channel_lens(comps[f'attention_{l}'], table, cfg.num_heads, cfg.vocab_size)
    else:                    # standard: each head's share of the output projection, read by the unembedding
      per_head = _standard_head_outputs(cfg, p, l, tokens, key_mask, model)
      w = core.softmax(per_head @ core.readout_table(cfg, params).T)
    writes.append(w)
  return np.stack(writes), np.stack(attention)


def _standard_head_outputs(cfg, p, l, tokens, key_mask, model) -> np.ndarray:
  """``[batch, time, heads, d_model]``: each head's term of a standard block's attention output."""
  sites = [interventions.Ablation('head', l, h) for h in range(cfg.num_heads)]
  heads = interventions.capture(model, p, tokens, sites, key_mask)
  out_kernel = np.asarray(p[f'layer_{l}']['attention']['out']['kernel'], np.float64)   # [H, hd, d]
  return np.stack([heads[h] @ out_kernel[h] for h in range(cfg.num_heads)], axis=2)


@core.takes_hooked_model
def program(model, params, tokens, key_mask=None) -> list[HeadStep]:
  """The discretised trace of one sequence (``tokens`` ``[time]`` or ``[1, time]``)."""
  tokens = core.as_batch(tokens, model.config.vocab_size)
  if tokens.shape[0] != 1:
    raise InputError(f'the program view reads one sequence; got a batch of {tokens.shape[0]}')
  writes, attention = head_writes(model, params, tokens, key_mask)
  L, _, H, t, _ = attention.shape
  valid = np.ones(t, bool) if key_mask is None else np.asarray(key_mask, bool).reshape(-1)
  steps = []
  for l in range(L):
    for h in range(H):
      for i in range(t):
        if not valid[i]:
          continue
        j = int(np.argmax(attention[l, 0, h, i]))
        v = int(np.argmax(writes[l, 0, i, h]))
        steps.append(HeadStep(l, h, i, j, float(attention[l, 0, h, i, j]), v, float(writes[l, 0, i, h, v])))
  return steps


def format_program(steps: list[HeadStep], tokens, decode) -> str:
  """Readable lines, one per layer, head and position:
  ``L1.H2  @9 'c'  attends @4 '2' (0.97)  writes '2' (0.91)``."""
  tokens = np.asarray(tokens).reshape(-1)
  names = [decode([int(t)]) for t in tokens]
  lines = []
  current = None
  for s in steps:
    if (s.layer, s.head) != current:
      current = (s.layer, s.head)
      lines.append(f'# layer {s.layer}, head {s.head}')
    lines.append(f"L{s.layer}.H{s.head}  @{s.position:<3d} {names[s.position]!r:8s} attends "
                 f"@{s.attends:<3d} {names[s.attends]!r:8s} ({s.weight:.2f})  writes "
                 f"{decode([s.writes])!r} ({s.write_weight:.2f})")
  return '\n'.join(lines)
