"""From a trained Symbolic Transformer to a program one can run ("Learning Transformer Programs", Friedman et
al. 2023, §3.4: a transformer whose modules read and write categorical variables decompiles into code).

In a Symbolic Transformer ("Symbolic Transformers", Kerce & Fox 2025, Algorithm 1) every update of channel h is
a convex mixture of that channel's token embeddings (eq. 23). Where each mixture and each attention
pattern is one-hot, every head writes one token into its channel and every channel's FFN writes one token,
so the state of a position is a set of categorical variables:

  tok          the input token (every channel of X_t⁰ holds its embedding)
  attn{l}.{h}  the token head h of layer l writes into channel h of X_t
  ffn{l}.{c}   the token channel c's FFN of layer l writes into channel c of X_e

and channel c of the state is the sum of the embeddings of the variables it holds. The program computes
exactly what such a model computes, from tables of the trained parameters:

- a channel's LayerNorm (eq. 18) of a sum of embeddings needs its spread σ, and σ² is a sum over pairs of
  the tokens it holds of a ``gram`` table; anything linear in the normalised channel is then a sum of
  per-token rows divided by σ + ε, plus a bias;
- a head's query and key (eq. 7) are such sums over the channels; its score adds the ALiBi term
  −slope·|i − j|, and the head attends to the key with the highest score (its mask as code);
- the token a head writes (eq. 27) is the argmax of a vote: every token of X_t's channels (through
  W_head, eq. 10) adds a row of a ``vote`` table;
- a numerical head (``model.numerical_heads``) counts the keys whose score is above 0 and writes the token
  its ``count`` table holds for that number;
- a channel's FFN (eqs. 19-22) reads only its own channel, a multiset of tokens, so it is a lookup table from
  multisets to the token written;
- the readout is again a per-token sum over channels; the prediction is its argmax.

On a model whose mixtures and attention are not one-hot (the paper's continuous model), the program takes
each argmax where the model takes a weighted mean: their disagreement is measured as **fidelity** (the
share of tagged positions where program and model predict the same tag).

``decompile(loaded)`` returns the program's source and tables; ``write`` puts them in a ``.py`` file
(standard library and NumPy only) with its tables in a ``.npz`` beside it; ``load_program`` imports a written
one; ``evaluate`` scores it and the model on a task's split.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import io
import itertools
import math
import os
import sys
import time
from typing import Any

import numpy as np

from symjax.system import files
from symjax.system.errors import InputError

# Above this many entries a table is not printed in the program, only kept in its data file.
READABLE_ENTRIES = 64


def check_supported(model_config, task: str) -> None:
  """A one-line InputError naming what decompilation supports when ``model_config`` or ``task`` is outside
  it: the paper's Symbolic Transformer (both sites projected, per-channel FFN, convex mixtures, no gain;
  the opt-in ``qk_positions`` too) with a causal or full mask, on the tagging tasks of "Learning Transformer
  Programs"."""
  from symjax.tasks import rasp
  supported_tasks = [*rasp.TASKS, 'induction']
  if task not in supported_tasks:
    raise InputError(f'decompilation supports the tagging tasks {supported_tasks}; this run trained {task!r}')
  check_model(model_config)


def check_model(model_config) -> None:
  """``check_supported``'s model half: a one-line InputError naming what a program reads when ``model_config``
  is outside it."""
  c = model_config
  wanted = {'kind': ('symbolic', c.kind), 'symbolic_sites': ('both', c.symbolic.symbolic_sites),
            'vocab_ffn': ('channel', c.symbolic.vocab_ffn), 'ffn_mixture': ('convex', c.symbolic.ffn_mixture),
            'projection_gain': (False, c.symbolic.projection_gain), 'relational': (False, c.attention.relational),
            'mask': ('', c.attention.mask), 'window': (0, c.attention.window),
            # The dual-stream family's options change what a program's steps read and write.
            'positions': ('alibi', c.attention.positions), 'stream': ('token_factored', c.streams.stream),
            'gate': ('none', c.streams.gate)}
  if c.symbolic.symbolic_layers is not None and set(c.symbolic.symbolic_layers) != set(range(c.num_layers)):
    wanted['symbolic_layers'] = (None, c.symbolic.symbolic_layers)
  wrong = [f'model.{k} = {got!r} (supported: {want!r})' for k, (want, got) in wanted.items() if got != want]
  if wrong:
    raise InputError(f'decompilation reads the paper\'s Symbolic Transformer only: {"; ".join(wrong)}')
  if c.symbolic.value_map not in ('none', 'kronecker_identity', 'kronecker_normal'):
    raise InputError(f"decompilation supports model.value_map 'none' or 'kronecker_*', got {c.symbolic.value_map!r}")


# ---------------------------------------------------------------------------------------------------------
# Multisets of tokens: a channel holds one token per variable, and its sum of embeddings does not depend on
# their order, so a table over a channel's contents is indexed by the sorted tokens (combinatorial rank).
# ---------------------------------------------------------------------------------------------------------
def multiset_count(vocab: int, k: int) -> int:
  return math.comb(vocab + k - 1, k)


def multiset_rank(tokens: np.ndarray) -> np.ndarray:
  """The rank of each row of ``tokens`` ``[..., k]`` as a multiset: sort, make strictly increasing
  (c_i = t_i + i), and sum C(c_i, i + 1) (colexicographic order of k-combinations). Ranks run over
  ``range(multiset_count(vocab, k))`` exactly; the program computes the same sum from its COMB table."""
  tokens = np.asarray(tokens, np.int64)
  k = tokens.shape[-1]
  c = np.sort(tokens, axis=-1) + np.arange(k)
  comb = _comb_table(int(tokens.max(initial=0)) + 1, k)
  return sum(comb[c[..., i], i + 1] for i in range(k)) if k else np.zeros(tokens.shape[:-1], np.int64)


def all_multisets(vocab: int, k: int) -> np.ndarray:
  """Every multiset of k tokens out of ``vocab``, one per row, in rank order."""
  rows = np.asarray(list(itertools.combinations_with_replacement(range(vocab), k)), np.int64).reshape(-1, k)
  out = np.empty_like(rows)
  out[multiset_rank(rows)] = rows
  return out


def _gelu(x: np.ndarray) -> np.ndarray:
  """The tanh approximation, as flax.linen.gelu: 0.5·x·(1 + tanh(c·(x + 0.044715·x³))), c = √(2/π).
  In place on one buffer: NumPy's ``x ** 3`` is a general power, and it took most of an FFN table's time."""
  c = math.sqrt(2.0 / math.pi)
  y = x * x
  y *= 0.044715 * c
  y += c
  y *= x
  np.tanh(y, out=y)
  y += 1.0
  y *= 0.5
  y *= x
  return y


# ---------------------------------------------------------------------------------------------------------
# Tables from the parameters (float64).
# ---------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Program:
  """A decompiled program: its source (``program.py``) and its tables (``program.npz``)."""

  source: str
  tables: dict[str, np.ndarray]
  entries: int          # table entries in all
  lines: int            # lines of source


def _norm(params, heads: int, d: int) -> tuple[np.ndarray, np.ndarray]:
  gamma = np.broadcast_to(np.asarray(params['scale'], np.float64), (heads, d))
  beta = np.broadcast_to(np.asarray(params['bias'], np.float64), (heads, d))
  return gamma, beta


def tables_of(params, model_config) -> dict[str, np.ndarray]:
  """Every table the program reads, computed from the parameters (float64)."""
  from symjax.model import attention as attn
  c = model_config
  V, H, d, L = c.vocab_size, c.num_heads, c.head_dim, c.num_layers
  f64 = lambda x: np.asarray(x, np.float64)
  E = f64(params['embed']['embedding'])[:V].reshape(V, H, d).transpose(1, 0, 2)   # [channel, token, d]
  centred = E - E.mean(-1, keepdims=True)
  t = {'gram': np.einsum('cvd,cud->cvu', centred, centred) / d}
  for l in range(L):
    p = params[f'layer_{l}']
    gamma, beta = _norm(p['norm_attn'], H, d)
    a = p['attention']
    slopes = np.exp(f64(a['alibi']['log_slope'])) if 'alibi' in a else attn.alibi_slopes(H)
    # Numerical heads without positions (model.numerical_positions = False): no slope, no position rows.
    positional = np.arange(H) < (H if c.program.numerical_positions else H - c.program.numerical_heads)
    t[f'l{l}.slopes'] = np.where(positional, f64(slopes), 0.0)
    for name in ('query', 'key'):
      w = f64(a[name]['kernel']).reshape(H, d, H, d)          # [channel, d_in, head, d_out]
      scale = 1.0 / math.sqrt(d) if name == 'query' else 1.0   # q·k/√d folded into the query
      t[f'l{l}.{name}'] = scale * np.einsum('cd,cvd,cdhe->hcve', gamma, centred, w)   # [head, channel, token, d]
      t[f'l{l}.{name}_bias'] = scale * np.einsum('cd,cdhe->he', beta, w)             # [head, d]
      if c.attention.qk_positions:  # a learned row per position, added after the LayerNorm: a table over positions
        rows = scale * np.einsum('pcd,cdhe->hpe', f64(p['qk_position']).reshape(-1, H, d), w)
        t[f'l{l}.{name}_position'] = np.where(positional[:, None, None], rows, 0.0)
    w_head = f64(p['value_map']['w_head']) if 'value_map' in p else np.eye(H)
    tau = np.exp(f64(p['value_projection']['log_tau']))
    # vote[h, g, t, v] = W_head[h, g] E_g[t]·E_h[v] / τ_h: what token t in channel g of X_t adds to head h's
    # score for writing token v.
    t[f'l{l}.vote'] = np.einsum('hg,gtd,hvd->hgtv', w_head, E, E) / tau[:, None, None, None]
    if c.program.numerical_heads:  # count[h, n]: the token numerical head h writes when it selected n keys
      t[f'l{l}.count'] = f64(p['count_projection']['count_logits'])[..., :V].argmax(-1)
    gamma_f, beta_f = _norm(p['norm_ffn'], H, d)
    ffn, tau_f, k = p['ffn'], np.exp(f64(p['ffn']['projection']['log_tau'])), 2 + 2 * l
    sets = all_multisets(V, k)
    writes = np.empty((H, len(sets)), np.int16 if V > 127 else np.int8)
    for ch in range(H):
      for start in range(0, len(sets), 65536):
        x = E[ch][sets[start:start + 65536]].sum(1)                         # [n, d]
        xc = x - x.mean(-1, keepdims=True)
        y = gamma_f[ch] * xc / (np.sqrt((xc ** 2).mean(-1, keepdims=True)) + c.layer_norm_epsilon) + beta_f[ch]
        z = _gelu(y @ f64(ffn['w1'])[ch] + f64(ffn['b1'])[ch]) @ f64(ffn['w2'])[ch] + f64(ffn['b2'])[ch]
        writes[ch, start:start + 65536] = (z @ E[ch].T / tau_f[ch]).argmax(-1)
    t[f'l{l}.ffn'] = writes
  gamma, beta = _norm(params['norm_final'], H, d)
  R = (f64(params['embed']['embedding']) if c.tie_embeddings else f64(params['readout']))[:V]
  R = R.reshape(V, H, d).transpose(1, 0, 2)
  t['readout'] = np.einsum('cd,ctd,cvd->ctv', gamma, centred, R)   # [channel, token, tag]
  t['readout_bias'] = np.einsum('cd,cvd->v', beta, R)
  return t


# ---------------------------------------------------------------------------------------------------------
# The program's source.
# ---------------------------------------------------------------------------------------------------------
LOAD_TABLES = '''
TABLES = dict(np.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), DATA_FILE)))
'''
# The program's functions over its TABLES: written into every program, and run here by ``true_edges``.
RUNTIME = '''

# Every state variable is an array of token ids [batch, position]; state['real'] marks the real positions
# (each row's padding comes after its tokens and never enters a real position's result).


def spread(channel, held):
  """σ + ε of the channel's LayerNorm, for the sum of the embeddings of the tokens ``held`` (a list of
  token arrays): σ² is the sum over every pair of held tokens of the channel's gram table."""
  gram = TABLES['gram'][channel]
  return np.sqrt(sum(gram[a, b] for a in held for b in held)) + EPSILON


def spreads_of(state, reads):
  """Every channel's spread at every position: computed once a block, read by all its heads."""
  return [spread(c, [state[name] for name in names]) for c, names in enumerate(reads)]


def normed(rows, bias, held_by_channel, spreads):
  """Σ_c (Σ_t rows[c][t]) / spread_c + bias: a linear map of the LayerNorm'd channels, token by token."""
  return bias + sum(sum(rows[c][t] for t in held) / spreads[c][..., None]
                    for c, held in enumerate(held_by_channel))


def allowed(real):
  """The attention mask as code, [batch, query i, key j]: a real key, and (causal) j ≤ i."""
  n = real.shape[1]
  i, j = np.arange(n)[:, None], np.arange(n)[None, :]
  return (j <= i if CAUSAL else np.ones((n, n), bool)) & real[:, None, :]


def scores(layer, head, state, reads, spreads):
  """Every query·key score minus slope·|i − j| (ALiBi); −inf where the mask forbids the key."""
  held = [[state[name] for name in names] for names in reads]
  q = normed(TABLES[f'l{layer}.query'][head], TABLES[f'l{layer}.query_bias'][head], held, spreads)
  k = normed(TABLES[f'l{layer}.key'][head], TABLES[f'l{layer}.key_bias'][head], held, spreads)
  n = q.shape[1]
  if f'l{layer}.query_position' in TABLES:  # the model's learned positions: one row per position
    q, k = q + TABLES[f'l{layer}.query_position'][head][:n], k + TABLES[f'l{layer}.key_position'][head][:n]
  distance = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
  score = np.einsum('bqd,bkd->bqk', q, k) - TABLES[f'l{layer}.slopes'][head] * distance
  return np.where(allowed(state['real']), score, -np.inf)


def attend(layer, head, state, reads, spreads):
  """The key position each query reads: the highest score among the keys the mask allows."""
  return scores(layer, head, state, reads, spreads).argmax(-1)


def select(layer, head, state, reads, spreads):
  """The keys a numerical head reads, [batch, query, key]: every allowed key whose score is above 0."""
  return scores(layer, head, state, reads, spreads) > 0


def count(layer, head, selected):
  """The token a numerical head writes: its count table at the number of keys each query selected."""
  first = len(TABLES[f'l{layer}.vote']) - len(TABLES[f'l{layer}.count'])
  return TABLES[f'l{layer}.count'][head - first][selected.sum(-1)]


def write(layer, head, state, values, read):
  """The token head ``head`` writes at each query: the argmax of the votes of X_t's tokens at the key
  position ``read`` it reads."""
  vote = TABLES[f'l{layer}.vote'][head]
  written = sum(vote[g][state[name]] for g, names in enumerate(values) for name in names).argmax(-1)
  return np.take_along_axis(written, read, axis=1)


def ffn(layer, channel, state, names):
  """The token the channel's FFN writes: a lookup table indexed by the multiset of tokens it holds."""
  held = np.sort(np.stack([state[name] for name in names], -1), -1) + np.arange(len(names))
  rank = sum(COMB[held[..., i], i + 1] for i in range(len(names)))
  return TABLES[f'l{layer}.ffn'][channel][rank]


def readout(state, reads):
  held = [[state[name] for name in names] for names in reads]
  return normed(TABLES['readout'], TABLES['readout_bias'], held, spreads_of(state, reads)).argmax(-1)
'''


def _comb_table(vocab: int, k: int) -> np.ndarray:
  n = vocab + k
  return np.asarray([[math.comb(a, b) for b in range(k + 1)] for a in range(n)], np.int64)


def _table_text(table: np.ndarray, tokens: list[str], keys: list[str]) -> list[str]:
  """A small lookup table as a readable comment: one 'key -> token' per line."""
  return [f'#   {k} -> {tokens[int(v)]}' for k, v in zip(keys, table)]


def _first_layer_head(tables: dict[str, np.ndarray], head: int, tokens: list[str], epsilon: float,
                      numerical: bool = False, positional: bool = True) -> list[str]:
  """Comments that read a first-layer head whole: where every channel holds only the input token, its
  score is a table over (query token, key token) and its written token a table over the key token.
  ``positional=False``: a numerical head without positions (model.numerical_positions = False)."""
  spread = np.sqrt(np.einsum('ctt->ct', tables['gram'])) + epsilon                       # [channel, token]
  q = (tables['l0.query'][head] / spread[..., None]).sum(0) + tables['l0.query_bias'][head]  # [token, d]
  k = (tables['l0.key'][head] / spread[..., None]).sum(0) + tables['l0.key_bias'][head]
  score = q @ k.T
  written = tables['l0.vote'][head].sum(0).argmax(-1)                                     # [key token]
  slope = float(tables['l0.slopes'][head])
  prefers = ', '.join(f'{tokens[a]}→{tokens[int(b)]}' for a, b in enumerate(score.argmax(1)))
  writes = ', '.join(f'{tokens[a]}→{tokens[int(b)]}' for a, b in enumerate(written))
  extra = ' and the position rows' if 'l0.query_position' in tables else ''
  if numerical:
    selects = '; '.join(f'{tokens[a]}→{{{",".join(tokens[b] for b in np.flatnonzero(row > 0))}}}'
                        for a, row in enumerate(score))
    if not positional:
      return [f'# head 0.{head} (numerical, no positions): a query token selects the key tokens scoring above 0, '
              f'wherever they are: {selects}']
    return [f'# head 0.{head} (numerical): a query token selects the key tokens scoring above 0 (before ALiBi, '
            f'−{slope:.3g}·|i − j|{extra}): {selects}']
  return [f'# head 0.{head}: a query token prefers the key token (before ALiBi, −{slope:.3g}·|i − j|{extra}): '
          f'{prefers}',
          f'# head 0.{head}: at a key holding token t it writes: {writes}']


def _entry_points(L: int, final: list[list[str]]) -> list[str]:
  """The program's functions: ``predict_ids`` (a padded batch of ids), ``trace`` and ``predict`` (token
  names); ``final`` is what each channel holds after the last block, which the readout reads."""
  return ['', '', 'def predict_ids(ids, lengths=None):',
          '  """Tag ids for token ids: one sequence [n] (a list or an array), or a batch [b, n] whose row r',
          '  holds lengths[r] tokens followed by padding (every row whole by default); padding is tagged 0."""',
          '  tok = np.asarray(ids, np.int64)',
          '  if tok.ndim not in (1, 2):',
          "    raise ValueError(f'ids must be one sequence [n] or a batch [b, n], got shape {tok.shape}')",
          '  if tok.shape[-1] > MAX_LEN:',
          "    raise ValueError(f'{tok.shape[-1]} tokens; the model reads at most {MAX_LEN}')",
          '  if not tok.size:',
          '    return tok',
          '  batch = tok.reshape(-1, tok.shape[-1])',
          '  n = batch.shape[1]',
          '  lengths = np.full(len(batch), n) if lengths is None else np.asarray(lengths, np.int64).reshape(-1)',
          '  if lengths.shape != (len(batch),) or (lengths < 0).any() or (lengths > n).any():',
          "    raise ValueError(f'lengths must be one count in 0..{n} per sequence ({len(batch)}), got {lengths}')",
          "  state = {'tok': batch, 'real': np.arange(n)[None, :] < lengths[:, None]}",
          *[f'  block_{l}(state)' for l in range(L)],
          f'  tags = np.where(state[\'real\'], readout(state, {final!r}), 0)',
          '  return tags.reshape(tok.shape)', '', '',
          'def trace(tokens):',
          '  """Every state variable of a sequence of token names, position by position: the tokens each head',
          '  and FFN writes, and (as @attn<l>.<h>) the position each head reads (a numerical head: the list',
          '  of positions)."""',
          "  tok = np.asarray([[TOKENS.index(t) for t in tokens]], np.int64)",
          "  state = {'tok': tok, 'real': np.ones(tok.shape, bool)}",
          *[f'  block_{l}(state)' for l in range(L)],
          "  read = lambda x: [int(j) for j in np.flatnonzero(x)] if np.ndim(x) else int(x)",
          "  return {name: [read(x) if name.startswith('@') else TOKENS[x] for x in value[0]]",
          "          for name, value in state.items() if name != 'real'}", '', '',
          'def predict(tokens):',
          '  """Tags (token names) for a sequence of token names, e.g. predict([\'<s>\', \'3\', \'1\'])."""',
          '  ids = [TOKENS.index(t) for t in tokens]',
          '  return [TOKENS[i] for i in predict_ids(ids)]', '']


def layout(L: int, H: int) -> tuple[list[tuple[list[list[str]], ...]], list[list[str]]]:
  """The variables each channel holds as the program runs: per layer ``(reads, values, ffn_reads)``, channel c of
  X_t + X_e before the layer (what queries and keys are made of), of X_t (values) and of X_t + X_e after the
  layer's heads (what channel c's FFN reads); and what the readout reads, after the last layer."""
  xt, xe, layers = [['tok'] for _ in range(H)], [[] for _ in range(H)], []
  for l in range(L):
    reads, values = [xt[c] + xe[c] for c in range(H)], [list(x) for x in xt]
    xt = [xt[c] + [f'attn{l}.{c}'] for c in range(H)]
    layers.append((reads, values, [xt[c] + xe[c] for c in range(H)]))
    xe = [xe[c] + [f'ffn{l}.{c}'] for c in range(H)]
  return layers, [xt[c] + xe[c] for c in range(H)]


def source_of(model_config, tokens: list[str], tables: dict[str, np.ndarray], data_file: str, header: str,
              causal: bool) -> str:
  c = model_config
  H, L = c.num_heads, c.num_layers
  k_max = 2 + 2 * (L - 1)
  lines = [f'"""{header}"""', '', 'import os', '', 'import numpy as np', '',
           f'TOKENS = {tokens!r}', f'DATA_FILE = {data_file!r}', f'CAUSAL = {causal!r}',
           f'EPSILON = {c.layer_norm_epsilon!r}', f'MAX_LEN = {c.max_len!r}',
           f'COMB = np.array({_comb_table(c.vocab_size, k_max).tolist()!r})  # COMB[n, r] = n choose r',
           LOAD_TABLES + RUNTIME]
  layers, final = layout(L, H)
  for l, (reads, values, ffn_reads) in enumerate(layers):
    lines += ['', f'def block_{l}(state):',
              f'  """Layer {l}: {H} heads, each writing one token into its channel of X_t, then each channel\'s FFN '
              f'writing one token into X_e."""']
    lines.append(f'  reads = {reads!r}  # channel c of X_t + X_e: what queries and keys are made of')
    lines.append(f'  values = {values!r}  # channel g of X_t: what a value is made of')
    lines.append('  spreads = spreads_of(state, reads)  # every channel\'s LayerNorm spread, for all heads')
    for h in range(H):
      numerical = h >= H - c.program.numerical_heads
      if l == 0:  # every channel holds the input token alone: the head is two tables over tokens
        lines += ['  ' + line for line in _first_layer_head(tables, h, tokens, c.layer_norm_epsilon, numerical,
                                                                     c.program.numerical_positions)]
      if numerical:
        lines.append(f"  state['@attn{l}.{h}'] = select({l}, {h}, state, reads, spreads)  # keys each position reads")
        counts = ', '.join(f'{n}→{tokens[int(v)]}' for n, v in enumerate(
            tables[f'l{l}.count'][h - (H - c.program.numerical_heads)]))
        lines.append(f'  # head {l}.{h} writes, for n selected keys: {counts}')
        lines.append(f"  state['attn{l}.{h}'] = count({l}, {h}, state['@attn{l}.{h}'])")
      else:
        lines.append(f"  state['@attn{l}.{h}'] = attend({l}, {h}, state, reads, spreads)  # key each position reads")
        lines.append(f"  state['attn{l}.{h}'] = write({l}, {h}, state, values, state['@attn{l}.{h}'])")
    for ch, names in enumerate(ffn_reads):
      table = tables[f'l{l}.ffn'][ch]
      if len(table) <= READABLE_ENTRIES:
        keys = [' '.join(tokens[t] for t in row) for row in all_multisets(c.vocab_size, len(names))]
        lines.append(f'  # ffn{l}.{ch} reads {{{", ".join(names)}}}:')
        lines += ['  ' + s for s in _table_text(table, tokens, keys)]
      else:
        lines.append(f'  # ffn{l}.{ch}: a table of {len(table):,} entries (every multiset of {{{", ".join(names)}}}), '
                     f'in {data_file} as l{l}.ffn[{ch}]')
      lines.append(f"  state['ffn{l}.{ch}'] = ffn({l}, {ch}, state, {names!r})")
  lines += _entry_points(L, final)
  return '\n'.join(lines)


def build(params, model_config, tokens: list[str], data_file: str = 'program.npz', origin: str = 'memory'
          ) -> Program:
  """The program of a Symbolic Transformer's ``params`` under ``model_config``, whose vocabulary is
  ``tokens``; its source names ``data_file`` (the tables, beside it) and ``origin`` (where the model came
  from)."""
  tables = tables_of(params, model_config)
  header = (f'Program decompiled by symjax from the Symbolic Transformer {origin}.\n\npredict(tokens) -> tags '
            f'runs it; it needs only NumPy and its tables in {data_file} beside this file.\nEach state variable '
            f'is a token: tok (the input), attn<l>.<h> (what head h of layer l writes into channel h),\n'
            f'ffn<l>.<c> (what channel c\'s FFN of layer l writes). See symjax.proj.decompile for how each table '
            f'is made.\n')
  source = source_of(model_config, list(tokens), tables, data_file, header, model_config.causal)
  return Program(source, tables, int(sum(v.size for v in tables.values())), len(source.splitlines()))


def not_exact(model_config) -> str | None:
  """One line saying that the program only approximates the model, when the model was not program-trained
  (``model.hard``): its mixtures and attention are spread, the program takes their argmaxes."""
  if model_config.program.hard or model_config.kind == 'program':
    return None
  return ('warning: this model was not program-trained (model.hard = False), so its program takes argmaxes '
          'where the model mixes: the fidelity below is measured, not exact')


def decompile(loaded, data_file: str = 'program.npz') -> Program:
  """The program of a loaded run (``symjax.load``) of a supported model and task (``check_supported``)."""
  check_supported(loaded.model_config, loaded.task)
  origin = f'in {loaded.workdir or "memory"} (step {loaded.step}, task {loaded.task})'
  return build(loaded.params, loaded.model_config, list(loaded.tokenizer.vocab.tokens), data_file, origin)


# ---------------------------------------------------------------------------------------------------------
# Writing and loading.
# ---------------------------------------------------------------------------------------------------------
def data_path(program_path: str) -> str:
  return os.path.splitext(program_path)[0] + '.npz'


def check_output(path: str, named: bool) -> None:
  """A one-line InputError unless ``path`` may be written: a ``.py`` file name; a path the user did not
  name (the default) must not exist yet; and a table file of the same name (``.npz``) must not exist
  without its program, since replacing it would overwrite a file the user did not name."""
  if not path.endswith('.py'):
    raise InputError(f'--output must name a .py file (the program; its tables go beside it as .npz), got {path!r}')
  data = data_path(path)
  if os.path.isdir(path) or os.path.isdir(data):
    raise InputError(f'--output {path!r}: {path if os.path.isdir(path) else data!r} is a folder')
  if os.path.exists(data) and not os.path.exists(path):
    raise InputError(f'{data!r} exists without the program {os.path.basename(path)!r} beside it; it would be '
                     f'overwritten, so choose another --output')
  if not named and os.path.exists(path):
    raise InputError(f'{path!r} already exists and was not named; pass --output={path} to replace it, or '
                     f'another --output')


def write(program: Program, path: str) -> tuple[str, str]:
  """Writes ``path`` and its tables beside it (``<name>.npz``), each atomically and with the mode the
  user's umask gives any new file. Returns both paths; the second is '' for a program with no tables (its
  classifier written in its code)."""
  path = os.path.abspath(path)
  data = data_path(path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  if program.tables:
    tables = io.BytesIO()
    np.savez_compressed(tables, **program.tables)
    files.write_atomically(data, tables.getvalue())
  files.write_atomically(path, program.source)
  return path, data if program.tables else ''


def load_program(path: str):
  """Imports a written program file as a module (it reads its tables from beside it)."""
  if not os.path.isfile(path):
    raise InputError(f'no program file at {path!r}')
  name = f'symjax_program_{abs(hash(os.path.abspath(path)))}'
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


# ---------------------------------------------------------------------------------------------------------
# Fidelity and accuracy.
# ---------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def _tagger(model, vocab: int):
  """The model's compiled tagging pass, one per model, so that a second call reuses its compilation."""
  import jax
  return jax.jit(lambda params, x, mask: model.apply({'params': params}, x, mask)[..., :vocab].argmax(-1))


def model_predictions(loaded, inputs: np.ndarray, key_mask: np.ndarray, batch: int = 500) -> np.ndarray:
  """The model's tags, batch by batch through one compiled forward pass (evaluation batches share a shape)."""
  tags = _tagger(loaded.model, loaded.model_config.vocab_size)
  return np.concatenate([np.asarray(tags(loaded.params, inputs[i:i + batch], key_mask[i:i + batch]))
                         for i in range(0, len(inputs), batch)])


def program_predictions(program, inputs: np.ndarray, key_mask: np.ndarray) -> np.ndarray:
  """The program on a batch, each row up to its last real token (padding never enters a program's real
  positions), in one vectorised call."""
  lengths = key_mask.sum(1)
  if inputs.shape[1] > program.MAX_LEN:
    raise InputError(f'the program reads at most {program.MAX_LEN} tokens (the inputs it was checked on); this '
                     f'split has {inputs.shape[1]}: measure it on a split of that length')
  if (key_mask != (np.arange(inputs.shape[1]) < lengths[:, None])).any():
    raise InputError('a program reads sequences padded at the end; this key mask has padding before a token')
  return program.predict_ids(inputs, lengths)


def evaluate(loaded, program, split: str = 'test', batches: list[dict] | None = None) -> dict[str, Any]:
  """On ``split`` of the run's task (or on ``batches``, which ``split`` then names): fidelity (% of tagged
  positions where program and model agree), the program's and the model's accuracy (% of tagged positions
  right), the share of sequences the program gets entirely right, and the seconds each takes over the split
  (the model compiled and warm, in the evaluation batches; the program in one call), and the program's
  accuracy and tagged positions by sequence length (its tagged positions)."""
  if batches is None:
    from symjax import tasks
    task = tasks.get_task(loaded.config)
    batches = list(task.eval_batches(split, 500, loaded.config.data_seed))
  inputs = np.concatenate([b['inputs'] for b in batches])
  targets = np.concatenate([b['targets'] for b in batches])
  weights = np.concatenate([b['weights'] for b in batches]) > 0
  key_mask = np.concatenate([b['key_mask'] for b in batches])
  model_predictions(loaded, inputs[:500], key_mask[:500])  # compiles the forward pass
  start = time.perf_counter()
  model = model_predictions(loaded, inputs, key_mask)
  model_seconds, start = time.perf_counter() - start, time.perf_counter()
  prog = program_predictions(program, inputs, key_mask)
  program_seconds = time.perf_counter() - start
  pct = lambda x: float(100 * x[weights].mean())
  # The last evaluation batch is filled up with empty rows: they are not sequences of the split.
  real = key_mask.any(1)
  whole = ((prog == targets) | ~weights).all(1)
  # A sequence's length is its tagged positions: by length, a split's accuracy is comparable with another's
  # whose lengths are mixed otherwise (the splits hold mostly long inputs, uniform draws as many short ones).
  length = np.broadcast_to(weights.sum(1, keepdims=True), weights.shape)[weights]
  right = (prog == targets)[weights]
  by_length = {int(n): (int((length == n).sum()), float(100 * right[length == n].mean())) for n in np.unique(length)}
  return {'split': split, 'positions': int(weights.sum()), 'sequences': int(real.sum()),
          'fidelity': pct(model == prog), 'program_accuracy': pct(prog == targets),
          'model_accuracy': pct(model == targets), 'program_sequence_accuracy': float(100 * whole[real].mean()),
          'positions_by_length': {str(n): c for n, (c, _) in by_length.items()},
          'program_accuracy_by_length': {str(n): a for n, (_, a) in by_length.items()},
          'program_seconds': program_seconds, 'model_seconds': model_seconds}


# ---------------------------------------------------------------------------------------------------------
# The circuit a program computes: the edges of the model's graph (symjax.interpret.edges) it needs.
# ---------------------------------------------------------------------------------------------------------
def _node(variable: str) -> str:
  """The graph node that writes a program variable: ``tok`` the embedding, ``attn{l}.{h}`` head h, and every
  channel's ``ffn{l}.{c}`` the layer's FFN."""
  if variable == 'tok':
    return 'embed'
  layer, index = variable[4 if variable.startswith('attn') else 3:].split('.')
  return f'a{layer}.h{index}' if variable.startswith('attn') else f'm{layer}'


class _Runner:
  """The program's own functions over its tables (as a written program runs them), with each reader's inputs
  drawn from one state or another: what the reader computes when some of its sources are patched."""

  def __init__(self, params, model_config):
    c = self.config = model_config
    self.ns = {'np': np, 'TABLES': tables_of(params, c), 'CAUSAL': c.causal, 'EPSILON': c.layer_norm_epsilon,
               'COMB': _comb_table(c.vocab_size, 2 * c.num_layers)}
    exec(RUNTIME, self.ns)  # noqa: S102 - the program's runtime, this module's own text
    self.layers, self.final = layout(c.num_layers, c.num_heads)

  def head(self, l: int, h: int, query: dict, key: dict, value: dict) -> np.ndarray:
    """The token head h of layer l writes, its query made of the variables in ``query``, its key of those in
    ``key`` and its value of those in ``value`` (the key position chosen by the query's and key's score)."""
    # The runtime's ``scores`` and ``attend``, but with the query and the key from states of their own.
    ns, t, (reads, values, _) = self.ns, self.ns['TABLES'], self.layers[l]
    side = lambda name, s: ns['normed'](t[f'l{l}.{name}'][h], t[f'l{l}.{name}_bias'][h],
                                        [[s[v] for v in names] for names in reads], ns['spreads_of'](s, reads))
    q, k = side('query', query), side('key', key)
    n = q.shape[1]
    if f'l{l}.query_position' in t:
      q, k = q + t[f'l{l}.query_position'][h][:n], k + t[f'l{l}.key_position'][h][:n]
    score = np.einsum('bqd,bkd->bqk', q, k) - t[f'l{l}.slopes'][h] * np.abs(np.subtract.outer(np.arange(n),
                                                                                             np.arange(n)))
    read = np.where(ns['allowed'](query['real']), score, -np.inf).argmax(-1)
    return ns['write'](l, h, value, values, read)

  def ffn(self, l: int, state: dict) -> np.ndarray:
    return np.stack([self.ns['ffn'](l, c, state, names) for c, names in enumerate(self.layers[l][2])])

  def readout(self, state: dict) -> np.ndarray:
    return self.ns['readout'](state, self.final)

  def run(self, tok: np.ndarray, real: np.ndarray) -> dict[str, np.ndarray]:
    """Every variable of the program on ``tok`` [batch, position] with ``real`` positions."""
    state = {'tok': tok, 'real': real}
    for l in range(self.config.num_layers):
      state.update({f'attn{l}.{h}': self.head(l, h, state, state, state) for h in range(self.config.num_heads)})
      state.update({f'ffn{l}.{c}': token for c, token in enumerate(self.ffn(l, state))})
    return state

  def reader(self, reader: str, slot: str | None, state: dict, clean: dict) -> np.ndarray:
    """What ``reader`` computes with ``state`` at its input ``slot`` and ``clean`` at its others."""
    if reader == 'logits':
      return self.readout(state)
    if reader.startswith('m'):
      return self.ffn(int(reader[1:]), state)
    l, h = (int(x) for x in reader[1:].split('.h'))
    inputs = {s: state if s == slot else clean for s in ('q', 'k', 'v')}
    return self.head(l, h, inputs['q'], inputs['k'], inputs['v'])


def true_edges(params, model_config, inputs: np.ndarray, lengths: np.ndarray, seeds: tuple[int, ...] = (0,),
               chunk: int = 4096) -> list[str]:
  """The edges of a program-trained Symbolic Transformer's graph (``symjax.interpret.edges.graph_of``) that its
  program needs to tag ``inputs`` (``lengths`` real tokens each) as it does, from its hard selections.

  Each input is paired with another of its length (``edges.resample_pairs``, one pairing per seed), and an
  edge is patched as ``symjax.interpret.edges`` patches it: its reader reads the source's variables from the
  partner's run. Per reader (a head's query, key or value; an FFN layer, every channel reading its own; the
  readout), the sources are visited from the latest, and one is left out when the reader's output (the tokens
  it writes, at every real position) stays the clean run's on every pair with it and those already left out
  patched together. Of what is kept, the edges into readers that reach the logits through kept edges are the
  circuit: patching every other edge at once changes no reader's output on these pairs, so the model tags
  them as it does clean."""
  from symjax.interpret import edges as edges_lib
  check_model(model_config)
  if not model_config.program.hard:
    raise InputError("a circuit's true edges come from a program-trained model's hard selections (model.hard = "
                     "True); this model mixes where its program takes argmaxes")
  graph = edges_lib.graph_of(model_config)
  inputs = np.asarray(inputs, np.int64)
  real = np.arange(inputs.shape[1])[None, :] < np.asarray(lengths)[:, None]
  rows, partners = (np.concatenate(p) for p in zip(*[edges_lib.resample_pairs(real, s) for s in seeds]))
  runner = _Runner(params, model_config)
  chunks = [slice(i, i + chunk) for i in range(0, len(rows), chunk)]
  runs = [(runner.run(inputs[rows[c]], real[rows[c]]), runner.run(inputs[partners[c]], real[partners[c]]))
          for c in chunks]
  outputs = [runner.readout(clean) for clean, _ in runs]

  def unchanged(reader, slot, patched) -> bool:
    for i, (clean, corrupt) in enumerate(runs):
      mixed = {v: (corrupt if v != 'real' and _node(v) in patched else clean)[v] for v in clean}
      if reader == 'logits':
        base = outputs[i]
      elif reader.startswith('m'):
        base = np.stack([clean[f'ffn{reader[1:]}.{c}'] for c in range(model_config.num_heads)])
      else:
        base = clean[f'attn{reader[1:].replace(".h", ".")}']
      if not np.array_equal(runner.reader(reader, slot, mixed, clean)[..., clean['real']], base[..., clean['real']]):
        return False
    return True

  source, reader = graph.ends
  kept = np.zeros(len(graph.edges), bool)
  for _, fed in graph.reads:  # each input of a reader: its edges, one per earlier source
    fed = [e for e in fed if e >= 0]
    node, slot = graph.nodes[reader[fed[0]]], graph.edges[fed[0]].partition('<')[2].rstrip('>') or None
    patched = set()
    for e in reversed(fed):
      if unchanged(node, slot, patched | {graph.nodes[source[e]]}):
        patched.add(graph.nodes[source[e]])
      else:
        kept[e] = True
  live = np.zeros(len(graph.nodes), bool)
  live[graph.nodes.index('logits')] = True
  for e in reversed(range(len(graph.edges))):  # edges in the order of their readers: a reader's readers come later
    live[source[e]] |= kept[e] and live[reader[e]]
  return sorted(graph.edges[e] for e in np.nonzero(kept & live[reader])[0])
