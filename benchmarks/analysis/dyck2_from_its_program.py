"""Dyck-2 trained from a program that tags every input, or from its bracket counts alone: whether training keeps
it, finds it.

  python -m benchmarks.analysis.dyck2_from_its_program --config=rasp:task=dyck2,model=program
      --config.model.num_layers=4 --config.model.gumbel_scale=0.3 --config.seed=0 --config.progress_bar=false
      --workdir=RUN [--start=counts]

The command of ``symjax.main`` (every flag the same), with one change: the fresh initialisation holds a program
of four layers that tags every Dyck-2 prefix (``dyck2_program``); its selections, predicates, MLP scores and
classifier rows are set far beyond the relaxation's noise, every other module keeps its random initialisation.
Before the first step it tags every input right; whether it still does after training is the question. It
writes what ``symjax.main`` writes into RUN; score the run on validation (its ``metrics.jsonl``): the test split
is not read. With ``--start=counts`` only layer 0's
two counts (the opening and the closing brackets so far) are set: whether training finds the rest once the
counts it needs are there, as reverse found its copy from a count of positions (``model.position_counts``).
``tests/test_transformer_program.py`` checks the program on the task's inputs and its decompiled code. The
recipe now ends straight-through (``config.straight_steps``); its results here trained without that ending:
add ``--config.straight_steps=0`` to run them again.

The program, each step one module of the kind ("Learning Transformer Programs", §3):

  layer 0  opened, closed      numerical heads: the opening / closing brackets at or before the query
           depth               MLP(opened, closed): opened − closed, or NEGATIVE below 0
           closed_before       MLP(closed, tokens): closed, less the query's own bracket if it closes
  layer 1  level               MLP(opened, closed_before): an opening bracket's depth after it, a closing one's
                               before it, so a closing bracket and the bracket it closes share a level
  layer 2  partner             categorical head: the token of the closest earlier key at the query's level
                               (nothing between a pair has its level)
           mismatched          MLP(tokens, partner): 1 where a closing bracket's partner is not its opening one
                               (a bracket closing at depth 0 has level 0, whose closest key is `<s>` or another
                               such bracket: a prefix that went below depth 0 is mismatched too)
  layer 3  mismatches          numerical head: the prefixes whose bracket was mismatched
  decide                       F where mismatches, else T at depth 0 and P above
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from absl import flags

from benchmarks.lib import program_start
from symjax.model import transformer_program as tp

SCALE = tp.SET_LOGIT  # what a set selection or predicate entry holds, and the margin of a set MLP's scores
OPENING, CLOSING = ('(', '{'), (')', '}')
_START = flags.DEFINE_enum('start', 'program', ['program', 'counts'],
                           'What the initialisation holds: the whole program, or its two bracket counts alone.')


def _choose(among: list[str], name: str) -> jnp.ndarray:
  return jnp.where(jnp.arange(len(among)) == among.index(name), SCALE, 0.0)


def _head(params: dict, cfg, name: str, query: str, key: str, holds: np.ndarray, value: str | None = None) -> dict:
  """Head ``name`` (``attn_{layer}_{h}``) reading ``query`` and ``key`` with the predicate ``holds[q, k]``
  (and copying ``value``, a categorical head; a numerical head counts)."""
  layer = int(name.split('_')[1])
  numerical = value is None
  reads = tp.head_reads(cfg, layer, numerical)
  head = {**params[name], 'select_query': _choose(reads, query), 'select_key': _choose(reads, key),
          'predicate': jnp.where(jnp.asarray(holds), SCALE, -SCALE)}
  if value is not None:
    head['select_value'] = _choose(tp.variable_names(cfg, layer), value)
  elif cfg.program.numerical_values:  # the sum of `ones`: the count
    head['select_value'] = _choose(tp.numerical_names(cfg, layer), 'ones')
  return head


def _mlp(params: dict, cfg, name: str, first: str, second: str, units: list[tuple[np.ndarray, np.ndarray]],
         scores: np.ndarray, bias: np.ndarray) -> dict:
  """MLP ``name`` reading ``first`` and ``second``: hidden unit u is relu(a_u[first] + b_u[second]) for
  ``units[u] = (a_u, b_u)``, and value v scores ``SCALE · (scores[u, v] · unit u + bias[v])``."""
  layer, card = int(name.split('_')[1]), tp.cardinality(cfg)
  reads = tp.variable_names(cfg, layer, with_heads_of=layer)
  hidden = np.zeros((2 * card, cfg.program.mlp_hidden), np.float32)
  out = np.zeros((cfg.program.mlp_hidden, card), np.float32)
  for u, (a, b) in enumerate(units):
    hidden[:card, u], hidden[card:, u] = a, b
    out[u] = SCALE * scores[u]
  return {**params[name], 'select_first': _choose(reads, first), 'select_second': _choose(reads, second),
          'hidden_kernel': jnp.asarray(hidden), 'hidden_bias': jnp.zeros(cfg.program.mlp_hidden),
          'out_kernel': jnp.asarray(out), 'out_bias': jnp.asarray(SCALE * bias, jnp.float32)}


def _difference(params: dict, cfg, name: str, first: str, second: str, a: np.ndarray, b: np.ndarray) -> dict:
  """MLP ``name``: a[first] − b[second] where that is 0 or more, else the value ``NEGATIVE`` (the last): unit 0 is
  the difference d ≥ 0, which value v scores 2vd − v² (highest at v = d); unit 1 is −d where d < 0."""
  card = tp.cardinality(cfg)
  v = np.arange(card, dtype=np.float32)
  scores = np.zeros((2, card), np.float32)
  scores[0, :-1] = 2 * v[:-1]
  scores[1, -1] = 10.0
  bias = np.concatenate([-v[:-1] ** 2, [-5.0]]).astype(np.float32)
  return _mlp(params, cfg, name, first, second, [(a, -b), (-a, b)], scores, bias)


def _ids(cfg, vocab: list[str], symbols) -> np.ndarray:
  """The indicator over a variable's values of the token ids of ``symbols``."""
  held = np.zeros(tp.cardinality(cfg), np.float32)
  held[[vocab.index(s) for s in symbols]] = 1.0
  return held


def _check_shape(cfg) -> tuple[int, int]:
  """The first categorical and the first numerical head; refuses a shape the program does not fit."""
  categorical = cfg.num_heads - cfg.program.numerical_heads
  if cfg.num_layers < 4 or categorical < 1 or cfg.program.numerical_heads < 2 or cfg.program.mlps < 2:
    raise SystemExit(f'error: the Dyck-2 program needs model.num_layers >= 4, a categorical head, 2 numerical heads '
                     f'and model.mlps >= 2; got {cfg.num_layers} layers, {categorical} categorical and '
                     f'{cfg.program.numerical_heads} numerical heads, {cfg.program.mlps} MLPs')
  return 0, categorical


def bracket_counts(params: dict, cfg, vocab: list[str]) -> dict:
  """``params`` with layer 0's first two numerical heads counting the opening and the closing brackets at or
  before each query (the task is causal)."""
  _, n = _check_shape(cfg)
  card = tp.cardinality(cfg)
  params = dict(params)
  for h, brackets in enumerate((OPENING, CLOSING)):
    holds = np.broadcast_to(_ids(cfg, vocab, brackets)[None, :] > 0, (card, card))
    params[f'attn_0_{n + h}'] = _head(params, cfg, f'attn_0_{n + h}', 'tokens', 'tokens', holds)
  return params


def dyck2_program(params: dict, cfg, vocab: list[str]) -> dict:
  """``params`` with the program of the module docstring set, the classifier reading it alone."""
  c, n = _check_shape(cfg)
  card, names = tp.cardinality(cfg), tp.variable_names(cfg)
  negative, v = card - 1, np.arange(card, dtype=np.float32)
  opened, closed = f'attn_0_{n}', f'attn_0_{n + 1}'
  params = bracket_counts(params, cfg, vocab)
  params['mlp_0_0'] = _difference(params, cfg, 'mlp_0_0', opened, closed, v, v)                      # depth
  params['mlp_0_1'] = _difference(params, cfg, 'mlp_0_1', closed, 'tokens', v, _ids(cfg, vocab, CLOSING))
  q, k = np.indices((card, card))
  params['mlp_1_0'] = _difference(params, cfg, 'mlp_1_0', opened, 'mlp_0_1', v, v)                     # level
  params[f'attn_2_{c}'] = _head(params, cfg, f'attn_2_{c}', 'mlp_1_0', 'mlp_1_0', k == q, value='tokens')
  units = [(_ids(cfg, vocab, [close]), -_ids(cfg, vocab, [open_])) for open_, close in zip(OPENING, CLOSING)]
  scores = np.zeros((2, card), np.float32)
  scores[:, 1] = 2.0
  bias = np.full(card, -2.0, np.float32)
  bias[:2] = 0.0, -1.0
  params['mlp_2_0'] = _mlp(params, cfg, 'mlp_2_0', 'tokens', f'attn_2_{c}', units, scores, bias)      # mismatched
  params[f'attn_3_{n}'] = _head(params, cfg, f'attn_3_{n}', 'tokens', 'mlp_2_0', k == 1)             # mismatches
  readout = np.zeros(params['readout'].shape, np.float32)
  mismatches = names.index(f'attn_3_{n}') * card
  readout[vocab.index('F'), mismatches + 1:mismatches + card] = 2 * SCALE
  depth = names.index('mlp_0_0') * card
  readout[vocab.index('T'), depth] = SCALE
  readout[vocab.index('P'), depth + 1:depth + negative] = SCALE
  params['readout'] = jnp.asarray(readout)
  return params


if __name__ == '__main__':
  program_start.train_from('dyck2', lambda params, cfg, vocab: (bracket_counts if _START.value == 'counts' else
                                                                dyck2_program)(params, cfg, vocab))
