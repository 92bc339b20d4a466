"""Circuits over edges: a model's graph, patching along its edges, and circuit discovery on it.

The graph ("Towards Automated Circuit Discovery for Mechanistic Interpretability", §2). Its nodes are the input,
each head ``a{l}.h{h}``, each MLP and the ``logits``. An edge runs from a node's output to one input of a later
node: a head's query, key and value (``<q>``, ``<k>``, ``<v>``), an MLP's input, or the readout. Edges are written
as the EAP-IG authors write them, ``a0.h1->a1.h0<q>``, ``m0->logits``.

- **A Transformer Program** (``graph_of``). The input nodes are the variables ``tokens`` and ``positions``, and
  each MLP ``m{l}.{m}`` has two inputs, ``<first>`` and ``<second>``. Each input reads one variable of the
  residual stream, the stack of the variables written before it ("Learning Transformer Programs" §3.1), so an
  edge u→d is variable u in d's stack.
- **A standard, Token-Factored or Symbolic Transformer** (``residual_graph``). The input node is ``embed`` and each
  MLP is ``m{l}``. A reader's input is the sum of what the earlier nodes wrote into the residual stream, so an
  edge u→d is u's term in d's input; each head reads an input of its own (the model's ``attn.q_input`` sites). In
  the two-stream kinds a value reads X_t alone, so only ``embed`` and the heads feed it.

Patching edge u→d gives d's input what u holds, or wrote, on the corrupt input, while every other input reads what
the model computes on the clean one. The change goes on through d's output, as ACDC patches. With a weight
w_e ∈ [0, 1] per edge, d's input gets w_{u→d} (corrupt_u − clean_u) added, and one function
f(w) = metric(logits(w)) serves every method (``Edges``):

  exact         f(e_i) − f(0) for every edge i: the effect of patching that edge alone
  eap           ∇f(0): each edge's (corrupt − clean) times the metric's gradient at its input ("Attribution
                Patching Outperforms Automated Circuit Discovery"); exact for a metric linear in the edge
  eap_ig        the mean of ∇f(α·1) over ``steps`` midpoints α of [0, 1]: integrated gradients along the path
                on which every edge moves from clean to corrupt together ("Have Faith in Faithfulness"); the
                scores sum to f(1) − f(0) up to the rule's error
  atp_star      EAP with AtP*'s two fixes ("AtP*: An efficient and scalable method for localizing LLM behaviour
                to components"): a query or key edge is read through its head's recomputed pattern, and GradDrop
  acdc          ACDC's pass with threshold τ: from the logits back, each edge is patched for good when the KL
                divergence of the output from the clean one rises by at most τ
  faithfulness  (f(C) − f(∅)) / (f(all) − f(∅)) for a circuit C, every edge outside it patched: 1 for every
                edge, 0 for none (where f(∅) is the metric of the corrupt run)

A program's argmaxes pass gradients as they train, through their softmax (straight-through): the gradient
methods read those surrogates, the exact patches and ACDC the program itself. An edge from a variable its
input does not select changes nothing, exactly.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from symjax.interpret import core, engine
from symjax.model import intermediates as names
from symjax.model import transformer_program as tp
from symjax.model.config import ModelConfig
from symjax.system.errors import InputError

# The inputs of each kind of module: (slot in the edge's name, the selection it is in the model).
HEAD_SLOTS = (('q', 'query'), ('k', 'key'), ('v', 'value'))
MLP_SLOTS = (('first', 'first'), ('second', 'second'))


def node_of(variable: str) -> str | None:
  """The graph's node writing a program variable (``attn_1_0`` -> ``a1.h0``, ``mlp_0_1`` -> ``m0.1``); None for
  the constant ``ones`` a numerical head may sum."""
  if variable in ('tokens', 'positions'):
    return variable
  kind, _, rest = variable.partition('_')
  layer, _, index = rest.partition('_')
  if kind == 'attn':
    return f'a{layer}.h{index}'
  if kind == 'mlp':
    return f'm{layer}.{index}'
  return None


def edge_name(source: str, reader: str, slot: str | None) -> str:
  return f'{source}->{reader}' + (f'<{slot}>' if slot else '')


@dataclasses.dataclass(frozen=True)
class Graph:
  """The nodes and edges of a model, and where each edge enters it. ``reads`` holds, per input, its hook site and
  the edge of each source it can read (−1: none). In a program the sources are the rows of the stack the input
  reads (``attn_1_0.query``; −1 for ``ones``); in a residual model they are the earlier nodes in order, and a
  head's input is its block's site and its index (``blocks.1.attn.q_input:0``)."""

  nodes: tuple[str, ...]
  edges: tuple[str, ...]
  reads: tuple[tuple[str, tuple[int, ...]], ...]
  patterns: tuple[tuple[str, str, int], ...]  # per head: (node, its pattern's hook site, its index there or −1)
  layer: tuple[int, ...]       # the layer of each node: −1 for the inputs, num_layers for the logits
  kind: str = 'program'        # the model's kind: 'program' (inputs read stacks of variables), or a residual one

  @property
  def program(self) -> bool:
    return self.kind == 'program'

  @functools.cached_property
  def streams(self) -> tuple[str, ...]:
    """The stream each edge travels in: in the two-stream kinds ``x_t`` from the embedding and the heads, ``x_e``
    from the FFNs; ``resid`` in the standard kind; ``variables`` in a program."""
    if self.kind in ('program', 'standard'):
      return ('variables' if self.program else 'resid',) * len(self.edges)
    return tuple('x_e' if e.startswith('m') else 'x_t' for e in self.edges)

  @functools.cached_property
  def index(self) -> dict[str, int]:
    return {e: i for i, e in enumerate(self.edges)}

  def mask(self, edges: Sequence[str]) -> np.ndarray:
    """``[edges]`` bool, True at the named edges; an unknown name is an ``InputError``."""
    out = np.zeros(len(self.edges), bool)
    for e in edges:
      if e not in self.index:
        raise InputError(f'{e!r} is not an edge of this model; edges are written source->reader<slot>, e.g. '
                         f'{self.edges[0]!r} ({len(self.edges)} in all: Graph.edges)')
      out[self.index[e]] = True
    return out

  def edge_of(self, variable: str, site: str) -> str:
    """The edge by which the input at hook site ``site`` reads program variable ``variable``."""
    reader = dict(self.reads).get(site)
    if reader is None:
      raise InputError(f'{site!r} is not an input of this model; inputs are {[s for s, _ in self.reads]}')
    for e in reader:
      if e >= 0 and self.edges[e].split('->')[0] == node_of(variable):
        return self.edges[e]
    raise InputError(f'{site} cannot read {variable!r}')

  @functools.cached_property
  def ends(self) -> tuple[np.ndarray, np.ndarray]:
    """(source node index, reader node index) of every edge."""
    at = {n: i for i, n in enumerate(self.nodes)}
    pairs = [e.split('<')[0].split('->') for e in self.edges]
    return np.array([at[a] for a, _ in pairs]), np.array([at[b] for _, b in pairs])


def _add_reader(edges: list[str], reads: list, site: str, sources: list[str | None], reader: str,
                slot: str | None) -> None:
  """Appends an edge from each source (None: a row no edge feeds) to ``reader``'s input ``slot``, and the input's
  entry of ``Graph.reads``."""
  rows = []
  for source in sources:
    rows.append(-1 if source is None else len(edges))
    if source is not None:
      edges.append(edge_name(source, reader, slot))
  reads.append((site, tuple(rows)))


@functools.lru_cache(maxsize=32)
def graph_of(cfg: ModelConfig) -> Graph:
  """The graph of a model of config ``cfg``: a Transformer Program's, or a residual model's
  (``residual_graph``)."""
  if cfg.kind != 'program':
    return residual_graph(cfg)
  first_numerical = cfg.num_heads - cfg.program.numerical_heads
  nodes = ['tokens', 'positions']
  layer = [-1, -1]
  edges: list[str] = []
  reads, patterns = [], []

  def add(site: str, variables: list[str], reader: str, slot: str | None):
    _add_reader(edges, reads, site, [node_of(v) for v in variables], reader, slot)

  for l in range(cfg.num_layers):
    for h in range(cfg.num_heads):
      node, module = f'a{l}.h{h}', f'attn_{l}_{h}'
      nodes.append(node)
      layer.append(l)
      patterns.append((node, f'{module}.pattern', -1))
      numerical = h >= first_numerical
      for slot, role in HEAD_SLOTS[:2 if numerical else 3]:
        add(f'{module}.{role}', tp.head_reads(cfg, l, numerical), node, slot)
      if numerical and cfg.program.numerical_values:
        add(f'{module}.value', tp.numerical_names(cfg, l), node, 'v')
    readable = tp.variable_names(cfg, l, with_heads_of=l)
    for m in range(cfg.program.mlps):
      node, module = f'm{l}.{m}', f'mlp_{l}_{m}'
      nodes.append(node)
      layer.append(l)
      for slot, role in MLP_SLOTS:
        add(f'{module}.{role}', readable, node, slot)
  nodes.append('logits')
  layer.append(cfg.num_layers)
  add('readout', tp.variable_names(cfg), 'logits', None)
  return Graph(tuple(nodes), tuple(edges), tuple(reads), tuple(patterns), tuple(layer))


RESIDUAL_KINDS = ('standard', 'token_factored', 'symbolic')


def residual_graph(cfg: ModelConfig) -> Graph:
  """The graph of a standard, Token-Factored or Symbolic Transformer: nodes ``embed``, ``a{l}.h{h}``, ``m{l}``,
  ``logits``. A head's query and key, an MLP and the logits read every earlier node (the residual stream, X_t + X_e
  in the two-stream kinds); a head's value reads every earlier node in the standard kind and, in the two-stream
  kinds, the nodes that write X_t (``embed`` and the heads: the paper's eq. 8)."""
  if cfg.kind not in RESIDUAL_KINDS:
    raise InputError(f'edge graphs are built for the kinds {["program", *RESIDUAL_KINDS]}, got model.kind '
                     f'{cfg.kind!r}')
  unsupported = {'model.stream': (cfg.streams.stream, ('token_factored',)),
                 'model.head_mixing': (cfg.streams.head_mixing, ('independent',)),
                 'model.gate': (cfg.streams.gate, ('none',)),
                 'model.numerical_heads': (cfg.program.numerical_heads, (0,)),
                 'model.relational': (cfg.attention.relational, (False,)),
                 'model.cascade_norm': (cfg.streams.cascade_norm, (False,))}
  for field, (value, allowed) in unsupported.items():
    if cfg.kind != 'standard' and value not in allowed:
      raise InputError(f'edge graphs need {field} in {list(allowed)} (each head writing its own channel of '
                       f'X_t, each FFN X_e), got {value!r}')
  two_stream = cfg.kind != 'standard'
  nodes, layer, writes_t = ['embed'], [-1], [True]
  reads, edges, patterns = [], [], []

  def add(site: str, reader: str, slot: str | None, only_x_t: bool = False):
    _add_reader(edges, reads, site, [n if t or not only_x_t else None for n, t in zip(nodes, writes_t)], reader,
                slot)

  for l in range(cfg.num_layers):
    heads = [f'a{l}.h{h}' for h in range(cfg.num_heads)]
    for h, node in enumerate(heads):
      for slot, _ in HEAD_SLOTS:
        add(f'blocks.{l}.attn.{slot}_input:{h}', node, slot, only_x_t=two_stream and slot == 'v')
      patterns.append((node, f'blocks.{l}.attn.pattern', h))
    nodes += heads
    layer += [l] * len(heads)
    writes_t += [True] * len(heads)
    add(f'blocks.{l}.ffn.in', f'm{l}', None)
    nodes.append(f'm{l}')
    layer.append(l)
    writes_t.append(not two_stream)
  add('final.in', 'logits', None)
  nodes.append('logits')
  layer.append(cfg.num_layers)
  return Graph(tuple(nodes), tuple(edges), tuple(reads), tuple(patterns), tuple(layer), cfg.kind)


def read_edges(graph: Graph, params) -> np.ndarray:
  """``[edges]`` bool: the edges a program's ``params`` read, each input's selected variable and every variable
  into the (linear) readout; patching any other edge changes nothing. Every edge of a residual model."""
  if not graph.program:
    return np.ones(len(graph.edges), bool)
  out = np.zeros(len(graph.edges), bool)
  for site, rows in graph.reads:
    if site == 'readout':
      out[[r for r in rows if r >= 0]] = True
      continue
    module, role = site.split('.')
    row = rows[int(np.argmax(np.asarray(params[module][f'select_{role}'])))]
    if row >= 0:
      out[row] = True
  return out


# ---------------------------------------------------------------------------------------------------------
# The patched pass.
# ---------------------------------------------------------------------------------------------------------
def _inputs(model, params, tokens, key_mask, graph: Graph):
  """(logits, {input site: the stack it reads}) of one pass."""
  seen = {}

  def keep(value, name):
    seen[str(name)] = value
    return value
  with names.session({site: keep for site, _ in graph.reads}, lambda name: False):
    logits = model.apply({'params': params}, tokens, key_mask)
  return logits, seen


def _patched(model, params, tokens, key_mask, graph: Graph, corrupt: dict, w, drop=None, deltas=None):
  """(the logits, {head: its attention pattern}) with each edge e moved a fraction ``w[e]`` of the way to its
  corrupt value. ``drop`` ``[edges]`` bool: no gradient flows back through the clean value of those edges
  (GradDrop); ``deltas``: {head's pattern site: an array added to its pattern} (their gradient is the metric's
  with respect to the pattern)."""
  def mix(rows, theirs):
    def fn(value, name):
      weight = _at(w, rows, 0.0).astype(value.dtype)
      if drop is not None:
        stopped = _at(drop, rows, False)[:, None, None, None]
        value = jnp.where(stopped, jax.lax.stop_gradient(value), value)
      weight = weight[:, None, :, None] if weight.ndim == 2 else weight[:, None, None, None]  # [V, batch, time, 1]
      return value + weight * (theirs - value)
    return fn
  fns, patterns = _pattern_hooks(graph, deltas)
  fns.update({site: mix(jnp.asarray(rows), corrupt[site]) for site, rows in graph.reads})
  with names.session(fns, lambda name: False):
    return model.apply({'params': params}, tokens, key_mask), patterns


def _pattern_hooks(graph: Graph, deltas: dict | None) -> tuple[dict, dict]:
  """(hooks at every head's pattern site, the dict they fill with the patterns of the pass): each adds its
  ``deltas`` entry, whose gradient is then the metric's with respect to the pattern."""
  patterns = {}

  def pattern(value, name):
    value = value + deltas[str(name)] if deltas else value
    patterns[str(name)] = value
    return value
  return {site: pattern for _, site, _ in graph.patterns}, patterns


def _at(values, rows, fill):
  """``values[rows]``, ``fill`` where a row is −1 (no edge); ``values`` may carry more axes (a weight per position)."""
  valid = (rows >= 0).reshape(rows.shape + (1,) * (values.ndim - 1))
  return jnp.where(valid, values[jnp.maximum(rows, 0)], fill)


def _head_outputs(cfg: ModelConfig, params, l: int, z):
  """What each head of block ``l`` adds to the residual stream, ``[heads, batch, time, d_model]``, from its output
  ``attn.z`` ``[batch, time, heads, head_dim]``: through its rows of the output projection (standard), or as its
  own channel of X_t (the two-stream kinds)."""
  if cfg.kind == 'standard':
    return jnp.einsum('bthe,hed->hbtd', z, params[f'layer_{l}']['attention']['out']['kernel'].astype(z.dtype))
  eye = jnp.eye(z.shape[2], dtype=z.dtype)
  return jnp.einsum('bthe,hg->hbtge', z, eye).reshape(z.shape[2], *z.shape[:2], -1)


def _residual_pass(model, params, tokens, key_mask, graph: Graph, corrupt=None, w=None, drop=None, deltas=None):
  """(the logits, {pattern site: the patterns}, every source node's output ``[sources, batch, time, d_model]``)
  of a residual model's pass with each edge e moved a fraction ``w[e]`` of the way to its corrupt value: the
  reader's input gets w_e (corrupt_u − out_u) added, out_u being what node u wrote in this pass. ``drop`` and
  ``deltas`` as in ``_patched``; without ``corrupt`` nothing is patched."""
  cfg = model.config
  outs = []
  by_site: dict[str, list] = {}
  for site, rows in graph.reads:
    base, _, head = site.partition(':')
    by_site.setdefault(base, []).append(rows)

  def record(value, name):
    outs.append(value)
    return value

  def heads(l):
    def fn(z, name):
      outs.extend(_head_outputs(cfg, params, l, z))
      return z
    return fn

  def read(base):
    rows = np.asarray(by_site[base])                           # [readers, sources]: a head each, or one

    def fn(value, name):
      n = len(outs)                                            # the sources written before this reader
      index = jnp.asarray(rows[:, :n])
      weight = _at(w, index, 0.0).astype(value.dtype)
      ours = jnp.stack(outs)
      into = 'btrd' if value.ndim == 4 else 'btd'              # per head, or one input
      spec = 'rut' if weight.ndim == 3 else 'ru'               # a weight per position, or one
      new = value + jnp.einsum(f'{spec},ubtd->{into}', weight, corrupt[:n] - ours)
      if drop is not None:  # the same value, without the gradient through the dropped sources' clean outputs
        stopped = _at(drop, index, False).astype(value.dtype)
        stopped = (stopped[..., None] if weight.ndim == 3 else stopped) * (1 - weight)
        new = new + jnp.einsum(f'{spec},ubtd->{into}', stopped, jax.lax.stop_gradient(ours) - ours)
      return new
    return fn
  fns, patterns = _pattern_hooks(graph, deltas)
  fns.update({'embed': record, **{f'blocks.{l}.attn.z': heads(l) for l in range(cfg.num_layers)},
              **{f'blocks.{l}.ffn.out': record for l in range(cfg.num_layers)}})
  if corrupt is not None:
    fns.update({base: read(base) for base in by_site})
  with names.session(fns, lambda name: False):
    logits = model.apply({'params': params}, tokens, key_mask)
  return logits, patterns, jnp.stack(outs)


def _head_patterns(graph: Graph, patterns: dict):
  """Every head's attention pattern (or its gradient), ``[heads, batch, queries, keys]``, in ``graph.patterns``'
  order, from {pattern site: its value}."""
  return jnp.stack([patterns[site] if index < 0 else patterns[site][:, index] for _, site, index in graph.patterns])


def resample_pairs(key_mask, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(rows, partners): each input of a batch paired with another of the same length (``key_mask``'s real
  positions), never itself — a cyclic shift within each length's shuffled inputs — for ``inputs[rows]`` clean and
  ``inputs[partners]`` corrupt (resample ablation). A length held by one input alone is left out."""
  lengths = np.asarray(key_mask).astype(bool).sum(1)
  rng = np.random.default_rng(seed)
  rows, partners = [], []
  for n in np.unique(lengths):
    group = rng.permutation(np.nonzero(lengths == n)[0])
    if len(group) > 1:
      rows += list(group)
      partners += list(np.roll(group, 1))
  if not rows:
    raise InputError('no two inputs of the batch have the same length: nothing to pair for resample ablation')
  return np.array(rows), np.array(partners)


def log_prob_metric(targets, weights) -> Callable[[jax.Array], jax.Array]:
  """The mean log-probability of ``targets`` ``[batch, time]`` over the positions ``weights`` marks: the
  default metric (higher is the clean behaviour)."""
  targets, weights = jnp.asarray(targets), jnp.asarray(weights, jnp.float32)

  def metric(logits):
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32), -1), targets[..., None], -1)[..., 0]
    return (logp * weights).sum() / jnp.maximum(weights.sum(), 1.0)
  return metric


def _kl(clean_logits, logits, weights):
  """The mean over the weighted positions of KL(clean ‖ patched)."""
  p = jax.nn.log_softmax(clean_logits.astype(jnp.float32), -1)
  q = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  per = (jnp.exp(p) * (p - q)).sum(-1)
  return (per * weights).sum() / jnp.maximum(weights.sum(), 1.0)


class Edges:
  """Edge patching of one model on one pair of batches, and the methods that rank its edges.

  ``clean`` and ``corrupt``: token ids ``[batch, time]`` of the same shape (pad the shorter, and give
  ``key_mask``); ``metric(logits) -> scalar`` with ``jnp`` (default: the log-probability of the clean run's
  predictions at ``weights``' positions, every position by default). Each method is compiled once per object
  and returns ``[edges]`` in ``graph.edges``' order.
  """

  def __init__(self, model, params, clean, corrupt, metric: Callable | None = None, key_mask=None, weights=None):
    self.graph = graph_of(model.config)
    if not self.graph.program:
      model = core.analysis_model(model)
    clean, corrupt = np.asarray(clean), np.asarray(corrupt)
    if clean.ndim != 2 or clean.shape != corrupt.shape:
      raise InputError(f'clean and corrupt must be token ids of one shape [batch, time], got {clean.shape} and '
                       f'{corrupt.shape}: pad the shorter prompts and pass key_mask')
    if key_mask is not None and np.shape(key_mask) != clean.shape:
      raise InputError(f'key_mask must have the tokens\' shape {clean.shape}, got {np.shape(key_mask)}')
    self.model, self.params = model, core.plain_params(params)
    self.read = read_edges(self.graph, self.params)
    self.clean, self.corrupt = jnp.asarray(clean), jnp.asarray(corrupt)
    self.key_mask = None if key_mask is None else jnp.asarray(key_mask)
    weights = np.ones(clean.shape, np.float32) if weights is None else np.asarray(weights, np.float32)
    if key_mask is not None:
      weights = weights * np.asarray(key_mask, np.float32)
    self.weights = jnp.asarray(weights)
    runs = engine.compiled(('edges', 'runs', model, self.graph), lambda: functools.partial(_runs, model, self.graph))
    self.clean_logits, corrupt_run = runs(self.params, self.clean, self.corrupt, self.key_mask)
    if metric is None:
      metric = log_prob_metric(jnp.argmax(self.clean_logits, -1), self.weights)
    self.metric = metric
    # The metric's arrays are arguments of the programs and its Python numbers constants (as a hook's are in the
    # 'static' tier), so a second object of the same model, shapes and metric code reuses every compiled program.
    self._split = engine.split_hooks({'metric': metric}, static_numbers=True)
    self._data = _Data(self.params, self.clean, self.key_mask, corrupt_run, self._split.leaves, self.clean_logits,
                       self.weights)

  def _program(self, name: str) -> Callable:
    """The method's compiled program, kept by the interpretability engine; its first argument is ``_Data``."""
    static = _Static(self.model, self.graph, self._split)
    return engine.compiled(('edges', name, self.model, self.graph, self._split.key),
                           lambda: functools.partial(_PROGRAMS[name], static))

  def _f(self, w) -> jax.Array:
    return self._program('value')(self._data, w)

  # -- the pass and its metric ---------------------------------------------------------------------------
  def logits(self, patched: Sequence[str] | np.ndarray = ()) -> np.ndarray:
    """The logits with the ``patched`` edges from the corrupt run: names, a ``[edges]`` mask, or weights
    ``[edges]`` or ``[edges, time]`` (per position), each the fraction of the way to the corrupt value."""
    return np.asarray(self._program('pass')(self._data, self._weights(patched))[0])

  def value(self, patched: Sequence[str] | np.ndarray = ()) -> float:
    """The metric with the ``patched`` edges (as ``logits`` takes them) from the corrupt run."""
    return float(self._f(self._weights(patched)))

  def _weights(self, patched) -> jax.Array:
    shapes = ((len(self.graph.edges),), (len(self.graph.edges), self.clean.shape[1]))
    if isinstance(patched, np.ndarray) and patched.dtype != object and patched.shape in shapes:
      return jnp.asarray(patched, jnp.float32)
    return jnp.asarray(self.graph.mask(list(patched)), jnp.float32)

  # -- the methods ---------------------------------------------------------------------------------------
  def exact(self, chunk: int = 64) -> np.ndarray:
    """The change in the metric from patching each edge alone: f(e_i) − f(0). An edge the model does not read
    (``read``) changes nothing and is not patched: its entry is 0."""
    n, read = len(self.graph.edges), np.nonzero(self.read)[0]
    size = max(1, min(chunk, len(read)))
    padded = np.concatenate([read, np.full(-len(read) % size, read[0])])
    ws = jnp.eye(n, dtype=jnp.float32)[padded].reshape(-1, size, n)
    values = np.asarray(self._program('values')(self._data, ws)).reshape(-1)[:len(read)]
    out = np.zeros(n, np.float32)
    out[read] = values - float(self._f(jnp.zeros(n, jnp.float32)))
    return out

  def eap(self) -> np.ndarray:
    """Edge attribution patching: ∇f at the clean run, one backward pass."""
    return np.asarray(self._program('grad')(self._data, jnp.zeros(len(self.graph.edges), jnp.float32)))

  def eap_ig(self, steps: int = 16) -> np.ndarray:
    """EAP with integrated gradients over ``steps`` midpoints of the path from clean to corrupt."""
    if not isinstance(steps, int) or steps < 1:
      raise InputError(f'steps must be a positive integer, got {steps!r}')
    return self._mean_gradient((len(self.graph.edges),), steps)

  def _mean_gradient(self, shape: tuple[int, ...], steps: int) -> np.ndarray:
    """The mean of ∇f(α·1) over ``steps`` midpoints α of [0, 1], weights of ``shape``."""
    # One compiled backward pass a step holds one pass's activations, where the steps batched in one program hold
    # them all; neither is faster on a CPU for every kind (benchmarks/speed/edges.py times both).
    grad = self._program('grad')
    total = sum(np.asarray(grad(self._data, jnp.full(shape, (k + 0.5) / steps, jnp.float32)), np.float64)
                for k in range(steps))
    return total / steps

  def atp_star(self, grad_drop: bool = True, chunk: int = 64) -> np.ndarray:
    """AtP* ("AtP*: An efficient and scalable method for localizing LLM behaviour to components", §3), on edges:
    EAP with its two fixes. For an edge into a head's query or key the head's attention pattern is computed with
    the edge patched (a pass per such edge, batched) and only what follows the pattern is linear:
    ⟨∂f/∂A, A(patched) − A(clean)⟩, where a saturated softmax would give EAP a gradient near 0. GradDrop: the
    estimate is taken L times, each with no gradient through one layer's outputs, and the magnitudes averaged,
    1/(L − 1) Σ_l |AtP_l|, so that a direct and an indirect path that cancel in one estimate do not hide an edge.
    Scores are magnitudes (≥ 0)."""
    g, n = self.graph, len(self.graph.edges)
    source, reader = g.ends
    layers = g.layer[-1]
    head_of = {node: i for i, (node, _, _) in enumerate(g.patterns)}
    qk = np.array([e.endswith(('<q>', '<k>')) for e in g.edges])
    which = np.array([head_of.get(g.nodes[r], -1) for r in reader])
    zero = jnp.zeros(n, jnp.float32)
    _, clean_patterns = self._program('pass')(self._data, zero)
    deltas = {site: jnp.zeros_like(clean_patterns[site]) for site in {site for _, site, _ in g.patterns}}
    drops = [np.array([g.layer[a] == l for a in source]) for l in range(layers)] if grad_drop and layers > 1 \
        else [np.zeros(n, bool)]
    gradients = self._program('gradients')
    estimates = []
    rows = np.nonzero(qk)[0]
    moved = self._moved_patterns(rows, which, clean_patterns, chunk) if len(rows) else None
    for drop in drops:
      by_edge, by_pattern = gradients(self._data, zero, jnp.asarray(drop), deltas)
      estimate = np.asarray(by_edge, np.float64)
      if moved is not None:
        grads = np.asarray(_head_patterns(g, by_pattern))                  # [heads, batch, queries, keys]
        estimate[rows] = (grads[which[rows]] * moved).reshape(len(rows), -1).sum(-1)
      estimates.append(np.abs(estimate))
    return np.sum(estimates, 0) / max(len(drops) - 1, 1)

  def _moved_patterns(self, rows: np.ndarray, which: np.ndarray, clean: dict, chunk: int):
    """``[len(rows), batch, queries, keys]``: how each edge of ``rows`` (into a head's query or key) moves that
    head's attention pattern when it alone is patched."""
    n = len(self.graph.edges)
    size = max(1, min(chunk, len(rows)))
    padded = -(-len(rows) // size) * size
    index = np.concatenate([rows, np.full(padded - len(rows), rows[0])])
    ws = jnp.eye(n, dtype=jnp.float32)[index].reshape(-1, size, n)
    heads = jnp.asarray(which[index]).reshape(-1, size)
    out = self._program('moved')(self._data, ws, heads, _head_patterns(self.graph, clean))
    return np.asarray(out).reshape(padded, *out.shape[2:])[:len(rows)]

  NODE_METHODS = ('exact', 'atp', 'atp_star', 'eap_ig')

  def node_sweep(self, method: str = 'exact', nodes: Sequence[str] | None = None, steps: int = 16,
                 chunk: int = 64) -> np.ndarray:
    """``[nodes, time]``: the change in the metric from patching a node's output at one position (every edge out
    of it, at that position, from the corrupt run), per node and position: ``'exact'``, each patched alone;
    ``'atp'``, attribution patching (the gradient, summed over the node's edges); ``'atp_star'``, AtP with
    GradDrop (a node's output needs no query-key fix: 1/(L − 1) Σ_l |AtP_l|); ``'eap_ig'``, integrated gradients
    over ``steps`` midpoints. ``nodes``: every head by default."""
    if method not in self.NODE_METHODS:
      raise InputError(f'unknown node method {method!r}; the methods are {list(self.NODE_METHODS)}')
    g = self.graph
    nodes = [n for n, _, _ in g.patterns] if nodes is None else list(nodes)
    unknown = [n for n in nodes if n not in g.nodes or n == 'logits']
    if unknown:
      raise InputError(f'{unknown[0]!r} is not a node with outputs; nodes are {list(g.nodes[:-1])}')
    source = g.ends[0]
    out = np.stack([source == g.nodes.index(n) for n in nodes]).astype(np.float32)   # [nodes, edges]
    n, time = len(g.edges), self.clean.shape[1]
    zero = jnp.zeros((n, time), jnp.float32)
    if method == 'exact':
      patches = (out[:, None, :, None] * np.eye(time, dtype=np.float32)[None, :, None, :]).reshape(-1, n, time)
      size = max(1, min(chunk, len(patches)))
      padded = np.concatenate([patches, np.zeros((-len(patches) % size, n, time), np.float32)])
      values = np.asarray(self._program('values')(self._data, jnp.asarray(padded).reshape(-1, size, n, time)))
      return values.reshape(-1)[:len(patches)].reshape(len(nodes), time) - float(self._f(jnp.zeros(n)))
    if method == 'eap_ig':
      return out @ self._mean_gradient((n, time), steps)
    layers = g.layer[-1]
    drops = [np.array([g.layer[a] == l for a in source]) for l in range(layers)] \
        if method == 'atp_star' and layers > 1 else [None]
    gradients = self._program('gradients')
    estimates = [out @ np.asarray(gradients(self._data, zero, None if d is None else jnp.asarray(d), None)[0])
                 for d in drops]
    if method == 'atp':
      return estimates[0]
    return np.sum(np.abs(estimates), 0) / max(len(drops) - 1, 1)

  def acdc(self, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """ACDC ("Towards Automated Circuit Discovery", Algorithm 1) on the KL divergence from the clean output:
    (``[edges]`` bool, the edges kept; ``[edges]`` the rise in KL each edge's removal was tried at). Readers are
    visited from the logits back, each one's edges from its latest source back; an edge the model does not read,
    and the inputs of a node none of whose edges are kept, are removed without a pass (they change nothing)."""
    if not isinstance(threshold, (int, float)) or not np.isfinite(threshold) or threshold < 0:
      raise InputError(f'threshold must be a number >= 0 (a rise in KL divergence), got {threshold!r}')
    n = len(self.graph.edges)
    source, reader = self.graph.ends
    w = np.zeros(n, np.float32)
    scores = np.zeros(n)
    kl = self._program('kl')
    current = float(kl(self._data, jnp.asarray(w)))
    for e in np.lexsort((-source, -reader)):
      leaves = (source == reader[e]) & (w == 0)
      if not self.read[e] or (self.graph.nodes[reader[e]] != 'logits' and not leaves.any()):
        w[e] = 1.0
        continue
      w[e] = 1.0
      new = float(kl(self._data, jnp.asarray(w)))
      scores[e] = new - current
      if new - current <= threshold:
        current = new
      else:
        w[e] = 0.0
    return w == 0, scores

  def faithfulness(self, circuit: Sequence[str] | np.ndarray) -> float:
    """(f(circuit) − f(none)) / (f(all) − f(none)): every edge outside ``circuit`` (names or a ``[edges]`` bool
    mask) patched."""
    keep = self._weights(circuit)
    n = len(self.graph.edges)
    full, empty = float(self._f(jnp.zeros(n))), float(self._f(jnp.ones(n)))
    if full == empty:
      raise InputError('the metric is the same on the clean and the corrupt run: no faithfulness to measure')
    return (float(self._f(1.0 - keep)) - empty) / (full - empty)


# ---------------------------------------------------------------------------------------------------------
# The methods' programs: functions of the data, compiled once per model, graph and metric structure.
# ---------------------------------------------------------------------------------------------------------
class _Data(NamedTuple):
  """What the programs of an ``Edges`` read, passed as arguments."""
  params: Any
  clean: jax.Array
  key_mask: jax.Array | None
  corrupt: Any              # the corrupt run's stacks (a program) or node outputs (a residual model)
  metric: tuple             # the metric's arrays (``engine.split_hooks``)
  clean_logits: jax.Array
  weights: jax.Array


class _Static(NamedTuple):
  model: Any
  graph: Graph
  metric: engine.Split


def _runs(model, graph: Graph, params, clean, corrupt, key_mask):
  """(the clean logits, what the corrupt run gives each edge's source)."""
  clean_logits = model.apply({'params': params}, clean, key_mask)
  if graph.program:
    return clean_logits, _inputs(model, params, corrupt, key_mask, graph)[1]
  return clean_logits, _residual_pass(model, params, corrupt, key_mask, graph)[2]


def _pass(st: _Static, d: _Data, w, drop=None, deltas=None):
  """(the logits, {pattern site: the patterns}) with each edge moved ``w`` of the way to its corrupt value."""
  if st.graph.program:
    return _patched(st.model, d.params, d.clean, d.key_mask, st.graph, d.corrupt, w, drop, deltas)
  return _residual_pass(st.model, d.params, d.clean, d.key_mask, st.graph, d.corrupt, w, drop, deltas)[:2]


def _value(st: _Static, d: _Data, w, drop=None, deltas=None):
  metric = st.metric.rebuild(iter(d.metric))['metric']
  return metric(_pass(st, d, w, drop, deltas)[0])


def _values(st: _Static, d: _Data, ws):
  """The metric over ``[chunks, size, edges]`` weights: vmapped within a chunk, the chunks one after another."""
  return jax.lax.map(jax.vmap(lambda w: _value(st, d, w)), ws)


def _moved(st: _Static, d: _Data, ws, heads, clean_patterns):
  """``[chunks, size, ...]``: how head ``heads[c, i]``'s pattern moves with ``ws[c, i]``'s edges patched."""
  def one(w, head):
    return _head_patterns(st.graph, _pass(st, d, w)[1])[head] - clean_patterns[head]
  return jax.lax.map(lambda c: jax.vmap(one)(*c), (ws, heads))


_PROGRAMS = {
    'pass': _pass, 'value': _value, 'values': _values, 'moved': _moved,
    'grad': lambda st, d, w: jax.grad(_value, 2)(st, d, w),
    # (∂f/∂w, ∂f/∂deltas) with no gradient through the ``drop`` edges' clean values (GradDrop)
    'gradients': lambda st, d, w, drop, deltas: jax.grad(_value, (2, 4))(st, d, w, drop, deltas),
    'kl': lambda st, d, w: _kl(d.clean_logits, _pass(st, d, w)[0], d.weights),
}


# ---------------------------------------------------------------------------------------------------------
# Scoring a ranking of edges against the true ones.
# ---------------------------------------------------------------------------------------------------------
def auroc(scores: np.ndarray, truth: np.ndarray) -> float:
  """The area under the ROC curve of ranking edges by ``scores`` (higher first) against ``truth``: the chance
  that a true edge outranks a false one, ties counting half (NaN without both kinds)."""
  truth = np.asarray(truth, bool)
  pos, neg = scores[truth], scores[~truth]
  if not len(pos) or not len(neg):
    return float('nan')
  greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
  return float(greater / (len(pos) * len(neg)))


def precision_recall(kept: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
  """(precision, recall) of the edge set ``kept`` against ``truth``."""
  kept, truth = np.asarray(kept, bool), np.asarray(truth, bool)
  hits = (kept & truth).sum()
  return float(hits / max(kept.sum(), 1)), float(hits / max(truth.sum(), 1))


def top(scores: np.ndarray, k: int) -> np.ndarray:
  """``[edges]`` bool: the ``k`` edges of largest score (ties broken by order)."""
  out = np.zeros(len(scores), bool)
  out[np.argsort(-scores, kind='stable')[:k]] = True
  return out
