"""How near a program-trained Symbolic Transformer's program comes to a Transformer Program.

The simplifier of ``symjax.proj.program_code`` works on a Transformer Program ("Learning Transformer Programs"
§3): every head reads one query variable and one key variable and attends by a predicate over their values
(``select_closest``: the closest key it matches; ``select`` for a counting head: every key it matches), every
MLP reads at most two variables, and the classifier sums one row per variable. A Symbolic Transformer's program
(``symjax.proj.decompile``) reads whole channels instead: a head's score is a sum over every channel of the query
and of the key plus ALiBi, an FFN reads every token its channel holds, the readout every channel.

``form_of`` measures, on inputs of the task, whether each module of such a program is nevertheless one of a
Transformer Program:

- a head: whether some predicate over some pair of the program's variables (the input tokens, the positions,
  every earlier head's and FFN's token) reads the key the model reads at every real query
  (``closest_predicate``), or selects the keys it selects (``selecting_predicate``); and, with the predicate
  each pair of values takes most often in the model's reads, the share of positions where the head then writes
  the model's token;
- an FFN channel and the readout: whether two of their variables determine what they write, and the fewest
  that do, found by leaving out one variable after another (``fewest``).

No predicate fits on a sample of the inputs means none fits on all of them; the shares are those of the sample.
"""

from __future__ import annotations

import itertools

import numpy as np

from symjax.proj import decompile

CARD = 64  # a bound on any variable's value: token ids, positions and counts of the RASP tasks


def _ranks(n: int) -> np.ndarray:
  """``select_closest``'s preference of query i for key j (the written programs' runtime): the nearer the
  higher, the query itself last; argmax takes the earlier of two equally near keys."""
  i, j = np.arange(n)[:, None], np.arange(n)[None, :]
  return np.where(i == j, 1, n + 1 - np.abs(i - j))


def closest(predicate: np.ndarray, queries: np.ndarray, keys: np.ndarray, allowed: np.ndarray) -> np.ndarray:
  """The key each query reads under ``select_closest`` with ``predicate`` [CARD, CARD]: the most preferred
  allowed key it matches, or position 0 where it matches none."""
  matches = predicate[queries[:, :, None], keys[:, None, :]] & allowed
  return np.where(matches, _ranks(queries.shape[1])[None], 0).argmax(-1)


def _preferred(read: np.ndarray, allowed: np.ndarray, b: np.ndarray, i: np.ndarray) -> np.ndarray:
  """[rows, key]: the allowed keys query (b, i) prefers to the one it reads."""
  n, r = read.shape[1], read[b, i]
  rank = _ranks(n)[i]
  at = rank[np.arange(len(i)), r][:, None]
  return ((rank > at) | ((rank == at) & (np.arange(n)[None] < r[:, None]))) & allowed[b, i]


def closest_predicate(queries: np.ndarray, keys: np.ndarray, read: np.ndarray, allowed: np.ndarray,
                      real: np.ndarray) -> np.ndarray | None:
  """A predicate over (query value, key value) under which ``select_closest`` reads ``read`` [batch, n] at every
  real query, or None where there is none.

  Every key preferred to the one read must not match; the key read must match, except position 0, which is
  also read where nothing matches: there either it matches or every key after it must not. What must not
  match grows until it settles; a predicate exists exactly when nothing must both match and not."""
  b, i = np.nonzero(real)
  r, q, n = read[b, i], queries[b, i], queries.shape[1]
  before = _preferred(read, allowed, b, i)
  after = allowed[b, i] & ~before & (np.arange(n)[None] != r[:, None])
  never = np.zeros((CARD, CARD), bool)
  rows, k = np.nonzero(before)
  never[q[rows], keys[b[rows], k]] = True
  at_zero = r == 0
  while True:  # a row reading position 0 whose key 0 must not match: no later key may match either
    blocked = at_zero & never[q, keys[b, 0]]
    rows, k = np.nonzero(after & blocked[:, None])
    grown = never.copy()
    grown[q[rows], keys[b[rows], k]] = True
    if (grown == never).all():
      break
    never = grown
  must = np.zeros((CARD, CARD), bool)
  must[q[~at_zero], keys[b[~at_zero], r[~at_zero]]] = True
  if (must & never).any():
    return None
  zero = at_zero & ~never[q, keys[b, 0]]
  must[q[zero], keys[b[zero], 0]] = True
  return must


def selecting_predicate(queries: np.ndarray, keys: np.ndarray, selected: np.ndarray, allowed: np.ndarray
                        ) -> np.ndarray | None:
  """A predicate over (query value, key value) that holds at exactly the allowed keys ``selected``
  [batch, query, key] (a counting head's ``select``), or None where there is none."""
  b, i, j = np.nonzero(allowed)
  s = selected[b, i, j]
  held, missed = np.zeros((CARD, CARD), bool), np.zeros((CARD, CARD), bool)
  held[queries[b[s], i[s]], keys[b[s], j[s]]] = True
  missed[queries[b[~s], i[~s]], keys[b[~s], j[~s]]] = True
  return None if (held & missed).any() else held


def _votes(cells_for: tuple, cells_against: tuple) -> np.ndarray:
  """The predicate each pair of values takes the way most of the model's reads (or selections) take it."""
  votes = np.zeros((CARD, CARD), np.int64)
  np.add.at(votes, cells_for, 1)
  np.add.at(votes, cells_against, -1)
  return votes > 0


def determines(out: np.ndarray, columns: list[np.ndarray], mask: np.ndarray) -> bool:
  """Whether ``out`` at the ``mask``ed positions is a function of the ``columns``' values there."""
  key = np.zeros(int(mask.sum()), np.int64)
  for column in columns:
    key = np.unique(key * CARD + column[mask], return_inverse=True)[1].reshape(-1)
  first = np.full(int(key.max(initial=0)) + 1, -1, np.int64)
  first[key[::-1]] = out[mask][::-1]
  return bool((first[key] == out[mask]).all())


def fewest(out: np.ndarray, variables: dict[str, np.ndarray], names: list[str], mask: np.ndarray) -> list[str]:
  """Variables among ``names`` that determine ``out``: each left out in turn, the latest first, where the rest
  still do."""
  kept = list(names)
  for name in reversed(names):
    rest = [n for n in kept if n != name]
    if determines(out, [variables[n] for n in rest], mask):
      kept = rest
  return kept


def _pair_determines(out, variables, names, mask) -> list[str] | None:
  """Two (or one, or no) variables among ``names`` that determine ``out``, or None."""
  for size in range(3):
    for pair in itertools.combinations(names, size):
      if determines(out, [variables[n] for n in pair], mask):
        return list(pair)
  return None


def _head(variables: dict[str, np.ndarray], allowed: np.ndarray, real: np.ndarray, read=None, written=None,
          selected=None, count=None) -> dict:
  """A head against every (query variable, key variable) pair: the first pair whose predicate reads (or
  selects) as the model does, and the pair whose commonest predicate writes the model's token most often.
  Attending: ``read`` [batch, query] and ``written`` [batch, key], the token it writes reading that key;
  counting: ``selected`` [batch, query, key] and ``count``, the token it writes for a number of keys."""
  exact, best, share = None, None, -1.0
  if selected is None:
    b, i = np.nonzero(real)
    model = np.take_along_axis(written, read, 1)
    late, passed = np.nonzero(_preferred(read, allowed, b, i))  # the keys each read passed over
  else:
    b, i, j = np.nonzero(allowed)
    s = selected[b, i, j]
    model = count(selected.sum(-1))
  for q, k in itertools.product(variables, repeat=2):
    qv, kv = variables[q], variables[k]
    if selected is None:
      if exact is None and closest_predicate(qv, kv, read, allowed, real) is not None:
        exact = [q, k]
      votes = _votes((qv[b, i], kv[b, read[b, i]]), (qv[b[late], i[late]], kv[b[late], passed]))
      ours = np.take_along_axis(written, closest(votes, qv, kv, allowed), 1)
    else:
      if exact is None and selecting_predicate(qv, kv, selected, allowed) is not None:
        exact = [q, k]
      votes = _votes((qv[b[s], i[s]], kv[b[s], j[s]]), (qv[b[~s], i[~s]], kv[b[~s], j[~s]]))
      ours = count((votes[qv[:, :, None], kv[:, None, :]] & allowed).sum(-1))
    agree = float((ours == model)[real].mean())
    if agree > share:
      best, share = [q, k], agree
  return {'exact': exact, 'best': best, 'share': share, 'values': int(len(np.unique(model[real])))}


def form_of(params, model_config, inputs: np.ndarray, lengths: np.ndarray, tagged: np.ndarray) -> dict:
  """Every head, FFN channel and the readout of the program of a program-trained Symbolic Transformer
  (``params`` under ``model_config``) measured on ``inputs`` (token ids, ``lengths`` real tokens each):
  ``_head`` for a head, the fewest variables and a pair that determine an FFN channel's token (among its
  channel's) and the tag at the ``tagged`` positions (among every variable), None where no pair does."""
  runner, c = decompile._Runner(params, model_config), model_config
  ns, tables = runner.ns, runner.ns['TABLES']
  tok = np.asarray(inputs, np.int64)
  n = tok.shape[1]
  real = np.arange(n)[None, :] < np.asarray(lengths)[:, None]
  allowed = ns['allowed'](real)
  state = {'tok': tok, 'real': real}
  variables = {'tok': tok, 'positions': np.broadcast_to(np.arange(n), tok.shape)}
  first_counting = c.num_heads - c.program.numerical_heads
  out = {}
  for l, (reads, values, ffn_reads) in enumerate(runner.layers):
    spreads = ns['spreads_of'](state, reads)
    earlier = dict(variables)
    for h in range(c.num_heads):
      if h < first_counting:
        read = ns['attend'](l, h, state, reads, spreads)
        written = ns['write'](l, h, state, values, np.broadcast_to(np.arange(n), tok.shape))
        out[f'attn{l}.{h}'] = _head(earlier, allowed, real, read=read, written=written)
        state[f'attn{l}.{h}'] = np.take_along_axis(written, read, 1)
      else:
        selected = ns['select'](l, h, state, reads, spreads)
        table = tables[f'l{l}.count'][h - first_counting]
        out[f'attn{l}.{h}'] = _head(earlier, allowed, real, selected=selected,
                                    count=lambda number, table=table: table[np.minimum(number, len(table) - 1)])
        state[f'attn{l}.{h}'] = ns['count'](l, h, selected)
      out[f'attn{l}.{h}']['counting'] = h >= first_counting
      variables[f'attn{l}.{h}'] = state[f'attn{l}.{h}']
    for channel, names in enumerate(ffn_reads):
      state[f'ffn{l}.{channel}'] = token = ns['ffn'](l, channel, state, names)
      out[f'ffn{l}.{channel}'] = {'reads': names, 'needs': fewest(token, variables, names, real),
                                  'pair': _pair_determines(token, variables, names, real),
                                  'values': int(len(np.unique(token[real])))}
    variables.update({f'ffn{l}.{ch}': state[f'ffn{l}.{ch}'] for ch in range(c.num_heads)})
  tags = runner.readout(state)
  names = list(variables)
  out['readout'] = {'reads': [v for v in names if v != 'positions'], 'needs': fewest(tags, variables, names, tagged),
                    'pair': _pair_determines(tags, variables, names, tagged)}
  return out
