"""Attention patterns: those a head is scored against (the previous-token, duplicate-token and induction
patterns of TransformerLens's head detector, and a pattern of one's own; arrays in, scores out), and the
figure of a model's attention."""

from __future__ import annotations

import numpy as np

from symjax.interpret import core
from symjax.system.errors import InputError


def previous_token_scores(attention: np.ndarray, key_mask: np.ndarray | None = None,
                          queries: np.ndarray | None = None) -> np.ndarray:
  """``[layers, heads]`` mean A[i, i−1] over positions i ≥ 1 whose previous position is a valid key (and,
  given ``queries`` ``[batch, time]``, that are queries)."""
  L, b, H, t, _ = attention.shape
  diag = attention[..., np.arange(1, t), np.arange(t - 1)]             # [L, b, H, t-1]
  valid = np.ones((b, t - 1), bool) if key_mask is None else (key_mask[:, 1:] & key_mask[:, :-1])
  if queries is not None:
    valid = valid & np.asarray(queries, bool)[:, 1:]
  return (diag * valid[None, :, None]).sum((1, 3)) / max(valid.sum(), 1)


def induction_targets(tokens: np.ndarray, key_mask: np.ndarray | None = None,
                      ignore: set[int] | frozenset = frozenset()) -> np.ndarray:
  """``[batch, i, s]`` True where s − 1 is an earlier occurrence of tokens[i] and s < i − 1, for tokens not
  in ``ignore``.

  The key s = i − 1 is left out: it is the previous position, which a previous-token head reads whatever
  the tokens. Where a token repeats two positions on (``a b a``), counting it would score a previous-token
  head as an induction head; in data of repeated pairs, such as the induction task's, that score can top
  the real induction head's. On TransformerLens's repeated random tokens the pattern is the same."""
  b, t = tokens.shape
  valid = core.valid_keys(tokens, key_mask)
  same = (tokens[:, :, None] == tokens[:, None, :]) & valid[:, :, None] & valid[:, None, :]
  out = np.zeros((b, t, t), bool)
  out[:, :, 1:] = same[:, :, :-1]                                        # s − 1 has the same token as i
  out &= np.tril(np.ones((t, t), bool), -2)[None]                         # s < i − 1
  for tok in ignore:
    out[tokens == tok] = False
  return out


def induction_scores(attention: np.ndarray, tokens: np.ndarray, key_mask: np.ndarray | None = None,
                     ignore: set[int] | frozenset = frozenset()) -> np.ndarray:
  """``[layers, heads]`` mean over repeated-token positions of the weight on the successors of the
  earlier occurrences."""
  targets = induction_targets(tokens, key_mask, ignore)
  queries = targets.any(-1)
  if not queries.any():
    return np.zeros(attention.shape[0:1] + attention.shape[2:3])
  mass = np.einsum('lbhis,bis->lbhi', attention, targets.astype(np.float64))
  return (mass * queries[None, :, None]).sum((1, 3)) / queries.sum()


HEAD_PATTERNS = ('previous_token_head', 'duplicate_token_head', 'induction_head')


def detection_pattern(name: str, tokens: np.ndarray, key_mask: np.ndarray | None = None) -> np.ndarray:
  """TransformerLens's detection patterns, ``[batch, query, key]`` of 0 and 1: ``previous_token_head`` the key
  just before the query; ``duplicate_token_head`` the earlier keys holding the query's token;
  ``induction_head`` the keys just after those."""
  tokens = np.asarray(tokens)
  b, t = tokens.shape
  valid = core.valid_keys(tokens, key_mask)
  if name == 'previous_token_head':
    out = np.broadcast_to(np.eye(t, k=-1, dtype=bool), (b, t, t)) & valid[:, None, :] & valid[:, :, None]
  elif name == 'duplicate_token_head':
    same = (tokens[:, :, None] == tokens[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    out = same & np.tril(np.ones((t, t), bool), -1)[None]
  elif name == 'induction_head':
    out = induction_targets(tokens, key_mask)
  else:
    raise InputError(f'unknown detection pattern {name!r}; patterns: {list(HEAD_PATTERNS)}, or an array '
                     f'[query, key] or [batch, query, key]')
  return out.astype(np.float64)


def detect_head(attention: np.ndarray, pattern: str | np.ndarray, tokens: np.ndarray | None = None,
                key_mask: np.ndarray | None = None, exclude_bos: bool = False,
                exclude_current_token: bool = False) -> np.ndarray:
  """How much each head attends as ``pattern`` says, ``[layers, heads]`` in [0, 1]: Σ A ⊙ P / Σ A, as
  TransformerLens's ``detect_head`` ("mul") computes it, over the batch's valid queries that the pattern has
  a key for (a query whose token has not occurred before has no duplicate or induction key, and would only
  dilute the score). ``attention`` ``[layers, batch, heads,
  query, key]``; ``pattern`` one of ``HEAD_PATTERNS`` (which need ``tokens``) or an array ``[query, key]`` or
  ``[batch, query, key]``. ``exclude_bos`` / ``exclude_current_token`` leave key 0 / the diagonal out of both
  sums."""
  attention = np.asarray(attention, np.float64)
  L, b, H, t, _ = attention.shape
  if isinstance(pattern, str):
    if tokens is None:
      raise InputError(f'the {pattern!r} pattern is made from the tokens: pass tokens=')
    pattern = detection_pattern(pattern, tokens, key_mask)
  pattern = np.asarray(pattern, np.float64)
  if pattern.shape not in ((t, t), (b, t, t)):
    raise InputError(f'a detection pattern must be [query, key] = {(t, t)} or [batch, query, key] = {(b, t, t)}, '
                     f'got {pattern.shape}')
  pattern = np.broadcast_to(pattern, (b, t, t))
  keep = np.broadcast_to((core.valid_keys(np.zeros((b, t)), key_mask) & pattern.any(-1))[:, :, None],
                         (b, t, t)).copy()
  if exclude_bos:
    keep[:, :, 0] = False
  if exclude_current_token:
    keep &= ~np.eye(t, dtype=bool)[None]
  weights = attention * keep[None, :, None]
  return np.einsum('lbhqk,bqk->lh', weights, pattern) / np.maximum(weights.sum((1, 3, 4)), 1e-30)


def attention_figure(attention: np.ndarray, labels: list[str], highlight: set[tuple[int, int]] = frozenset(),
                     titles: list[list[str]] | None = None):
  """Heatmaps ``[layers, heads, time, time]`` in a grid (rows: layers; columns: heads); ``titles`` per
  panel override the 'L{l}.H{h}' names."""
  from matplotlib.figure import Figure  # only for figures
  L, H = attention.shape[:2]
  fig = Figure(figsize=(2.4 * H + 0.5, 2.4 * L + 0.3))
  axes = fig.subplots(L, H, squeeze=False)
  for l in range(L):
    for h in range(H):
      ax = axes[l, h]
      ax.imshow(attention[l, h], vmin=0, vmax=1, cmap='Blues')
      title = titles[l][h] if titles else f'L{l}.H{h}'
      if (l, h) in highlight:
        title += ' *'
      ax.set_title(title, fontsize=9, color='crimson' if (l, h) in highlight else 'black')
      ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=90)
      ax.set_yticks(range(len(labels)), labels, fontsize=6)
  fig.supxlabel('key position', fontsize=8)
  fig.supylabel('query position', fontsize=8)
  fig.tight_layout()
  return fig
