"""From a Transformer Program (model kind 'program', ``symjax.model.transformer_program``) to Python code a person
reads, as "Learning Transformer Programs" §3.4 writes its programs: each head a predicate over the two
variables it reads, then ``select_closest`` / ``select`` and ``aggregate`` / ``aggregate_sum``; each MLP an
``if/elif`` over its inputs, grouped by the value it writes. The readout (that paper's classifier) is written as
decisions — a tree of tests on its variables' values, exact on every combination the task's inputs reach —
where the inputs are the task's every input and the tree writes at most ``DECISION_LIMIT`` values and tags;
otherwise it stays a data file.

Where a predicate is arithmetic it is written so (``k_position == q_position - 1``, ``k_token < q_token`` for
numbers), and an MLP that reads one of its inputs only is written over that one. The values a variable can
take (its domain) follow from the program: the input tokens, the positions 0…max_len − 1, a categorical head
copies its value variable's, a numerical head counts 0…max_len (or sums a numerical variable, up to the
cardinality − 1 it saturates at), an MLP writes what its table holds over its inputs' domains. Predicates
and tables are written over those domains only.

Pruning: a variable whose readout term can be left out without changing any prediction on the task's whole
input space (``RaspTask.input_space``; the train and validation inputs where the space is too large to
enumerate) is left out; a head or MLP whose variable nothing then reads is dropped. The fidelity of the pruned
program is measured afterwards, as for every program (``symjax.proj.decompile.evaluate``). On the task's every
input the classifier is then fit anew over as few variables as tag every input alike (``refit``), and what only
the others read is dropped too.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import tempfile
import textwrap
import types

import numpy as np

from symjax.proj import classifier_fit
from symjax.proj import decompile as tables_decompile
from symjax.proj.classifier_fit import decides as _decides
from symjax.proj.classifier_fit import distinct_rows as _distinct_rows
from symjax.system.errors import InputError

WIDTH = 88  # the generated code's line width, as black formats the published programs
HEADER_WIDTH = 104  # the docstrings' width, as the runtime's (RUNTIME)


@dataclasses.dataclass
class Module:
  """A head or MLP of the program: the variables it reads, in order, and its table."""

  name: str
  kind: str                 # 'categorical', 'numerical' or 'mlp'
  reads: tuple[str, ...]    # categorical: (query, key, value); numerical: (query, key), and the numerical
                            # variable it sums where it has one (model.numerical_values); mlp: (first, second)
  table: np.ndarray         # categorical: key value per query value [card]; numerical: [card, card] bool;
                            # mlp: value written per pair [card, card]
  queried: tuple[int, ...] | None = None  # a head's query values its code must keep exact (``untagged_free``);
                                          # None: every value its query's domain holds


@dataclasses.dataclass
class Plan:
  """A Transformer Program's discrete choices, read from its parameters."""

  modules: list[Module]
  readout: dict[str, np.ndarray]   # variable -> [card, vocab] rows of the classifier; 'bias' -> [vocab]
  tokens: list[str]
  max_len: int
  causal: bool
  card: int
  aliases: dict[str, str] = dataclasses.field(default_factory=dict)  # a module's variable -> an equal earlier one
  untagged: tuple[int, ...] = ()   # input tokens whose positions the task never tags: the program tags them 0


def plan_of(params, cfg) -> Plan:
  """The program of a Transformer Program's ``params``: every argmax the forward pass takes, as tables."""
  import jax
  import jax.numpy as jnp

  from symjax.model import transformer_program as tp
  card = tp.cardinality(cfg)
  names = tp.variable_names(cfg)
  first_numerical = cfg.num_heads - cfg.program.numerical_heads
  modules = []

  def chosen(p, role, readable):
    return readable[int(np.argmax(np.asarray(p[f'select_{role}'])))]

  pairs = np.stack(np.meshgrid(np.arange(card), np.arange(card), indexing='ij'), -1).reshape(-1, 2)
  x = np.concatenate([np.eye(card)[pairs[:, 0]], np.eye(card)[pairs[:, 1]]], -1)[None].astype(np.float32)
  for l in range(cfg.num_layers):
    readable = tp.variable_names(cfg, l)
    for h in range(cfg.num_heads):
      name, p = f'attn_{l}_{h}', params[f'attn_{l}_{h}']
      psi = np.asarray(p['predicate'])
      if h < first_numerical:
        modules.append(Module(name, 'categorical', tuple(chosen(p, r, readable) for r in ('query', 'key', 'value')),
                              psi.argmax(-1)))
      else:
        reads = tuple(chosen(p, r, tp.head_reads(cfg, l, numerical=True)) for r in ('query', 'key'))
        if cfg.program.numerical_values:
          reads += (chosen(p, 'value', tp.numerical_names(cfg, l)),)
        modules.append(Module(name, 'numerical', reads, psi > 0))
    readable = tp.variable_names(cfg, l, with_heads_of=l)
    for m in range(cfg.program.mlps):
      name, p = f'mlp_{l}_{m}', params[f'mlp_{l}_{m}']
      logits = jax.jit(tp.mlp_logits)({k: jnp.asarray(v) for k, v in p.items()}, jnp.asarray(x))
      table = np.asarray(logits).argmax(-1).reshape(card, card)
      modules.append(Module(name, 'mlp', tuple(chosen(p, r, readable) for r in ('first', 'second')), table))
  weights = np.asarray(tp.readout_of(jax.tree.map(jnp.asarray, params), cfg), np.float32)  # [vocab, variables·card+1]
  readout = {n: weights[:, i * card:(i + 1) * card].T.copy() for i, n in enumerate(names)}
  readout['bias'] = weights[:, -1].copy()
  return Plan(modules, readout, [], cfg.max_len, cfg.causal, card)


# ---------------------------------------------------------------------------------------------------------
# Domains: the values each variable can take.
# ---------------------------------------------------------------------------------------------------------
NOTHING = 'nothing'  # what a head reads as its query (or key) once that was a constant: a one-sided predicate


def domains(plan: Plan, input_tokens: list[int], first: dict[str, tuple[int, ...]] | None = None
            ) -> dict[str, tuple[tuple[int, ...], bool]]:
  """variable -> (its values, whether they are tokens). ``first``: the values variables hold at position 0
  (the inputs' first tokens, position 0), which a categorical head whose predicate never holds copies; a
  numerical head whose predicate never holds is 0."""
  out = {'tokens': (tuple(sorted(input_tokens)), True), 'positions': (tuple(range(plan.max_len)), False),
         'ones': ((1,), False), NOTHING: ((0,), False)}
  first = {'positions': (0,), **(first or {})}
  for m in plan.modules:
    never = m.kind != 'mlp' and not _truth(m, out).any()
    if m.kind == 'categorical':
      at_first = first.get(m.reads[2])
      out[m.name] = (at_first, out[m.reads[2]][1]) if never and at_first is not None else out[m.reads[2]]
    elif m.kind == 'numerical':       # at most max_len keys, each adding its value; saturating at card − 1
      most = 0 if never else plan.max_len * max(out[m.reads[2]][0]) if len(m.reads) > 2 else plan.max_len
      out[m.name] = (tuple(range(min(most, plan.card - 1) + 1)), False)
    else:
      a, b = (out[r][0] for r in m.reads)
      pairs = zip(a, a) if m.reads[0] == m.reads[1] else ((i, j) for i in a for j in b)
      out[m.name] = (tuple(sorted({int(m.table[i, j]) for i, j in pairs})), False)
  for alias, name in plan.aliases.items():
    out[alias] = out[name]
  return out


# ---------------------------------------------------------------------------------------------------------
# Simplifying: passes over the plan that leave every variable's value unchanged on every input.
# ---------------------------------------------------------------------------------------------------------
def simplify(plan: Plan, doms_of, merge: bool = True) -> tuple[Plan, list[str]]:
  """The plan with constants folded into what reads them and duplicate modules merged, repeated until nothing
  changes; and a sentence per pass that changed something. ``doms_of(plan)``: its domains.

  - A variable with one reachable value is a constant (an MLP whose table is constant over its inputs' values,
    a numerical head whose predicate never holds, a categorical head copying a constant): an MLP reading it
    becomes a table over its other input, and a head whose query (or key) it is gets a predicate of the key
    (query) alone (``NOTHING`` in its place); nothing then reads the constant, and the pruning leaves it out
    (its classifier row joins the bias). A head that matches no key is written ``at_first(value)``. A head
    whose predicate matches the same keys for every value of its query reads its key alone, as above.
  - A module equal to an earlier one (the same kind, the same variables read, the same predicate or table over
    their values) is that one: what reads it reads the earlier one, and the classifier reads its rows at the
    earlier one's values (``Plan.aliases``). ``merge=False`` folds constants only: every module stays the model's.
  """
  plan = dataclasses.replace(plan, modules=[dataclasses.replace(m) for m in plan.modules], aliases=dict(plan.aliases))
  folded, merged = set(), set()
  for _ in range(len(plan.modules) + 1):
    doms = doms_of(plan)
    constants = {m.name: doms[m.name][0][0] for m in plan.modules if len(doms[m.name][0]) == 1}
    changed = False
    for m in plan.modules:
      if m.kind == 'mlp' and (m.reads[0] in constants) != (m.reads[1] in constants):
        # One variable read twice is read on the diagonal: table[x, x] = the old table at (c, x) or (x, c).
        c, other = (0, 1) if m.reads[0] in constants else (1, 0)
        value = constants[m.reads[c]]
        table = m.table[value][None, :] if c == 0 else m.table[:, value][:, None]
        m.reads, m.table = (m.reads[other],) * 2, np.broadcast_to(table, m.table.shape).copy()
        folded.add(m.name)
        changed = True
      elif m.kind != 'mlp' and m.reads[0] in constants:
        m.table = m.table[constants[m.reads[0]]][None].copy()
        m.reads, m.queried = (NOTHING, *m.reads[1:]), None
        folded.add(m.name)
        changed = True
      elif m.kind != 'mlp' and m.reads[0] != NOTHING and m.reads[1] != NOTHING and _ignores_query(m, doms):
        # The same keys match whatever the query holds: a predicate of the key alone.
        m.table = m.table[_query_domain(m, doms)[0][0]][None].copy()
        m.reads, m.queried = (NOTHING, *m.reads[1:]), None
        folded.add(m.name)
        changed = True
      elif m.kind != 'mlp' and m.reads[1] in constants and m.reads[0] != NOTHING:
        # Every key holds c: a query matches all keys or none. Key value 0 of NOTHING stands for c (a
        # categorical head names key value 1 where it named another value: NOTHING never holds 1).
        c = constants[m.reads[1]]
        m.table = (np.where(m.table == c, 0, 1) if m.kind == 'categorical' else m.table[:, c:c + 1].copy())
        m.reads = (m.reads[0], NOTHING, *m.reads[2:])
        folded.add(m.name)
        changed = True
    seen: dict = {}
    for m in plan.modules if merge else ():
      # A head that matches no key holds its value's at position 0, whatever it compares.
      # A head exact only at tagged positions (``Module.queried``) merges only into another such head, so that
      # what reads the merged one at an untagged position reads it exact there too.
      signature = (('never', m.reads[2]) if _never(m, doms) else ('every', m.reads[2]) if _every(m, doms) else
                   (m.kind, m.reads, m.queried is not None, _signature(m, doms)))
      if signature in seen and m.name not in constants:
        earlier = seen[signature]
        plan.aliases[m.name] = earlier
        merged.add(m.name)
        changed = True
      else:
        seen.setdefault(signature, m.name)
    if plan.aliases:
      for alias in plan.aliases:
        while plan.aliases[alias] in plan.aliases:
          plan.aliases[alias] = plan.aliases[plan.aliases[alias]]
      plan.modules = [m for m in plan.modules if m.name not in plan.aliases]
      for m in plan.modules:
        m.reads = tuple(plan.aliases.get(r, r) for r in m.reads)
    if not changed:
      break
  notes = []
  if folded:
    notes.append('Modules folded in, as each reads a constant or a query its predicate ignores: '
                 f'{", ".join(sorted(folded))}.')
  if merged:
    notes.append('Equal to an earlier module, and merged into it: '
                 + ', '.join(f'{a} = {plan.aliases[a]}' for a in sorted(merged)) + '.')
  return plan, notes


def tagged_positions(plan: Plan, ids: np.ndarray, real: np.ndarray) -> np.ndarray:
  """The positions of token ``ids`` the program tags: the real ones that hold no token of ``Plan.untagged``
  (the program tags the others 0, as the task does)."""
  return real & ~np.isin(ids, plan.untagged)


def untagged_free(plan: Plan) -> set[str]:
  """The modules whose values at the positions the task never tags (``Plan.untagged``) reach no tag: everything
  that reads one reads it at its own position (an MLP, a head's query, the classifier) and is such a module
  too. A head among them needs its predicate exact only for the query values tagged positions hold."""
  readers: dict[str, list[tuple[Module, int]]] = {}
  for m in plan.modules:
    for i, r in enumerate(m.reads):
      readers.setdefault(r, []).append((m, i))
  free: set[str] = set()
  for m in reversed(plan.modules):
    if all((r.kind == 'mlp' or i == 0) and r.name in free for r, i in readers.get(m.name, [])):
      free.add(m.name)
  return free


def restrict_to_tagged(plan: Plan, doms_of, inputs: np.ndarray, lengths: np.ndarray, data_file: str,
                       exhaustive: bool = True) -> tuple[Plan, list[str]]:
  """The plan with each head of ``untagged_free`` exact only for the query values tagged positions hold
  (``Module.queried``), and such modules merged where they equal an earlier variable, or a renaming of one, at
  the tagged positions of ``inputs`` (the task's every input); then simplified again. A predicate that named
  other keys for ``<s>`` alone, say, is then its rule.

  Where ``inputs`` are not the task's every input (``exhaustive`` False), only what holds on every input is
  used: a head whose query is the input token is exact for the tokens other than ``Plan.untagged``, and heads
  equal on those merge; no renaming is looked for."""
  free = untagged_free(plan)
  if not exhaustive:
    plan = dataclasses.replace(plan, modules=[dataclasses.replace(m) for m in plan.modules])
    tagged_tokens = tuple(v for v in doms_of(plan)['tokens'][0] if v not in plan.untagged)
    for m in plan.modules:
      if m.name in free and m.kind != 'mlp' and m.reads[0] == 'tokens':
        m.queried = tagged_tokens
    return simplify(plan, doms_of)
  everything = set(_variables(plan))
  values, real = _run(plan, doms_of(plan), everything, _readout(plan, everything), inputs, lengths, data_file)
  tagged = tagged_positions(plan, inputs, real)
  plan = dataclasses.replace(plan, modules=[dataclasses.replace(m) for m in plan.modules])
  for m in plan.modules:
    if m.name in free and m.kind != 'mlp' and m.reads[0] in values:
      m.queried = tuple(int(v) for v in np.unique(values[m.reads[0]].ids[tagged]))
  plan, renamings = merge_renamings(plan, {n: v.ids[tagged] for n, v in values.items()}, free)
  plan, again = simplify(plan, doms_of)
  # A head exact at tagged positions alone may now hold, at '<s>', a value no tagged position holds: a variable
  # that differed from it only there can be a renaming of it at every position, as the code computes them.
  plan, everywhere = merge_renamings_everywhere(plan, doms_of, inputs, lengths, data_file)
  return plan, renamings + again + everywhere


def merge_renamings_everywhere(plan: Plan, doms_of, inputs: np.ndarray, lengths: np.ndarray, data_file: str
                               ) -> tuple[Plan, list[str]]:
  """``merge_renamings`` on every real position of ``inputs`` (the task's every input), as the plan's code
  computes each variable there, then, for the modules whose values at untagged positions reach no tag
  (``untagged_free``), on the tagged positions alone (``leftovers`` counts either as a duplicate); simplified
  again where something merged."""
  def run(plan):
    everything = set(_variables(plan))
    return _run(plan, doms_of(plan), everything, _readout(plan, everything), inputs, lengths, data_file)

  values, real = run(plan)
  plan, renamings = merge_renamings(plan, {n: v.ids[real] for n, v in values.items()})
  if renamings:
    plan, again = simplify(plan, doms_of)
    renamings += again
    values, real = run(plan)  # merging renamed what copied a merged variable
  if plan.untagged:
    # A renaming at the tagged positions only, found once a head or MLP was loosened (``loosen``).
    tagged = tagged_positions(plan, inputs, real)
    plan, at_tagged = merge_renamings(plan, {n: v.ids[tagged] for n, v in values.items()}, untagged_free(plan))
    if at_tagged:
      plan, again = simplify(plan, doms_of)
      renamings += at_tagged + again
  return plan, renamings


def _ignores_query(m: Module, doms) -> bool:
  """Whether a head's predicate matches the same keys for every value its query takes (two values at least)."""
  truth = _truth(m, doms)
  return len(truth) > 1 and bool((truth == truth[:1]).all())


def merge_renamings(plan: Plan, values: dict[str, np.ndarray], mergeable: set[str] | None = None
                    ) -> tuple[Plan, list[str]]:
  """The plan with each module whose value is a renaming of an earlier variable's — one value for each of that
  variable's values and none shared, at every position of ``values`` (each variable's ids there; the task's
  every input) — merged into that variable: what reads it reads the earlier one through the renaming (its
  tables re-indexed), and the classifier reads its rows at the renamed values (``Plan.aliases``).

  A module is merged only where every reader can be re-indexed: an MLP or a head reading it as a query, a
  counting head reading it as a key, a copying head reading it as a key where the earlier variable leaves a
  value free for the keys no renamed value matches, and a head copying it (which then copies the earlier
  variable, its own value renamed alike, its readers re-indexed in turn); not a head summing it. ``mergeable``:
  the modules that may be merged (every one by default)."""
  plan = dataclasses.replace(plan, modules=[dataclasses.replace(m) for m in plan.modules],
                             readout=dict(plan.readout), aliases=dict(plan.aliases))
  earlier = ['tokens', 'positions']
  merged = []
  for b in [m for m in plan.modules]:
    found = None
    for a in earlier if mergeable is None or b.name in mergeable else ():
      rename = _renaming(values[a], values[b.name], plan.card)
      if rename is not None:
        rewritten = _rewrite_readers(plan, b.name, a, rename, np.unique(values[a]))
        if rewritten is not None:
          found = a, rewritten, rename
          break
    if found is None:
      earlier.append(b.name)
      continue
    a, (rewritten, copies), rename = found
    domain = np.unique(values[a])
    plan.modules = [rewritten.get(m.name, m) for m in plan.modules if m.name != b.name]
    # b's rows, and those of each head that copied b (now copying a, its value renamed alike), and of what was
    # merged into those, are read at the renamed values.
    inverse = np.arange(plan.card)
    inverse[rename[domain]] = domain
    for name in [b.name, *copies]:
      for alias in [name, *(k for k, target in plan.aliases.items() if target == name and k != name)]:
        rows = plan.readout[alias].copy()
        rows[domain] = plan.readout[alias][rename[domain]]
        plan.readout[alias] = rows
      if name != b.name:
        values[name] = inverse[values[name]]
    plan.aliases[b.name] = a
    for alias, target in plan.aliases.items():  # an earlier merge into b is a merge into a
      if target == b.name:
        plan.aliases[alias] = a
    values[b.name] = values[a]
    merged.append(f'{b.name} = f({a})')
  notes = ['Equal to an earlier variable up to a renaming of its values, and merged into it: '
           + ', '.join(merged) + '.'] if merged else []
  return plan, notes


RENAMING_FIRST = 4096  # the positions ``_renaming`` reads first


def _renaming(a: np.ndarray, b: np.ndarray, card: int) -> np.ndarray | None:
  """f with b == f[a] everywhere, one-to-one over the values a takes, as a table over [card]; else None."""
  # Which (a, b) pairs occur, as a [card, card] table: one count per position would be millions of rows. Most
  # pairs of variables are no renaming, and most show it early: a value of one met by two of the other within
  # the first positions is so everywhere, so those pairs are turned down before the pass over every position.
  for part in (slice(RENAMING_FIRST), slice(None)):
    seen = np.bincount(a[part].astype(np.int64) * card + b[part], minlength=card * card).reshape(card, card) > 0
    if (seen.sum(1) > 1).any() or (seen.sum(0) > 1).any():
      return None
  f = np.arange(card)
  rows, cols = np.nonzero(seen)
  f[rows] = cols
  return f


def _rewrite_readers(plan: Plan, b: str, a: str, f: np.ndarray, domain: np.ndarray
                     ) -> tuple[dict[str, Module], list[str]] | None:
  """Every module reading ``b`` rewritten to read ``a``, whose value ``v`` stands for ``f[v]``, and the heads
  that copied ``b``: each now copies ``a``, so its own value is renamed by ``f`` too, and what reads it is
  rewritten alike; None where a module cannot be (see ``merge_renamings``)."""
  out: dict[str, Module] = {}
  copies: list[str] = []
  inverse = {int(f[v]): int(v) for v in domain}
  free = [v for v in range(plan.card) if v not in set(domain.tolist())]
  todo = [(b, a)]
  while todo:
    old, new = todo.pop()
    for original in plan.modules:
      m = out.get(original.name, original)
      if old not in m.reads:
        continue
      rewritten = _rewrite_reader(m, old, new, f, domain, inverse, free)
      if rewritten is None:
        return None
      out[m.name] = rewritten
      if len(m.reads) > 2 and m.reads[2] == old:   # a copying head (a sum returned None above)
        copies.append(m.name)
        todo.append((m.name, m.name))
  return out, copies


def _rewrite_reader(m: Module, b: str, a: str, f: np.ndarray, domain: np.ndarray, inverse: dict[int, int],
                    free: list[int]) -> Module | None:
  """``m`` reading ``a`` where it read ``b`` (``_rewrite_readers``), or None where it sums ``b``."""
  table = m.table.copy()
  if m.kind == 'mlp':
    if m.reads[0] == b:
      table[domain] = m.table[f[domain]]
    if m.reads[1] == b:
      table[:, domain] = table[:, f[domain]]
  else:
    if len(m.reads) > 2 and m.reads[2] == b and m.kind != 'categorical':
      return None                           # sums b: its own value would need more than a renaming
    if m.reads[0] == b:
      table[domain] = m.table[f[domain]]
      if m.queried is not None:
        m = dataclasses.replace(m, queried=tuple(int(v) for v in domain if int(f[v]) in m.queried))
    if m.reads[1] == b and m.kind == 'numerical':
      table[:, domain] = table[:, f[domain]]
    elif m.reads[1] == b:                   # a copying head: k == table[q] becomes k == f⁻¹(table[q])
      if not free and not all(int(t) in inverse for t in table):
        return None
      table = np.array([inverse.get(int(t), free[0] if free else 0) for t in table])
  return dataclasses.replace(m, table=table, reads=tuple(a if r == b else r for r in m.reads))


def _signature(m: Module, doms) -> bytes:
  """A module's predicate or table over its inputs' values, as bytes: equal for modules that compute alike."""
  if m.kind == 'mlp':
    table = m.table[np.ix_(np.array(doms[m.reads[0]][0]), np.array(doms[m.reads[1]][0]))]
    return (np.diagonal(table) if m.reads[0] == m.reads[1] else table).tobytes()
  return _truth(m, doms).tobytes()


# ---------------------------------------------------------------------------------------------------------
# Names: each variable named by the kind of value it holds, with a meaning where its predicate shows one.
# ---------------------------------------------------------------------------------------------------------
# Names the program's runtime and ``run`` already use: a variable never takes one.
RESERVED = frozenset({'tokens', 'positions', 'ones', NOTHING, 'np', 'os', 'run', 'Variable', 'select',
                      'select_closest', 'aggregate', 'aggregate_sum', 'apply', 'classify', 'predict',
                      'predict_ids', 'at_first', 'key'})
PREFIXES = ('tok', 'pos', 'count', 'mlp', 'cat')


def names_of(plan: Plan, doms) -> dict[str, str]:
  """The code's name of every module (and merged module) of ``plan``, by the model's name (``attn_<l>_<h>``,
  ``mlp_<l>_<m>``): ``count_`` for a numerical head, ``tok_`` / ``pos_`` for a head copying a token / a
  position (``count_`` / ``cat_`` where it copies a count / an MLP's value), ``mlp_`` for an MLP, followed by
  its layer and index; or what its predicate shows it holds, where that is one of ``meaning``'s forms
  (``prev_token``, ``first_token``, ``length``, ``count_same_token``, ``count_a``)."""
  kind = {'tokens': 'tok', 'positions': 'pos', 'ones': 'count'}
  names = {'tokens': 'tokens', 'positions': 'positions', 'ones': 'ones', NOTHING: NOTHING}
  taken = set(RESERVED)
  for m in plan.modules:
    where = m.name.split('_', 1)[1]
    if m.kind == 'mlp':
      kind[m.name] = 'mlp'
    elif m.kind == 'numerical':
      kind[m.name] = 'count'
    else:
      kind[m.name] = {'tok': 'tok', 'pos': 'pos', 'count': 'count'}.get(kind[m.reads[2]], 'cat')
    name = _meaning(m, doms, plan, names)
    if name is None or name in taken:
      name = f'{name}_{where}' if name else f'{kind[m.name]}_{where}'
    names[m.name] = name
    taken.add(name)
  for alias, earlier in plan.aliases.items():  # a merged head: the kind of the variable it equals
    of = kind.get(earlier, 'cat')
    prefix = 'mlp' if alias.startswith('mlp_') else 'cat' if of == 'mlp' else of
    name = f'{prefix}_{alias.split("_", 1)[1]}'
    while name in taken:  # never an MLP's name: a head's prefix is not mlp_
      name += '_'
    names[alias] = name
    taken.add(name)
  if len(set(names.values())) != len(names):  # two variables under one name would read each other's values
    raise RuntimeError(f'two variables were given one name: {names}')
  return {k: v for k, v in names.items() if k != v}


def _base(var: str, names: dict[str, str]) -> str:
  return {'tokens': 'token', 'positions': 'position'}.get(var, names.get(var, var))


def _meaning(m: Module, doms, plan: Plan, names: dict[str, str]) -> str | None:
  """A name saying what a head holds, where its predicate is one of a few forms read the same in every
  program: the value ``d`` positions back or ahead, position 0's, the length, a count of one token or of the
  keys holding the query's token. None otherwise (an MLP among them)."""
  if m.kind == 'mlp':
    return None
  q, k = m.reads[:2]
  if m.kind == 'categorical':
    base = _base(m.reads[2], names)
    if _never(m, doms):
      return f'first_{base}'
    if _one_sided(m) == 1 and k == 'positions':
      keys = [v for v, hit in zip(doms[k][0], _truth(m, doms)[0]) if hit]
      return f'first_{base}' if keys == [0] else None
    if q == k == 'positions':
      rel = _head_relation(m, doms) or ''
      if rel.startswith('== '):
        shift = int(rel[3:].replace(' ', ''))
        word = 'prev' if shift == -1 else 'next' if shift == 1 else None
        return f'{word}_{base}' if word else f'{base}_{abs(shift)}_{"back" if shift < 0 else "ahead"}'
    return None
  if len(m.reads) > 2 and m.reads[2] != 'ones':  # a sum of another count
    return None
  if _truth(m, doms).all():
    return 'prefix_length' if plan.causal else 'length'
  if _one_sided(m) == 1 and k == 'tokens':
    keys = [v for v, hit in zip(doms[k][0], _truth(m, doms)[0]) if hit]
    word = plan.tokens[keys[0]] if len(keys) == 1 and keys[0] < len(plan.tokens) else ''
    return f'count_{word}' if word.isidentifier() and word.isascii() else None
  if _one_sided(m) is not None:
    return None
  rel = _head_relation(m, doms)
  if rel == '==' and q == k:
    return f'count_same_{_base(q, names)}'
  return None


def renamed(plan: Plan, names: dict[str, str]) -> Plan:
  """``plan`` with its variables called by ``names`` (``names_of``), in the code's order as before."""
  r = lambda v: names.get(v, v)
  return dataclasses.replace(
      plan, modules=[dataclasses.replace(m, name=r(m.name), reads=tuple(r(v) for v in m.reads)) for m in plan.modules],
      readout={r(k): v for k, v in plan.readout.items()}, aliases={r(a): r(b) for a, b in plan.aliases.items()})


# ---------------------------------------------------------------------------------------------------------
# Cells no input reaches: a predicate's (query, key) pairs, an MLP's pairs of inputs.
# ---------------------------------------------------------------------------------------------------------
def reached_cells(m: Module, values: dict, real: np.ndarray, causal: bool, card: int, chunk: int = 8192
                  ) -> np.ndarray:
  """[card, card] bool: the pairs of values a module reads somewhere on the inputs ``values`` were run on
  (``Variable``s, [inputs, positions]; ``real``: which positions are): an MLP's two inputs at one real position;
  a head's query at a real position with its key at a key that position may read (``NOTHING`` reads as 0)."""
  ids = lambda name: (np.zeros(real.shape, np.int64) if name == NOTHING else values[name].ids.astype(np.int64))
  a, b = ids(m.reads[0]), ids(m.reads[1])
  if m.kind == 'mlp':
    return np.bincount((a * card + b)[real], minlength=card * card).reshape(card, card) > 0
  n = real.shape[1]
  order = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
  seen = np.zeros(card * card, bool)
  for start in range(0, len(a), chunk):  # [chunk, query, key] pairs at a time
    r = real[start:start + chunk]
    pairs = r[:, :, None] & r[:, None, :] & order
    codes = a[start:start + chunk, :, None] * card + b[start:start + chunk, None, :]
    seen |= np.bincount(codes[pairs], minlength=card * card) > 0
  return seen.reshape(card, card)


def kept_rows(m: Module, doms, values: dict, real: np.ndarray, causal: bool, card: int, chunk: int = 4096):
  """For a head: a function of other values of the cells its code writes (``_cells``) that says, per value of
  its query's domain, whether that value's row keeps the head's variable at every real position of the inputs
  ``values`` were run on (``Variable``s, [inputs, positions]) whose query holds it. A row is more than its
  reached cells: a key that is never the closest match may match or not, as may one a closer match always
  hides; a counting head's row may change wherever every input counts the same number of keys (as a count
  over positions does below the shortest input's length)."""
  constant = {NOTHING: 0, 'ones': 1}
  ids = lambda name: (np.full(real.shape, constant[name], np.int64) if name in constant
                      else values[name].ids.astype(np.int64))
  (qd, _), kd = _query_domain(m, doms), np.array(doms[m.reads[1]][0])
  index = np.full(card, len(qd), np.int64)
  index[np.array(qd)] = np.arange(len(qd))
  q = np.where(real, index[ids(m.reads[0])], len(qd))        # the row each real query reads; len(qd): none
  k = ids(m.reads[1])
  n = real.shape[1]
  order = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
  if m.kind == 'numerical':
    weight = real * (ids(m.reads[2]) if len(m.reads) > 2 else 1)
    counts = np.einsum('ij,bjc->bic', order.astype(np.int64), (k[:, :, None] == kd) * weight[:, :, None])
    # The distinct rows of keys counted, per query value (one sort of all rows with their query value first).
    flat, query = counts.reshape(-1, len(kd)), q.reshape(-1)
    first = _distinct_rows(np.column_stack([query, flat]))[0]
    rows = [flat[first[query[first] == r]] for r in range(len(qd))]

    now = m.table[_cells(m, doms)]
    counted = [np.minimum(c @ now[r], card - 1) for r, c in enumerate(rows)]
    known: dict[tuple[int, bytes], bool] = {}  # the fillings tried share most rows: each row is counted once

    def row_kept(r: int, row: np.ndarray) -> bool:
      key = (r, row.tobytes())
      if key not in known:
        known[key] = bool((np.minimum(rows[r] @ row, card - 1) == counted[r]).all())
      return known[key]

    return lambda part: np.array([row_kept(r, part[r]) for r in range(len(rows))])
  # A categorical head: the value each query reads if its row named key value c, for every c and none (-1).
  held, out = ids(m.reads[2]), ids(m.name)
  i, j = np.arange(n)[:, None], np.arange(n)[None, :]
  rank = np.where(i == j, 1, n + 1 - np.abs(i - j)) * order
  ok = np.ones((len(qd), len(kd) + 1), bool)
  for start in range(0, len(k), chunk):
    b = slice(start, start + chunk)
    allowed = real[b, None, :] & (rank > 0)
    for c, value in enumerate([*kd, -1]):
      score = np.where(allowed & (k[b, None, :] == value), rank, 0)
      read = np.take_along_axis(held[b], score.argmax(-1), axis=1)       # argmax 0 where none: position 0
      wrong = np.bincount(q[b][read != out[b]], minlength=len(qd) + 1)[:len(qd)]
      ok[:, c] &= wrong == 0
  column = {int(v): c for c, v in enumerate([*kd, -1])}

  def kept(part: np.ndarray) -> np.ndarray:
    return np.array([ok[r, column.get(int(v), -1)] for r, v in enumerate(part)])  # a value no key holds: none
  return kept


# ---------------------------------------------------------------------------------------------------------
# Loosening: a module's table changed wherever no tag changes.
# ---------------------------------------------------------------------------------------------------------
class _Tags:
  """Every variable of a plan on the task's every input, computed from its tables as its code computes them at
  real positions, and whether a change of one module keeps every tag (``keeps``): the modules downstream of it
  are recomputed on the inputs where it changes, and the classifier's scores moved by the rows of the variables
  that changed, a tag kept only with a lead above rounding where something moved."""

  def __init__(self, plan: Plan, inputs: np.ndarray, lengths: np.ndarray):
    self.plan, n = plan, inputs.shape[1]
    self.real = np.arange(n)[None, :] < lengths[:, None]
    self.tagged = tagged_positions(plan, inputs, self.real)
    order = np.tril(np.ones((n, n), bool)) if plan.causal else np.ones((n, n), bool)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    self.rank = np.where(i == j, 1, n + 1 - np.abs(i - j)) * order        # 0 where the mask hides the key
    start = {'tokens': inputs.astype(np.int64), 'positions': np.broadcast_to(np.arange(n), inputs.shape),
             'ones': np.ones(inputs.shape, np.int64), NOTHING: np.zeros(inputs.shape, np.int64)}
    self.values = self._computed(plan.modules, start, slice(None))
    self.logits = plan.readout['bias'] + sum(plan.readout[v][self._of(self.values, v)] for v in _variables(plan))
    self.want = self.logits.argmax(-1)
    self.shuffled = np.random.default_rng(0).permutation(len(inputs))  # each input's place in the order tried

  def _of(self, values: dict, name: str) -> np.ndarray:
    return values[self.plan.aliases.get(name, name)]

  def _computed(self, modules, values: dict, rows) -> dict:
    """The variables ``modules`` write, added to ``values`` (on the inputs ``rows``)."""
    values = dict(values)
    allowed = self.real[rows][:, None, :] & (self.rank > 0)
    for m in modules:
      a, b = (self._of(values, r) for r in m.reads[:2])
      if m.kind == 'mlp':
        values[m.name] = m.table[a, b]
        continue
      match = (m.table[a][:, :, None] == b[:, None, :] if m.kind == 'categorical'
               else m.table[a[:, :, None], b[:, None, :]]) & allowed
      if m.kind == 'categorical':  # the closest match, or position 0
        values[m.name] = np.take_along_axis(self._of(values, m.reads[2]), np.where(match, self.rank, 0).argmax(-1), 1)
      else:
        weight = self._of(values, m.reads[2])[:, None, :] if len(m.reads) > 2 else 1
        values[m.name] = np.minimum((match * weight).sum(-1), self.plan.card - 1)
    return values

  def downstream(self, m: Module) -> list[Module]:
    """``m`` and every module that reads what it writes, directly or not, in the plan's order."""
    changed, out = {m.name}, []
    for other in self.plan.modules:
      if other is m or any(self.plan.aliases.get(r, r) in changed for r in other.reads):
        changed.add(other.name)
        out.append(other)
    return out

  def keeps(self, modules: list[Module], rows: np.ndarray, first: int = 256, chunk: int = 8192) -> bool:
    """Whether the plan, as it now is, changes the changed module's variable (``modules``: ``downstream``, that
    module first) on some of the inputs ``rows`` and tags them as before, recomputed where that variable
    changes; a chunk of inputs at a time, in a fixed shuffled order, stopping at the first tag that changes.
    Most steps tried change a tag on one of the first inputs, so the chunks grow from ``first`` inputs to
    ``chunk``: a step turned down costs a few hundred inputs, not thousands."""
    own, rows = modules[0].name, np.nonzero(rows)[0]
    rows = rows[np.argsort(self.shuffled[rows], kind='stable')]
    names = {m.name for m in modules}
    needed = names | {self.plan.aliases.get(r, r) for m in modules for r in m.reads}
    changed = [v for v in _variables(self.plan) if self.plan.aliases.get(v, v) in names]
    self.pending = []
    start, size = 0, first
    while start < len(rows):
      part = rows[start:start + size]
      start, size = start + size, min(4 * size, chunk)
      part = part[(self._computed(modules[:1], {r: self.values[r][part] for r in modules[0].reads}, part)[own]
                   != self.values[own][part]).any(1)]
      if not len(part):
        continue
      before = {k: self.values[k][part] for k in needed}
      after = self._computed(modules, before, part)
      moved = np.zeros(before[own].shape, bool)
      for v in changed:
        moved |= self._of(after, v) != self._of(before, v)
      b, p = np.nonzero(moved)
      logits = self.logits[part[b], p]
      for v in changed:
        rows_of = self.plan.readout[v]
        logits = logits + rows_of[self._of(after, v)[b, p]] - rows_of[self._of(before, v)[b, p]]
      want, tagged = self.want[part[b], p], self.tagged[part[b], p]
      top = logits[np.arange(len(want)), want]
      rival = np.where(np.arange(logits.shape[-1]) == want[:, None], -np.inf, logits).max(-1)
      if not (top - rival > 1e-4 * (1 + np.abs(top)))[tagged].all():
        return False
      self.pending.append((part, {n: after[n] for n in names}, (part[b], p, logits)))
    # No input whose variable changes: a change of how the code is written, which ``fill_unreached`` weighs.
    return bool(self.pending)

  def accept(self) -> None:
    """Takes the change ``keeps`` just found to keep every tag as the new start."""
    for rows, changed, (b, p, logits) in self.pending:
      for name, value in changed.items():
        self.values[name][rows] = value
      self.logits[b, p] = logits


def _loosened_module(m: Module, doms, tags: _Tags) -> int:
  """Changes ``m``'s table in place, one step at a time, each kept where every tag stays (``_Tags.keeps``): an
  MLP's as ``_loosened_mlp`` says; a head's row for a query value matches no key, else (a counting head) every
  key or another query value's keys. A step is taken only where its code is shorter: fewer lines, or as many
  in fewer characters. The steps kept."""
  modules, values, kept = tags.downstream(m), tags.values, 0
  held = {k: types.SimpleNamespace(ids=tags._of(values, k)) for k in m.reads if k != NOTHING}
  reached = reached_cells(m, held, tags.real, tags.plan.causal, tags.plan.card)

  def write() -> tuple[int, int]:
    """The code's lines, then its characters, with the cells no input reaches written the shortest way."""
    part = m.table[_cells(m, doms)]
    codes = [_written(m, doms, tags.plan.tokens, o) for o in [part, *_fillings(m, doms, reached, tags.plan.tokens)]]
    return min((len(code), sum(len(line.strip()) for line in code)) for code in codes)
  lines = [write()]

  def tried(table: np.ndarray, rows: np.ndarray) -> bool:
    """Takes ``table`` where it keeps every tag and writes shorter code."""
    old, m.table = m.table, table
    written = write()
    if written < lines[0] and tags.keeps(modules, rows):
      tags.accept()
      lines[0] = written
      return True
    m.table = old
    return False

  a, b = (tags._of(values, r) for r in m.reads[:2])
  real = tags.real
  if m.kind == 'mlp':
    return _loosened_mlp(m, doms, tags, tried)
  qd = _query_domain(m, doms)[0]
  for q in qd:
    rows = ((a == q) & real).any(1)
    if m.kind == 'categorical':
      options = [-1]
    else:
      others = np.unique(m.table[[o for o in qd if o != q]], axis=0)
      width = m.table.shape[1]  # 1 where the key was a constant (``NOTHING``)
      options = [np.zeros(width, bool), np.ones(width, bool), *others]
    for option in options:
      if m.kind == 'categorical' and m.table[q] == option or m.kind == 'numerical' and (m.table[q] == option).all():
        break
      table = m.table.copy()
      table[q] = option
      if tried(table, rows):
        kept += 1
        break
  return kept


def _loosened_mlp(m: Module, doms, tags: _Tags, tried) -> int:
  """``_loosened_module`` for an MLP (``tried(table, rows)``: takes a table where it is kept): the cells
  returning one value, then each alone, return the MLP's commonest value; then, row by row and column by
  column, the cells returning another value than their row's (column's) commonest return that one, so that
  the MLP reads as a lookup per row or column. The steps kept."""
  a, b = (tags._of(tags.values, r) for r in m.reads[:2])
  card, kept = tags.plan.card, 0
  where = lambda cells: (np.isin(a * card + b, cells[:, 0] * card + cells[:, 1]) & tags.real).any(1)

  def steps_to(group: np.ndarray, value: int, alone: int) -> int:
    """``group``'s cells return ``value``, all at once, else (up to ``alone`` cells) one at a time."""
    done = 0
    for step in [group] + ([g[None] for g in group] if len(group) <= alone else []):
      table = m.table.copy()
      table[step[:, 0], step[:, 1]] = value
      done += tried(table, where(step))
      if done and step is group:
        break
    return done

  ad, bd = (np.array(doms[r][0]) for r in m.reads[:2])
  kinds, counts = np.unique(m.table[np.ix_(ad, bd)], return_counts=True)
  usual = kinds[np.argmax(counts)]
  for v in kinds[np.argsort(counts)]:
    if v != usual:
      kept += steps_to(np.argwhere(m.table == v), usual, 16)
  for axis, (outer, inner) in enumerate([(ad, bd), (bd, ad)]):
    for x in outer:
      line = m.table[x, inner] if axis == 0 else m.table[inner, x]
      kinds, counts = np.unique(line, return_counts=True)
      common = kinds[np.argmax(counts)]
      for v in kinds[np.argsort(counts)]:
        if v != common:
          others = inner[line == v]
          kept += steps_to(np.stack([np.full(len(others), x), others], -1)[:, ::1 if axis == 0 else -1], common, 4)
  return kept


def loosen(plan: Plan, doms_of, inputs: np.ndarray, lengths: np.ndarray, data_file: str
           ) -> tuple[Plan, list[str]]:
  """The plan with each module's table changed wherever that keeps every tag on ``inputs`` (the task's every
  input; ``_loosened_module``), the last module first, then simplified again (what now matches no key or reads
  a constant folds; what is now equal to an earlier variable, or a renaming of one, merges). A variable may
  then differ from the model's where no tag reads it. Checked as the code tags: where that would change a
  tag, the plan is kept as it was."""
  before = plan
  plan = dataclasses.replace(plan, modules=[dataclasses.replace(m, table=m.table.copy()) for m in plan.modules],
                             aliases=dict(plan.aliases))
  doms, tags = doms_of(plan), _Tags(plan, inputs, lengths)
  changed = [m.name for m in reversed(plan.modules) if _loosened_module(m, doms, tags)]
  if not changed:
    return before, []
  plan, again = simplify(plan, doms_of)
  plan, renamings = merge_renamings_everywhere(plan, doms_of, inputs, lengths, data_file)  # now a renaming
  again += renamings
  try:
    _check_same(before, doms_of(before), plan, doms_of(plan), inputs, lengths, data_file)
  except RuntimeError:
    return before, []
  return plan, ['Modules loosened where no tag changes on any input (a variable may then differ from the model\'s '
                f'where no tag reads it): {", ".join(sorted(changed))}.'] + again


def _rows_filled(table: np.ndarray, reached: np.ndarray, fill_row, wild=None) -> np.ndarray:
  """``table`` [rows, columns] with its unreached cells chosen so that rows fall into few groups of equal rows:
  a row joins the first group that agrees with it on every cell both reach (first fit), each group's unreached
  cells are chosen by ``fill_row(values, defined)``, and rows reaching nothing are ``wild`` where given, else
  join the largest group (or keep their values where there is none)."""
  groups: list[tuple[np.ndarray, np.ndarray, list[int]]] = []
  unreached = []
  for r, (row, mask) in enumerate(zip(table, reached)):
    if not mask.any():
      unreached.append(r)
      continue
    for values, defined, members in groups:
      both = defined & mask
      if (values[both] == row[both]).all():
        values[mask] = row[mask]
        defined |= mask
        members.append(r)
        break
    else:
      groups.append((row.copy(), mask.copy(), [r]))
  out = table.copy()
  for values, defined, members in groups:
    out[members] = fill_row(values, defined)
  if unreached and wild is not None:
    out[unreached] = wild
  elif unreached and groups:
    out[unreached] = out[max(groups, key=lambda g: len(g[2]))[2][0]]
  return out


def _commonest_fill(values: np.ndarray, defined: np.ndarray) -> np.ndarray:
  """An MLP row's unreached cells: the commonest value its reached cells hold."""
  if not defined.any():
    return values
  kinds, counts = np.unique(values[defined], return_counts=True)
  return np.where(defined, values, kinds[np.argmax(counts)])


def _keys_fill(dom, is_token: bool, tokens: list[str]):
  """A predicate row's unreached cells, chosen so that its test of the key is shortest (``_shortest``): none
  matching, all matching, or the widest range its unmatched reached keys allow."""
  def fill(values: np.ndarray, defined: np.ndarray) -> np.ndarray:
    hit, miss = values & defined, ~values & defined
    options = [hit, ~miss]
    if hit.any() and not is_token:
      inside = np.nonzero(hit)[0]
      lo, hi = inside[0], inside[-1]
      if not miss[lo:hi + 1].any():
        while lo > 0 and not miss[lo - 1]:
          lo -= 1
        while hi < len(values) - 1 and not miss[hi + 1]:
          hi += 1
        options.append((np.arange(len(values)) >= lo) & (np.arange(len(values)) <= hi))
    text = lambda row: (_shortest('k', [v for v, h in zip(dom, row) if h], dom, is_token, tokens)
                        or '{' + ', '.join(_value(v, is_token, tokens) for v, h in zip(dom, row) if h) + '}')
    return min(options, key=lambda row: len(text(row)))
  return fill


def _cells(m: Module, doms) -> tuple:
  """The part of a module's table its code writes: the rows of its query's (first input's) domain, and the
  columns of its key's (second input's); a categorical head's table is one key value per query value."""
  if m.kind == 'categorical':
    return np.array(_query_domain(m, doms)[0])
  first = _query_domain(m, doms)[0] if m.kind == 'numerical' else doms[m.reads[0]][0]
  return np.ix_(np.array(first), np.array(doms[m.reads[1]][0]))


def _written(m: Module, doms, tokens: list[str], part: np.ndarray) -> list[str]:
  """The code of ``m`` with ``part`` in place of the cells its code writes (``_cells``)."""
  moved = dataclasses.replace(m, table=_placed(m.table, _cells(m, doms), part))
  return mlp_source(moved, doms, tokens)[0] if m.kind == 'mlp' else predicate_source(moved, doms, tokens)


def _fillings(m: Module, doms, reached: np.ndarray, tokens: list[str], kept=None) -> list[np.ndarray]:
  """Other values of the cells a module's code writes, equal to its own on every reached cell (``reached``
  [card, card]): a comparison of key and query; a numerical head's or an MLP's rows grouped and filled
  (``_rows_filled``), an MLP's by either input; a categorical head naming no key (-1) for a query value whose
  key no input holds where that value does. Given ``kept`` (``kept_rows``), a head's rows may change wherever
  that keeps its variable: each comparison (or key, for a categorical head) is also taken on just the rows it
  keeps, and a counting head's other rows grouped (``_rows_merged``)."""
  table = m.table[_cells(m, doms)]
  if m.kind == 'mlp':
    hit = reached[_cells(m, doms)]
    options = [_rows_filled(table, hit, _commonest_fill), _rows_filled(table.T, hit.T, _commonest_fill).T]
    (ad, a_tok), (bd, b_tok) = doms[m.reads[0]], doms[m.reads[1]]
    compared = None if a_tok or b_tok else _sign_filled(table, hit, _signs(ad, bd))
    return options + ([compared] if compared is not None else [])
  (qd, q_tok), (kd, k_tok) = _query_domain(m, doms), doms[m.reads[1]]
  q, k = np.array(qd)[:, None], np.array(kd)[None, :]
  hit = reached[np.ix_(q[:, 0], k[0])]
  truth = _truth(m, doms)
  numbers = not q_tok and not k_tok
  shifts = ([0] if q_tok == k_tok else []) + ([d for d in range(-len(kd), len(kd) + 1) if d] if numbers else [])
  reflections = range(1, 2 * max(max(kd), max(qd)) + 1) if numbers else ()
  if m.kind == 'categorical':
    options = [np.where((truth & hit).any(1), table, -1)]
    for d in shifts:
      option = np.where(np.isin(q[:, 0] + d, kd), q[:, 0] + d, -1)
      options.append(option)
    if kept is None:
      return [o for o in options if ((o[:, None] == k) == truth)[hit].all()]
    options += [np.where(np.isin(c - q[:, 0], kd), c - q[:, 0], -1) for c in reflections]
    options += [np.full(len(qd), v) for v in [*kd, -1]]
    alone = np.where(kept(np.full(len(qd), -1)), -1, table)  # rows that may name no key, naming none
    for option in options[:]:
      rows = kept(option)
      options += [np.where(rows, option, table), np.where(rows, option, alone)] if rows.sum() >= 2 else []
    return [o for o in options if kept(o).all()]
  options = [op(k, q) for symbol, op in RELATIONS if (symbol in ('==', '!=') and q_tok == k_tok) or numbers]
  options += [k == q + d for d in shifts if d]
  fill = _keys_fill(kd, k_tok, tokens)
  options += [_rows_filled(truth, hit, fill, wild=False), _rows_filled(truth, hit, fill)]
  if kept is None:
    return [o for o in options if (o == truth)[hit].all()]
  options += [k == c - q for c in reflections]
  options.append(_rows_merged(truth, np.ones(len(qd), bool), kept))
  for option in options[:-1]:
    rows = kept(option)
    if rows.sum() >= 2:
      options.append(_rows_merged(np.where(rows[:, None], option, truth), ~rows, kept))
  return [o for o in options if kept(o).all()]


def _sign_filled(table: np.ndarray, reached: np.ndarray, signs: np.ndarray) -> np.ndarray | None:
  """An MLP's table over two numbers filled as a comparison of them (``_signs``) where its reached cells are one:
  each relation's cells take the value its reached cells hold, or where none is reached, the nearest relation's;
  None where two reached cells of one relation differ."""
  held = _by_relation(table, signs, reached)
  if not held:
    return None
  out = table.copy()
  for s in range(3):
    out[signs == s] = held[min(held, key=lambda t: abs(t - s))]
  return out


def _rows_merged(table: np.ndarray, movable: np.ndarray, kept) -> np.ndarray:
  """``table`` [query values, key values] with each ``movable`` row, in order, replaced by the first of the rows
  taken so far (matching every key, matching none, then the rows met) that keeps the head's variable there
  (``kept``, ``kept_rows``): the rows fall into few groups, each a case of the code."""
  out = table.copy()
  taken = [np.ones(table.shape[1], bool), np.zeros(table.shape[1], bool)]
  for r in np.nonzero(movable)[0]:
    for row in taken:
      trial = out.copy()
      trial[r] = row
      if kept(trial)[r]:
        out[r] = row
        break
    else:
      taken.append(out[r].copy())
  return out


def fill_unreached(plan: Plan, doms, live: set[str], values: dict, real: np.ndarray) -> tuple[Plan, list[str]]:
  """The plan with each live head's predicate and each live MLP's table chosen anew on the cells no input
  reaches (``reached_cells`` on ``values``, every variable on the task's every input), and a head's also on the
  cells whose change keeps its variable on every input (``kept_rows``), where another filling (``_fillings``)
  writes fewer lines. Every variable keeps its value at every real position of those inputs."""
  plan = dataclasses.replace(plan, modules=[dataclasses.replace(m) for m in plan.modules])
  tokens, changed = plan.tokens, []
  for m in plan.modules:
    if (m.name not in live or _never(m, doms) or _every(m, doms) or m.reads[0] == m.reads[1] == NOTHING
        or (m.kind == 'mlp' and m.reads[0] == m.reads[1])):
      continue
    table = m.table[_cells(m, doms)]
    lines = len(_written(m, doms, tokens, table))
    if lines <= 2:  # a definition and one return: nothing shorter to find
      continue
    best = table
    kept = None if m.kind == 'mlp' else kept_rows(m, doms, values, real, plan.causal, plan.card)
    for option in _fillings(m, doms, reached_cells(m, values, real, plan.causal, plan.card), tokens, kept):
      written = len(_written(m, doms, tokens, option))
      if written < lines:
        best, lines = option, written
    if best is not table:
      m.table = _placed(m.table, _cells(m, doms), best)
      changed.append(m.name)
  notes = (['Modules written anew, in fewer lines, where no input reaches or no variable changes: '
            f'{", ".join(changed)}.'] if changed else [])
  return plan, notes


def _placed(table: np.ndarray, cells, part: np.ndarray) -> np.ndarray:
  out = table.copy()
  out[cells] = part
  return out


# ---------------------------------------------------------------------------------------------------------
# Writing the code.
# ---------------------------------------------------------------------------------------------------------
def _value(v: int, is_token: bool, tokens: list[str]) -> str:
  return repr(tokens[v]) if is_token else str(v)


def _wrapped_set(prefix: str, items: list[str], suffix: str, indent: str) -> list[str]:
  """``prefix{items}suffix`` (``_filled``)."""
  return _filled(f'{indent}{prefix}{{', items, f'}}{suffix}')


def _filled(opening: str, items: list[str], closing: str) -> list[str]:
  """``opening``, the items, then ``closing``: on one line when that fits, else filled into lines, each
  continuation aligned with the first item (one item a line would make a long set, or the variables ``run``
  returns, the bulk of a program)."""
  one = f'{opening}{", ".join(items)}{closing}'
  if len(one) <= WIDTH:
    return [one]
  text = ', '.join(it.replace(' ', '\0') for it in items) + closing.replace(' ', '\0')
  lines = textwrap.wrap(text, WIDTH, initial_indent=opening.replace(' ', '\0'), subsequent_indent=' ' * len(opening),
                        break_long_words=False, break_on_hyphens=False)
  return [line.replace('\0', ' ') for line in lines]


def _arg(var: str, role: str, same: bool) -> str:
  base = {'tokens': 'token', 'positions': 'position'}.get(var, var)
  return f'{role}_{base}' if same else base


RELATIONS = (('==', np.equal), ('!=', np.not_equal), ('<', np.less), ('<=', np.less_equal),
             ('>', np.greater), ('>=', np.greater_equal))


def _relation(truth: np.ndarray, qd, kd, both_numbers: bool, same_kind: bool, free: np.ndarray | None = None
              ) -> str | None:
  """A comparison of k with q equal to the predicate ``truth`` [len(qd), len(kd)] over the domains; on the
  query values ``free`` marks (``_free_rows``) it may instead match nothing."""
  q, k = np.array(qd)[:, None], np.array(kd)[None, :]
  free = np.zeros(len(qd), bool) if free is None else free

  def agrees(candidate: np.ndarray) -> bool:
    return bool(((candidate == truth).all(1) | (free & ~candidate.any(1))).all())

  if agrees(np.zeros_like(truth)):
    return 'False'
  if truth.all():
    return 'True'
  for symbol, op in RELATIONS:
    if (symbol in ('==', '!=') and same_kind) or both_numbers:
      if agrees(op(k, q)):
        return symbol
  if both_numbers:
    for shift in range(-len(kd), len(kd) + 1):
      if shift and agrees(k == q + shift):
        return f'== {"+" if shift > 0 else "-"} {abs(shift)}'
    for total in range(1, 2 * max(max(kd), max(qd)) + 1):  # a reflection: position c - q, as reverse reads
      if agrees(k == total - q):
        return f'{total} -'
  return None


def _free_rows(m: Module, doms) -> np.ndarray:
  """The query values for which a categorical head's predicate names position 0 alone. A query that matches no
  key reads position 0, which every query may read (inputs start there), so naming nothing for these values
  reads the same key: the code may write them either way."""
  truth = _truth(m, doms)
  if m.kind != 'categorical' or m.reads[1] != 'positions':
    return np.zeros(len(truth), bool)
  return truth[:, 0] & (truth.sum(1) == 1)


def _query_domain(m: Module, doms) -> tuple[tuple[int, ...], bool]:
  """A head's query values its code must keep exact, and whether they are tokens: its query's domain, or the
  part of it ``Module.queried`` names."""
  values, is_token = doms[m.reads[0]]
  if m.queried is not None and m.reads[0] != NOTHING:
    kept = tuple(v for v in values if v in m.queried)
    values = kept or values[:1]
  return values, is_token


def _truth(m: Module, doms) -> np.ndarray:
  """A head's predicate over its query's and key's domains, [query values, key values] bool."""
  qd, kd = np.array(_query_domain(m, doms)[0]), np.array(doms[m.reads[1]][0])
  if m.kind == 'categorical':
    return m.table[qd][:, None] == kd[None, :]
  return m.table[np.ix_(qd, kd)]


@dataclasses.dataclass
class Rule:
  """A predicate as a comparison of k with q, or'ed with a few fixed key values, that holds for every query
  value but a few (``exceptions``, written as cases before it)."""

  relation: str              # as ``_relation`` returns it: '==', '<', '== - 1', ...
  extra: list[int]           # key values matched whatever the query
  exceptions: list[int]      # query values (indices into the query's domain) the rule does not hold for


def _rule(m: Module, doms, most_extra: int = 2) -> Rule | None:
  """The rule (``Rule``) with the fewest exceptions, then extra keys, that the head's predicate follows for
  all but at most a quarter of its query values (one at least), or None."""
  (qd, q_tok), (kd, k_tok) = _query_domain(m, doms), doms[m.reads[1]]
  truth = _truth(m, doms)
  if len(qd) < 3:
    return None
  q, k = np.array(qd)[:, None], np.array(kd)[None, :]
  both_numbers = not q_tok and not k_tok
  candidates = [(symbol, op(k, q)) for symbol, op in RELATIONS
                if (symbol in ('==', '!=') and q_tok == k_tok) or both_numbers]
  if both_numbers:
    candidates += [(f'== {"+" if d > 0 else "-"} {abs(d)}', k == q + d) for d in range(-len(kd), len(kd) + 1) if d]
    candidates += [(f'{c} -', k == c - q) for c in range(1, 2 * max(max(kd), max(qd)) + 1)]
  best, allowed = None, max(1, len(qd) // 4)
  for symbol, base in candidates:
    whole = ~(base & ~truth).any(1)                    # rows where every key the comparison names matches
    extra = truth & ~base
    if not whole.any():
      continue
    pattern = _commonest_row(extra[whole])
    fits = whole & (extra == pattern).all(1)
    exceptions = np.nonzero(~fits)[0]
    if pattern.sum() > most_extra or len(exceptions) > allowed or fits.sum() < 2:
      continue
    rule = Rule(symbol, [kd[j] for j in np.nonzero(pattern)[0]], [int(i) for i in exceptions])
    if best is None or (len(rule.exceptions), len(rule.extra)) < (len(best.exceptions), len(best.extra)):
      best = rule
  return best


def _commonest_row(rows: np.ndarray) -> np.ndarray:
  """The row of ``rows`` [n, c] (bool) most often there, the first in order of the rows where several are (as
  ``np.unique(axis=0)`` orders them, which ``_rule`` would otherwise call dozens of times per head)."""
  first, group = _distinct_rows(rows)
  return rows[first[np.argmax(np.bincount(group))]]


def _rule_text(rule: Rule, ka: str, qa: str, k_tok: bool, tokens: list[str]) -> str:
  text = _comparison(ka, rule.relation, qa)
  if len(rule.extra) == 1:
    return f'{text} or {ka} == {_value(rule.extra[0], k_tok, tokens)}'
  if rule.extra:
    return f'{text} or {ka} in {{{", ".join(_value(v, k_tok, tokens) for v in rule.extra)}}}'
  return text


def _head_relation(m: Module, doms) -> str | None:
  (qd, q_tok), (kd, k_tok) = _query_domain(m, doms), doms[m.reads[1]]
  return _relation(_truth(m, doms), qd, kd, not q_tok and not k_tok, q_tok == k_tok, _free_rows(m, doms))


def _comparison(ka: str, rel: str, qa: str) -> str:
  """The code of a relation ``_relation`` found: ``k == q - 1`` for a shift, ``k == 7 - q`` for a reflection,
  ``k < q`` otherwise."""
  if rel.startswith('== '):
    return f'{ka} == {qa} {rel[3:]}'
  return f'{ka} == {rel} {qa}' if rel.endswith(' -') else f'{ka} {rel} {qa}'


def _groups(m: Module, doms) -> list[tuple[tuple[int, ...], list[int]]]:
  """The query values grouped by the key values they match, in the order of their first query value; those that
  name position 0 alone (``_free_rows``) are left to match nothing, which reads the same key."""
  qd, kd = _query_domain(m, doms)[0], doms[m.reads[1]][0]
  groups: dict[tuple[int, ...], list[int]] = {}
  for i, (q, free) in enumerate(zip(_truth(m, doms), _free_rows(m, doms))):
    keys = tuple(kd[j] for j in np.nonzero(q)[0])
    if keys and not free:
      groups.setdefault(keys, []).append(qd[i])
  return sorted(groups.items(), key=lambda g: g[1][0])


def _one_sided(m: Module) -> int | None:
  """Which of a head's query (0) and key (1) its predicate reads alone, the other being ``NOTHING``."""
  return 1 if m.reads[0] == NOTHING else 0 if m.reads[1] == NOTHING else None


def _shortest(name: str, values, dom, is_token: bool, tokens: list[str]) -> str | None:
  """``name`` takes one of ``values`` (of its domain ``dom``), written without a set where that is exact on the
  domain: ``True``, ``False``, ``== v``, ``!= v`` (all values but one, of three or more), a range of numbers
  (``k <= 5``, ``k >= 3``, ``2 <= k <= 5``: two values or more up to an end of the domain, three inside it);
  else None, for ``in {…}``."""
  values, dom = sorted(values), sorted(dom)
  if not values or len(values) == len(dom):
    return 'True' if values else 'False'
  if len(values) == 1:
    return f'{name} == {_value(values[0], is_token, tokens)}'
  if len(dom) >= 3 and len(values) == len(dom) - 1:
    return f'{name} != {_value(next(v for v in dom if v not in values), is_token, tokens)}'
  if is_token or sum(values[0] <= v <= values[-1] for v in dom) != len(values):
    return None
  if values[0] == dom[0]:
    return f'{name} <= {values[-1]}'
  if values[-1] == dom[-1]:
    return f'{name} >= {values[0]}'
  return f'{values[0]} <= {name} <= {values[-1]}' if len(values) >= 3 else None


def _member_lines(prefix: str, name: str, values, dom, is_token: bool, tokens: list[str], suffix: str,
                  indent: str) -> list[str]:
  """``prefix`` then the test that ``name`` takes one of ``values`` (``_shortest``, else a set), then
  ``suffix``."""
  short = _shortest(name, values, dom, is_token, tokens)
  if short is not None:
    return [f'{indent}{prefix}{short}{suffix}']
  return _wrapped_set(f'{prefix}{name} in ', [_value(v, is_token, tokens) for v in sorted(values)], suffix, indent)


def _condition(m: Module, doms, tokens, ka: str) -> str:
  """A one-sided predicate (``_one_sided``) in its shortest form (``_shortest``), else ``k in {…}``."""
  side = _one_sided(m)
  kd, k_tok = _query_domain(m, doms) if side == 0 else doms[m.reads[1]]
  truth = _truth(m, doms)
  row = truth[0] if side == 1 else truth[:, 0]
  keys = [v for v, hit in zip(kd, row) if hit]
  return (_shortest(ka, keys, kd, k_tok, tokens)
          or f'{ka} in {{{", ".join(_value(v, k_tok, tokens) for v in keys)}}}')


def predicate_source(m: Module, doms, tokens) -> list[str]:
  """The predicate of a head as a Python function of the query's and the key's value (of one of them alone where
  the other was a constant, ``NOTHING``)."""
  side = _one_sided(m)
  if side is not None:
    ka = _arg(m.reads[side], 'qk'[side], True)
    return [f'    def predicate_{m.name}({ka}):',
            f'        return {_condition(m, doms, tokens, ka)}']
  q_tok, k_tok = _query_domain(m, doms)[1], doms[m.reads[1]][1]
  same = m.reads[0] == m.reads[1]
  qa, ka = _arg(m.reads[0], 'q', same), _arg(m.reads[1], 'k', same)
  head = f'    def predicate_{m.name}({qa}, {ka}):'
  rel = _head_relation(m, doms)
  if rel in ('True', 'False'):
    return [head, f'        return {rel}']
  if rel is not None:
    return [head, f'        return {_comparison(ka, rel, qa)}']
  rule = _rule(m, doms)
  if rule is not None:  # its exceptions as cases, then the rule
    qd, kd, truth = _query_domain(m, doms)[0], doms[m.reads[1]][0], _truth(m, doms)
    lines = [head]
    for n, i in enumerate(rule.exceptions):
      keys = [kd[j] for j in np.nonzero(truth[i])[0]]
      lines.append(f'        {"if" if n == 0 else "elif"} {qa} == {_value(qd[i], q_tok, tokens)}:')
      lines += _member_lines('return ', ka, keys, kd, k_tok, tokens, '', '            ')
    return lines + [f'        return {_rule_text(rule, ka, qa, k_tok, tokens)}']
  lines = [head]
  (qd, _), kd = _query_domain(m, doms), doms[m.reads[1]][0]
  groups = _groups(m, doms)
  covered = sum(len(qs) for _, qs in groups) == len(qd)
  if len(groups) >= 3 and all(len(keys) == 1 for keys, _ in groups):  # one key a query: a lookup
    pairs = sorted((q, keys[0]) for keys, qs in groups for q in qs)
    # .get: the predicate is also evaluated at ids outside the query's domain, which match nothing.
    lookup = _filled(f'        return {ka} == {{', [f'{_value(q, q_tok, tokens)}: {_value(k, k_tok, tokens)}'
                                                     for q, k in pairs], f'}}.get({qa})')
    if len(lookup) <= 3:
      return [head, *lookup]
  if len(groups) == 1 and not covered:  # one case: its two tests on one line, where that fits
    (keys, qs), = groups
    tests = [_shortest(qa, qs, qd, q_tok, tokens), _shortest(ka, keys, kd, k_tok, tokens)]
    line = f'        return {tests[0]}' + ('' if tests[1] == 'True' else f' and {tests[1]}')
    if None not in tests and len(line) <= WIDTH:
      return [head, line]
  # Where every query value matches some key, the last case needs no test: the query values left reach it.
  for n, (keys, qs) in enumerate(groups[:-1] if covered else groups):
    lines += _member_lines(f'{"if" if n == 0 else "elif"} ', qa, qs, qd, q_tok, tokens, ':', '        ')
    lines += _member_lines('return ', ka, keys, kd, k_tok, tokens, '', '            ')
  if covered:
    return lines + _member_lines('return ', ka, groups[-1][0], kd, k_tok, tokens, '', '        ')
  return lines + ['        return False']


def _returns(name: str, dom, is_token: bool, outs: np.ndarray, tokens: list[str], indent: str) -> list[str]:
  """The code that returns ``outs[i]`` where ``name`` is ``dom[i]``: the value, where it is one; else tests of
  ``name`` for each other value (``_member_lines``), the commonest value last, and ``v if test else d`` where
  there are two values and that fits on a line."""
  values, counts = np.unique(outs, return_counts=True)
  default = int(values[np.argmax(counts)])
  others = sorted((int(v) for v in values if v != default), key=lambda v: (-int((outs == v).sum()), v))
  hits = {v: [dom[i] for i in np.nonzero(outs == v)[0]] for v in others}
  if len(others) == 1:
    hit = hits[others[0]]
    test = (_shortest(name, hit, dom, is_token, tokens)
            or f'{name} in {{{", ".join(_value(v, is_token, tokens) for v in hit)}}}')
    line = f'{indent}return {others[0]} if {test} else {default}'
    if len(line) <= WIDTH:
      return [line]
  lines = []
  for n, v in enumerate(others):
    lines += _member_lines(f'{"if" if n == 0 else "elif"} ', name, hits[v], dom, is_token, tokens, ':', indent)
    lines.append(f'{indent}    return {v}')
  return lines + [f'{indent}return {default}']


def _by_rows(outer: str, od, o_tok: bool, inner: str, idom, i_tok: bool, table: np.ndarray, tokens: list[str]
             ) -> list[str]:
  """A table [outer values, inner values] as cases of ``outer`` (values with equal rows tested together), each
  returning by ``inner`` (``_returns``); the case of most outer values last, untested."""
  groups: dict[bytes, list[int]] = {}
  for i, row in enumerate(table):
    groups.setdefault(row.tobytes(), []).append(i)
  rows = list(groups.values())
  last = max(rows, key=len)
  lines = []
  for n, rows_of in enumerate(r for r in rows if r is not last):
    values = [od[i] for i in rows_of]
    lines += _member_lines(f'{"if" if n == 0 else "elif"} ', outer, values, od, o_tok, tokens, ':', '        ')
    lines += _returns(inner, idom, i_tok, table[rows_of[0]], tokens, '            ')
  # Every case above returns: the rest falls through to the last case's returns, with no else.
  return lines + _returns(inner, idom, i_tok, table[last[0]], tokens, '        ')


def mlp_source(m: Module, doms, tokens) -> tuple[list[str], int | None]:
  """An MLP as a function of its inputs' values (``_returns``; with two inputs, by cases of one of them,
  ``_by_rows``, or by the pairs returning each value, ``_by_pairs``: whichever takes fewest lines); and which
  input alone it reads (None: both)."""
  (ad, a_tok), (bd, b_tok) = doms[m.reads[0]], doms[m.reads[1]]
  table = m.table[np.ix_(np.array(ad), np.array(bd))]
  if m.reads[0] == m.reads[1]:                   # one variable read twice: the diagonal
    one_input, outs = 0, np.diagonal(table)
  elif (table == table[:, :1]).all():
    one_input, outs = 0, table[:, 0]
  elif (table == table[:1, :]).all():
    one_input, outs = 1, table[0, :]
  else:
    one_input = None
  if one_input is not None:
    dom, tok = (ad, a_tok) if one_input == 0 else (bd, b_tok)
    arg = _arg(m.reads[one_input], '', False)
    return [f'    def {m.name}({arg}):', *_returns(arg, dom, tok, outs, tokens, '        ')], one_input
  a, b = (_arg(r, '', False) for r in m.reads)
  bodies = [_by_pairs(a, ad, a_tok, b, bd, b_tok, table, tokens),
            _by_rows(a, ad, a_tok, b, bd, b_tok, table, tokens),
            _by_rows(b, bd, b_tok, a, ad, a_tok, table.T, tokens)]
  by_sign = None if a_tok or b_tok else _sign_values(table, ad, bd)
  if by_sign is not None:
    bodies.insert(0, _by_sign(a, b, by_sign))
  return [f'    def {m.name}({a}, {b}):', *min(bodies, key=len)], None


def _signs(ad, bd) -> np.ndarray:
  """[a values, b values]: 0 where a < b, 1 where a == b, 2 where a > b."""
  return np.sign(np.array(ad)[:, None] - np.array(bd)[None, :]) + 1


def _sign_values(table: np.ndarray, ad, bd) -> dict[int, int] | None:
  """What a table over two numbers returns where the first is below, equal to and above the second (``_signs``;
  only the relations its domains hold), where that alone decides it; else None."""
  out = _by_relation(table, _signs(ad, bd), np.ones(table.shape, bool))
  return out if out and len(set(out.values())) > 1 else None


def _by_relation(table: np.ndarray, signs: np.ndarray, cells: np.ndarray) -> dict[int, int] | None:
  """The one value each relation (``_signs``) holds on ``cells``, for the relations those reach; None where two
  cells of one relation differ."""
  out = {}
  for s in range(3):
    values = np.unique(table[(signs == s) & cells])
    if len(values) > 1:
      return None
    if len(values):
      out[s] = int(values[0])
  return out


def _by_sign(a: str, b: str, values: dict[int, int]) -> list[str]:
  """A table that compares its two inputs (``_sign_values``), as that comparison: one conditional return where
  two relations share a value, else a test of ``<`` and one of ``==``. Two relations at least hold values, and
  two of those differ (``_sign_values``), so every branch names values that exist."""
  below, equal, above = (values.get(s) for s in range(3))
  if equal is None or equal == above:
    return [f'        return {above} if {a} >= {b} else {below}']
  if below is None or equal == below:
    return [f'        return {above} if {a} > {b} else {equal}']
  if above is None or below == above:
    return [f'        return {equal} if {a} == {b} else {below}']
  return [f'        if {a} < {b}:', f'            return {below}', f'        return {equal} if {a} == {b} else {above}']


def _by_pairs(a: str, ad, a_tok: bool, b: str, bd, b_tok: bool, table: np.ndarray, tokens: list[str]) -> list[str]:
  """A table [a values, b values] as the pairs returning each value other than the commonest, one set of pairs a
  value (shorter than cases of either input where each value's pairs fit on a line, as in a small table)."""
  values, counts = np.unique(table, return_counts=True)
  default = int(values[np.argmax(counts)])
  others = sorted((int(v) for v in values if v != default), key=lambda v: (-int((table == v).sum()), v))
  lines = [f'        key = ({a}, {b})']
  for n, v in enumerate(others):
    pairs = [f'({_value(ad[i], a_tok, tokens)}, {_value(bd[j], b_tok, tokens)})'
             for i, j in zip(*np.nonzero(table == v))]
    if len(pairs) == 1:
      lines.append(f'        {"if" if n == 0 else "elif"} key == {pairs[0]}:')
    else:
      lines += _wrapped_set(f'{"if" if n == 0 else "elif"} key in ', pairs, ':', '        ')
    lines.append(f'            return {v}')
  return lines + [f'        return {default}']


def describe(m: Module, doms, tokens: list[str], most: int = 6, brief: int = 0) -> str:
  """One sentence saying what a head or MLP does, for the docs beside its code (a predicate's cases spelled
  out when there are at most ``most``); ``brief`` (1) without what the code's runtime says of every head (a
  head matching no key reads position 0), a predicate's cases only counted, an MLP's table only named; (2)
  and a rule with exceptions counted as cases too (one without stays: it is the predicate)."""
  if m.kind == 'mlp':
    return _mlp_sentence(m, doms, tokens, brief=brief)
  if brief:
    most = 0
  q, k = m.reads[:2]
  if m.kind == 'categorical' and not _truth(m, doms).any():
    return f'`{m.name}` matches no key, so every position holds the `{m.reads[2]}` of position 0.'
  side = _one_sided(m)
  if side is not None and _truth(m, doms).all():
    side = None  # every key matches: written as a head that compares nothing, below
  if side is not None:
    condition = _condition(m, doms, tokens, _arg(m.reads[side], 'qk'[side], True))
    if side == 0:
      return (f'`{m.name}`: where `{condition}`, every key matches ' + ('and it counts them (up to the position, '
              'causal).' if m.kind == 'numerical' else f'and it copies the `{m.reads[2]}` of the closest other '
              'position, the earlier of two; elsewhere position 0\'s.'))
    if m.kind == 'numerical':
      return f'`{m.name}` counts the keys where `{condition}`.'
    return f'`{m.name}` copies the `{m.reads[2]}` of the closest key where `{condition}`' + _at_first(brief)
  rel = 'True' if _truth(m, doms).all() else _head_relation(m, doms)
  same = q == k
  qa, ka = _arg(q, 'q', same), _arg(k, 'k', same)
  sums = m.kind == 'numerical' and len(m.reads) > 2 and m.reads[2] != 'ones'
  if rel == 'False':
    return (f'`{m.name}` selects no key: it is 0 everywhere.' if m.kind == 'numerical' else
            f'`{m.name}`: no key matches, so every position copies the `{m.reads[2]}` of position 0.')
  if rel == 'True' and sums:
    return f'`{m.name}` sums the `{m.reads[2]}` of every key (up to the position, causal).'
  if rel == 'True':
    return (f'`{m.name}` counts every key: the length (up to the position, causal).' if m.kind == 'numerical' else
            f'`{m.name}`: every key matches, so every position copies the `{m.reads[2]}` of its closest other '
            f'position, the earlier of two.')
  rule = _rule(m, doms) if rel is None else None
  if rule is not None and rule.exceptions and brief >= 2:
    rule = None  # its exceptions are the code's cases, counted below
  if rel is not None:
    where = f'where `{_comparison(ka, rel, qa)}`'
  elif rule is not None:
    q_tok, k_tok = doms[q][1], doms[k][1]
    but = ', '.join(_value(_query_domain(m, doms)[0][i], q_tok, tokens) for i in rule.exceptions)
    where = (f'where `{_rule_text(rule, ka, qa, k_tok, tokens)}`' +
             (f' (other keys for `{qa}` {but})' if rule.exceptions else ''))
  else:
    groups, (q_tok, k_tok) = _groups(m, doms), (doms[q][1], doms[k][1])
    text = lambda values, tok: ', '.join(_value(v, tok, tokens) for v in values)
    if brief:
      where = f'by `{q}` of query and key' if q == k else f'by `{q}` and `{k}`'
      where += f' ({len(groups)} case{"s" if len(groups) > 1 else ""})'
    elif len(groups) > most:
      where = f'whose `{k}` its predicate lists for the query\'s `{q}` ({len(groups)} cases)'
    else:
      key_text = lambda keys: text(keys, k_tok) if len(keys) == 1 else '{' + text(keys, k_tok) + '}'
      where = f'whose `{k}` is, by the query\'s `{q}`: ' + '; '.join(
          f'{key_text(keys)} for {text(qs, q_tok)}' for keys, qs in groups)
  if m.kind == 'numerical':
    if sums:
      return f'`{m.name}` sums the `{m.reads[2]}` of the keys {where}.'
    return f'`{m.name}` counts the keys {where}.'
  if brief:
    return f'`{m.name}` copies `{m.reads[2]}` {where}.'
  return f'`{m.name}` copies the `{m.reads[2]}` of the closest key {where}' + _at_first(brief)


def _at_first(brief: int) -> str:
  return '.' if brief else ' (position 0 where there is none).'


def _values_text(values: list[int], is_token: bool, tokens: list[str]) -> str:
  """Values in their shortest form: one value, a range of numbers (``2–5``), else a set."""
  if len(values) == 1:
    return _value(values[0], is_token, tokens)
  if not is_token and values == list(range(values[0], values[-1] + 1)):
    return f'{values[0]}–{values[-1]}'
  return '{' + ', '.join(_value(v, is_token, tokens) for v in values) + '}'


def _mlp_sentence(m: Module, doms, tokens: list[str], most: int = 3, brief: int = 0) -> str:
  """What an MLP returns, by the values of the input it reads where it reads one and returns at most ``most``
  values; else how many cases of its table return something other than its commonest value (``brief``: which
  that is)."""
  (ad, a_tok), (bd, b_tok) = doms[m.reads[0]], doms[m.reads[1]]
  table = m.table[np.ix_(np.array(ad), np.array(bd))]
  one = (0 if m.reads[0] == m.reads[1] or (table == table[:, :1]).all() else
         1 if (table == table[:1, :]).all() else None)
  by_sign = None if one is not None or a_tok or b_tok else _sign_values(table, ad, bd)
  if by_sign is not None:
    said = {0: 'less', 1: 'equal', 2: 'greater'}
    return (f'`{m.name}` compares `{m.reads[0]}` with `{m.reads[1]}`: ' +
            ', '.join(f'{v} where {said[s]}' for s, v in sorted(by_sign.items())) + '.')
  if one is None:
    values, counts = np.unique(table, return_counts=True)
    common = int(values[np.argmax(counts)])
    if brief:
      return f'`{m.name}` is a table over `{m.reads[0]}` and `{m.reads[1]}`, mostly {common}.'
    return (f'`{m.name}` is a table over `{m.reads[0]}` and `{m.reads[1]}`: {int(table.size - counts.max())} of '
            f'its {table.size} cases return a value other than {common}, which the rest return.')
  dom, tok = (ad, a_tok) if one == 0 else (bd, b_tok)
  outs = np.diagonal(table) if m.reads[0] == m.reads[1] else table[:, 0] if one == 0 else table[0, :]
  values, counts = np.unique(outs, return_counts=True)
  if len(values) == 1:
    return f'`{m.name}` is {int(values[0])} everywhere.'
  if len(values) > most:
    return f'`{m.name}` maps the {len(dom)} values of `{m.reads[one]}` to {len(values)} values.'
  common = int(values[np.argmax(counts)])
  cases = [f'{int(v)} where `{m.reads[one]}` is {_values_text([d for d, o in zip(dom, outs) if o == v], tok, tokens)}'
           for v in values if v != common]
  return f'`{m.name}` is ' + '; '.join(cases) + f'; else {common}.'


# The runtime a program carries, by function in the order written; a program carries only those its modules
# call (``_runtime``).
RUNTIME = {
    'Variable': '''
class Variable:
    """A categorical variable at every position: ids [batch, n]; a token-valued one reads as TOKENS[id]."""

    def __init__(self, ids, is_token):
        self.ids, self.is_token = ids, is_token

    def value(self, i):  # an id no token has is never an input: None
        return (TOKENS[i] if i < len(TOKENS) else None) if self.is_token else i''',
    '_table': '''
def _table(function, *variables):
    """function over every tuple of values of the variables, as an array indexed by their ids."""
    grids = np.meshgrid(*[np.arange(CARDINALITY)] * len(variables), indexing="ij")
    values = [function(*(v.value(int(i)) for v, i in zip(variables, ids)))
              for ids in zip(*(g.ravel() for g in grids))]
    return np.array(values).reshape(grids[0].shape)''',
    'select': '''
def select(keys, queries, predicate):
    """The predicate at every (query, key) pair the mask allows, [batch, query, key]."""{one_sided}
    pair = queries.ids[:, :, None] * CARDINALITY + keys.ids[:, None, :]
    return _table(predicate, queries, keys).ravel()[pair] & ALLOWED''',
    'select_closest': '''
def select_closest(keys, queries, predicate):
    """The key each query reads: the closest one the predicate matches (itself last, the earlier one of two
    at the same distance), or position 0 where none matches."""
    n = (queries if keys is None else keys).ids.shape[1]
    matches = select(keys, queries, predicate)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    rank = np.where(i == j, 1, MAX_LEN + 1 - np.abs(i - j))
    return np.where(matches, rank, 0).argmax(-1)''',
    'aggregate': '''
def aggregate(pattern, values):
    """The value at the key each query reads."""
    return Variable(np.take_along_axis(values.ids, pattern, axis=1), values.is_token)''',
    'aggregate_sum': '''
def aggregate_sum(pattern, values=None):
    """How many keys each query selects, or the sum of a numerical variable there; CARDINALITY - 1 at most."""
    total = pattern.sum(-1) if values is None else (pattern * values.ids[:, None, :]).sum(-1)
    return Variable(np.minimum(total, CARDINALITY - 1), False)''',
    'apply': '''
def apply(function, *variables):
    """An MLP at every position."""
    table = _table(function, *variables)
    return Variable(table[tuple(v.ids for v in variables)], False)''',
}

# The classifier, as a table read from the data file or, where the task's inputs reach few enough
# combinations of its variables' values, as those decisions written in the code.
CLASSIFY_TABLE = '''

def classify(variables):
    """The classifier: a row per variable's value (READOUT[name + ".values"] lists them), summed."""
    row = lambda name, ids: np.searchsorted(READOUT[name + ".values"][:-1], ids)  # [:-1]: padding's too
    logits = READOUT["bias"] + sum(READOUT[n][row(n, v.ids)] for n, v in variables.items() if n in READOUT)
    return READOUT["tags"][logits.argmax(-1)]
'''
CLASSIFY_DECISIONS = '''

def classify(variables):
    """Each position's tag: decide(its values of DECIDES) once per combination held; 0 where it names no token."""
    combination = np.zeros(variables["tokens"].ids.shape, np.int64)
    for name in DECIDES:
        combination = combination * CARDINALITY + variables[name].ids
    _, first, where = np.unique(combination, return_index=True, return_inverse=True)
    tags = [decide(*[variables[name].value(int(variables[name].ids.flat[i])) for name in DECIDES]) for i in first]
    return np.array([TOKENS.index(t) if t in TOKENS else 0 for t in tags])[where.reshape(-1)].reshape(combination.shape)
'''

ENTRY = '''

def predict_ids(ids, lengths=None):
    """Tag ids for token ids [n], or [b, n] whose row r is lengths[r] tokens (all by default), then padding;
    padding and the tokens of UNTAGGED (the task tags none of them) are tagged 0."""
    global ALLOWED
    tok = np.asarray(ids, np.int64)
    if tok.ndim not in (1, 2) or tok.shape[-1] > MAX_LEN:
        raise ValueError(f"ids must be one sequence [n] or a batch [b, n] of n <= {MAX_LEN}, got shape {tok.shape}")
    if not tok.size:
        return tok
    batch = tok.reshape(-1, tok.shape[-1])
    n = batch.shape[1]
    lengths = np.full(len(batch), n) if lengths is None else np.asarray(lengths, np.int64).reshape(-1)
    if lengths.shape != (len(batch),) or (lengths < 0).any() or (lengths > n).any():
        raise ValueError(f"lengths must be one count in 0..{n} per sequence ({len(batch)}), got {lengths}")
    real = np.arange(n)[None, :] < lengths[:, None]
    ALLOWED = real[:, None, :] & (np.tril(np.ones((n, n), bool)) if CAUSAL else True)
    positions = Variable(np.broadcast_to(np.arange(n, dtype=np.int32), batch.shape), False)
    tags = classify(run(Variable(batch.astype(np.int32), True), positions))
    tagged = real & ~np.isin(batch, [TOKENS.index(t) for t in UNTAGGED])
    return np.where(tagged, tags, 0).reshape(tok.shape)


def predict(tokens):
    """The tags of one sequence of tokens (strings)."""
    return [TOKENS[t] for t in predict_ids([TOKENS.index(t) for t in tokens])]
'''


# Written into a program only where a head's predicate reads its key or its query alone (or neither: a counting
# head whose query and key were both constants), or matches nothing.
ONE_SIDED = '''
    if queries is None and keys is None:  # both were constants: it holds for every pair or for none
        n = ALLOWED.shape[-1]  # ALLOWED is [batch, 1, key] where no key is hidden from a query
        return np.broadcast_to(ALLOWED & bool(predicate(0)), (len(ALLOWED), n, n))
    if queries is None or keys is None:  # a predicate of the key (or the query) alone
        one = keys if queries is None else queries
        n = one.ids.shape[1]
        held = _table(predicate, one)[one.ids]
        held = held[:, None, :] if queries is None else held[:, :, None]
        return np.broadcast_to(held, (len(one.ids), n, n)) & ALLOWED'''
AT_FIRST = '''

def at_first(values):
    """Position 0's value at every position: what a head whose predicate matches no key reads."""
    return Variable(np.repeat(values.ids[:, :1], values.ids.shape[1], axis=1), values.is_token)'''


CLOSEST_OTHER = '''

def closest_other(values):
    """The value at each position's closest other position (the earlier of two; itself where it is alone): what
    a head whose predicate matches every key reads."""
    return aggregate(select_closest(values, values, lambda query, key: True), values)'''


def _every(m: Module, doms) -> bool:
  """A categorical head whose predicate matches every key: each position reads its closest other position."""
  return m.kind == 'categorical' and bool(_truth(m, doms).all())


def _never(m: Module, doms) -> bool:
  """A categorical head whose predicate matches no key: every position reads position 0."""
  return m.kind == 'categorical' and not _truth(m, doms).any()


def _runtime(plan: Plan, live: set[str], doms) -> str:
  """The runtime functions the ``live`` modules call, and what those call."""
  heads = [m for m in plan.modules if m.name in live and m.kind != 'mlp']
  one_sided = any(_one_sided(m) is not None and not _never(m, doms) and not _every(m, doms) for m in heads)
  used = {'Variable'}
  for m in heads:
    if m.kind == 'numerical':
      used |= {'select', 'aggregate_sum'}
    elif not _never(m, doms):   # a head matching every key reads through select_closest too (closest_other)
      used |= {'select_closest', 'aggregate'}
  if any(m.kind == 'mlp' for m in plan.modules if m.name in live):
    used.add('apply')
  if 'select_closest' in used:
    used.add('select')
  if used & {'select', 'apply'}:
    used.add('_table')
  text = '\n\n\n'.join(RUNTIME[name].strip('\n') for name in RUNTIME if name in used)
  return ('\n\n' + text.replace('{one_sided}', ONE_SIDED if one_sided else '') + '\n'
          + (AT_FIRST if any(_never(m, doms) for m in heads) else '')
          + (CLOSEST_OTHER if any(_every(m, doms) for m in heads) else ''))


def source(plan: Plan, live: set[str], doms, header: str, data_file: str, decisions: Decisions | None = None,
           comments: dict[str, str] | None = None) -> str:
  """The program's text over the ``live`` variables; its classifier the table in ``data_file``, or the
  ``decisions`` written in the code; above each module its line of ``comments`` (its name by default)."""
  tokens = plan.tokens
  lines = [f'"""{header}"""', '']
  lines += (['import numpy as np', ''] if decisions else ['import os', '', 'import numpy as np', ''])
  lines += [f'TOKENS = {tokens!r}', f'UNTAGGED = {[tokens[t] for t in plan.untagged]!r}',
            f'MAX_LEN = {plan.max_len}', f'CAUSAL = {plan.causal}', f'CARDINALITY = {plan.card}']
  if decisions:
    lines.append(f'DECIDES = {tuple(decisions.reads)!r}')
  else:
    lines += [f'DATA_FILE = {data_file!r}',
              'READOUT = dict(np.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), DATA_FILE)))']
  lines += ['ALLOWED = None  # [batch, query, key]: a real key, and (causal) no later one; set by predict_ids',
            _runtime(plan, live, doms) + (CLASSIFY_DECISIONS if decisions else CLASSIFY_TABLE), '',
            'def run(tokens, positions):', '    """Every variable of the program."""']
  for m in plan.modules:
    if m.name not in live:
      continue
    lines += _comment((comments or {}).get(m.name, m.name))
    if m.kind == 'mlp':
      body, one = mlp_source(m, doms, tokens)
      lines += body
      reads = [m.reads[one]] if one is not None else list(m.reads)
      lines.append(f'    {m.name} = apply({m.name}, {", ".join(reads)})')
    elif _every(m, doms):
      lines.append(f'    {m.name} = closest_other({m.reads[2]})  # its predicate matches every key')
    elif _never(m, doms):
      lines.append(f'    {m.name} = at_first({m.reads[2]})  # its predicate matches no key')
    else:
      lines += predicate_source(m, doms, tokens) + _head_lines(m)
    lines.append('')
  kept = [n for n in _variables(plan) if n in live]
  lines += _filled('    return dict(', [f'{n}={plan.aliases.get(n, n)}' for n in kept], ')')
  if decisions:
    lines += ['', '', *_decisions_source(decisions, doms, tokens), '']
  return '\n'.join(lines) + ENTRY


def _head_lines(m: Module) -> list[str]:
  """A head as RASP writes it, ``aggregate(select(keys, queries, predicate), values)`` on one line where that
  fits, else its pattern first."""
  select = 'select_closest' if m.kind == 'categorical' else 'select'
  query, key = ('None' if r == NOTHING else r for r in m.reads[:2])
  pattern = f'{select}({key}, {query}, predicate_{m.name})'
  if m.kind == 'categorical':
    aggregate = 'aggregate({}, ' + f'{m.reads[2]})'
  elif len(m.reads) > 2 and m.reads[2] != 'ones':
    aggregate = 'aggregate_sum({}, ' + f'{m.reads[2]})'
  else:
    aggregate = 'aggregate_sum({})'
  line = f'    {m.name} = ' + aggregate.format(pattern)
  if len(line) <= WIDTH:
    return [line]
  return [f'    {m.name}_pattern = {pattern}', f'    {m.name} = ' + aggregate.format(f'{m.name}_pattern')]


def _one_line(texts: list[str]) -> str:
  """The first of ``texts`` that fits on one comment line in ``run``, else the last (the briefest)."""
  return next((t for t in texts if len(_comment(t)) == 1), texts[-1])


def _comment(text: str) -> list[str]:
  """``text`` as comment lines in ``run``, wrapped at WIDTH between the spans in backticks, not inside one."""
  spans = text.split('`')
  kept = '`'.join(span.replace(' ', '\0') if i % 2 else span for i, span in enumerate(spans))
  return [line.replace('\0', ' ') for line in textwrap.wrap(kept, WIDTH, initial_indent='    # ',
                                                               subsequent_indent='    # ', break_on_hyphens=False)]


# The most values and tags a program's decisions write in its code; a larger classifier stays a data file.
DECISION_LIMIT = 64


@dataclasses.dataclass(frozen=True)
class Leaf:
  """A decision: the tag id ``tag``, or (``copy``) the value of the variable read in that column, a token."""

  tag: int | None = None
  copy: int | None = None


@dataclasses.dataclass(frozen=True)
class Split:
  """Tests of the variable read in ``column``: each branch the values it takes there, in order, and what
  decides among them; ``default`` decides for every other value (the branch of most values, so unwritten)."""

  column: int
  branches: tuple[tuple[tuple[int, ...], Leaf | Split], ...]
  default: Leaf | Split


@dataclasses.dataclass(frozen=True)
class Scores:
  """The tag of highest score, each tag's score a whole multiple of each number read plus a score per value of
  each other variable read, and a bias (``classifier_fit.affine``): ``weights`` (column, per tag) of the numbers,
  ``by_value`` (column, ((value, per tag), ...)) of the others' values reached; ``tags`` the tag ids scored."""

  tags: tuple[int, ...]
  bias: tuple[int, ...]
  weights: tuple[tuple[int, tuple[int, ...]], ...]
  by_value: tuple[tuple[int, tuple[tuple[int, tuple[int, ...]], ...]], ...]


def entries_of(node: Leaf | Split | Scores) -> int:
  """The values and tags a tree writes: one per leaf, one per value a branch tests; the numbers scores write."""
  if isinstance(node, Scores):
    return len(node.tags) * (1 + len(node.weights) + sum(len(values) for _, values in node.by_value))
  if isinstance(node, Leaf):
    return 1
  return sum(len(values) + entries_of(child) for values, child in node.branches) + entries_of(node.default)


@dataclasses.dataclass
class Decisions:
  """The classifier as decisions: the variables it reads, in the classifier's order, and a tree of tests on
  their values that gives the tag of every combination the task's inputs reach. A leaf that copies a number
  returns the tag its value names: ``numbered[name] = (text, shift)`` writes ``f'{text}{name + shift}'``."""

  reads: list[str]
  tree: Leaf | Split
  numbered: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)


# The most subproblems ``decision_tree`` solves (each a set of columns left and the combinations agreeing on the
# others): their number grows with 2^columns × combinations, and a classifier that large would not fit in
# DECISION_LIMIT entries anyway.
SEARCH_LIMIT = 20_000


def decision_tree(keys: np.ndarray, tags: np.ndarray, copyable: list[bool | np.ndarray],
                  tested: list[bool] | None = None) -> Leaf | Split | None:
  """The tree of fewest entries (``entries_of``) that tags each row of ``keys`` ``[combinations, columns]`` (the
  distinct combinations reached) with ``tags``: a leaf where one tag, or one copyable column's value, is the
  tag of every row (``copyable[c]``: True for a token-valued column, whose value is a tag; an array for a number,
  the tag each value names, −1 for none); else a test of the column whose branches write least, values whose
  subtrees are equal sharing a branch. Only the columns ``tested`` marks (all by default) are tested. Every
  order of the columns is searched, each subproblem once; None past ``SEARCH_LIMIT`` subproblems, or where no
  tree over the tested columns tags every row."""
  memo: dict[tuple[tuple[int, ...], bytes], tuple[float, Leaf | Split | None]] = {}
  tested = [True] * keys.shape[1] if tested is None else tested

  class TooLarge(Exception):
    pass

  def best(rows: np.ndarray, columns: tuple[int, ...]) -> tuple[float, Leaf | Split | None]:
    key = (columns, rows.tobytes())
    if key in memo:
      return memo[key]
    if len(memo) >= SEARCH_LIMIT:
      raise TooLarge
    t = tags[rows]
    copies = [c for c in columns if _copies(copyable[c], keys[rows, c], t)]
    if (t == t[0]).all():
      found = (1, Leaf(tag=int(t[0])))
    elif copies:
      found = (1, Leaf(copy=copies[0]))
    else:
      found = (np.inf, None)   # where no test of the columns left decides the rows
      for c in columns:
        values = keys[rows, c]
        distinct = np.unique(values)
        if not tested[c] or len(distinct) < 2:
          continue
        rest = tuple(x for x in columns if x != c)
        children = [(at, *best(at, rest)) for at in (rows[values == v] for v in distinct)]
        if any(child is None for _, _, child in children):
          continue
        # One tag that a copy gives too is that copy, so that the values share one branch: a copy of the column
        # tested (``return f'#{count}'`` for each count naming its tag), or one a sibling returns.
        copied = sorted({child.copy for _, _, child in children if isinstance(child, Leaf) and child.copy is not None}
                        | ({c} if isinstance(copyable[c], np.ndarray) or copyable[c] else set()))
        shared: dict[Leaf | Split, list[int]] = {}
        cost = 0
        for v, (at, size, child) in zip(distinct, children):
          if isinstance(child, Leaf) and child.copy is None:
            child = next((Leaf(copy=x) for x in copied if _copies(copyable[x], keys[at, x], tags[at])), child)
          if child not in shared:
            cost += size
          shared.setdefault(child, []).append(int(v))
        default = max(reversed(list(shared)), key=lambda child: len(shared[child]))  # ties: the last values
        cost += len(distinct) - len(shared[default])
        if cost < found[0]:
          branches = tuple(sorted((tuple(vs), child) for child, vs in shared.items() if child != default))
          found = (cost, Split(c, branches, default))
    memo[key] = found
    return found

  try:
    return best(np.arange(len(keys)), tuple(range(keys.shape[1])))[1]
  except TooLarge:
    return None


def _named(copyable: bool | np.ndarray, values: np.ndarray) -> np.ndarray | None:
  """The tags a leaf returning a column gives at its ``values``: the values themselves (a token column), the
  tags they name (a number's array of ``copyable``), or None where the column is not returned."""
  if isinstance(copyable, np.ndarray):
    return copyable[values]
  return values if copyable else None


def _copies(copyable: bool | np.ndarray, values: np.ndarray, tags: np.ndarray) -> bool:
  """Whether a leaf returning a column gives ``tags`` at its ``values``."""
  named = _named(copyable, values)
  return named is not None and bool((named == tags).all())


# A numbered tag: a text, then a number (``'#3'``, ``'3'``).
NUMBERED = re.compile(r'(.*?)(0|[1-9][0-9]*)')


def _number_text(name: str, text: str, shift: int) -> str:
  """The f-string of ``text`` then ``name``'s value plus ``shift``: ``f'#{count - 1}'``."""
  offset = f' + {shift}' if shift > 0 else f' - {-shift}' if shift < 0 else ''
  return 'f' + repr(f"{text.replace('{', '{{').replace('}', '}}')}{{{name}{offset}}}")


def numbered_tags(values: np.ndarray, tags: np.ndarray, tokens: list[str]) -> tuple[np.ndarray, str, int] | None:
  """The tags a number's ``values`` name where the tags are numbered (``'#3'``): the text and the shift most of
  its rows agree on (``f'#{count + 1}'``), and the tag id each value names (−1 for no tag); None where no row's
  tag is its value give or take that shift."""
  split = [NUMBERED.fullmatch(token) for token in tokens] + [None]   # the last: a tag id past the tokens
  texts = sorted({m.group(1) for m in split if m})
  text_of = np.array([texts.index(m.group(1)) if m else -1 for m in split])[np.minimum(tags, len(tokens))]
  number_of = np.array([int(m.group(2)) if m else 0 for m in split])[np.minimum(tags, len(tokens))]
  numbered = text_of >= 0
  if not numbered.any():
    return None
  pairs, counts = np.unique(np.stack([text_of[numbered], number_of[numbered] - values[numbered]]), axis=1,
                            return_counts=True)
  text, shift = texts[pairs[0, counts.argmax()]], int(pairs[1, counts.argmax()])
  index = {m.group(0): t for t, m in enumerate(split) if m}
  names = np.array([index.get(f'{text}{v + shift}', -1) for v in range(int(values.max()) + 1)])
  return (names, text, shift) if (names[values] == tags).any() else None


def _columns_of(node: Leaf | Split | Scores) -> set[int]:
  if isinstance(node, Scores):
    return {c for c, _ in node.weights} | {c for c, _ in node.by_value}
  if isinstance(node, Leaf):
    return set() if node.copy is None else {node.copy}
  return {node.column}.union(*(_columns_of(child) for _, child in node.branches), _columns_of(node.default))


def _renumbered(node: Leaf | Split | Scores, new: dict[int, int]) -> Leaf | Split | Scores:
  if isinstance(node, Scores):
    return dataclasses.replace(node, weights=tuple((new[c], w) for c, w in node.weights),
                               by_value=tuple((new[c], v) for c, v in node.by_value))
  if isinstance(node, Leaf):
    return node if node.copy is None else Leaf(copy=new[node.copy])
  return Split(new[node.column], tuple((values, _renumbered(child, new)) for values, child in node.branches),
               _renumbered(node.default, new))


# What ``_tagged_combinations`` gives: the classifier's variables and tag at each tagged position, every live
# variable, the tagged positions' mask, and the first position of each distinct row of those variables.
Combinations = tuple[np.ndarray, np.ndarray, dict, np.ndarray, np.ndarray]


def decisions_of(plan: Plan, doms, kept: set[str], bias: np.ndarray,
                 combinations: Combinations | None) -> Decisions | None:
  """The pruned classifier as a tree of decisions (``decision_tree``) over the combinations of its variables'
  values that the tagged positions of the task's inputs reach (``_tagged_combinations``: each tagged by the
  same float32 sums as the table), reading the fewest of those variables that still decide it (dropped
  greedily), or None above ``DECISION_LIMIT`` entries. ``combinations`` is not read where nothing is kept."""
  reads = [n for n in _variables(plan) if n in kept]
  if not reads:
    return Decisions([], Leaf(tag=int(np.argmax(bias))))
  held, tags, _, _, first = combinations
  return _decisions_over(plan, reads, held[first], tags[first], doms)


def _tagged_combinations(plan: Plan, doms, live: set[str], kept: set[str], bias: np.ndarray, inputs: np.ndarray,
                         lengths: np.ndarray, data_file: str) -> Combinations:
  """At every tagged position of ``inputs``: the values of the classifier's kept variables (``[positions,
  variables]``, in ``_variables``' order) and the tag the classifier gives them; and every live variable
  (``Variable``s at every position), the tagged positions' mask, and the first of each distinct row."""
  reads = [n for n in _variables(plan) if n in kept]
  values, real = _run(plan, doms, live, _readout(plan, kept, bias), inputs, lengths, data_file)
  tagged = tagged_positions(plan, inputs, real)
  held = np.stack([values[name].ids[tagged] for name in reads], -1).astype(np.int64)
  first, group = _distinct_rows(held)
  tags = _logits(plan, {name: held[first, i] for i, name in enumerate(reads)}, reads, bias).argmax(-1)[group]
  return held, tags, values, tagged, first


def _copyable(plan: Plan, names: list[str], held: np.ndarray, tags: np.ndarray, doms
              ) -> tuple[list[bool | np.ndarray], dict[str, tuple[str, int]]]:
  """What a leaf of the decisions may return of each of ``names`` (``decision_tree``'s ``copyable``): a token
  variable's value; the tag a count or a position names, where the tags are numbered (``numbered_tags``); and
  the text and shift of each such number."""
  counts = _numbers(plan)
  copyable, numbered = [], {}
  for c, name in enumerate(names):
    found = None if doms[name][1] or name not in counts else numbered_tags(held[:, c], tags, plan.tokens)
    copyable.append(found[0] if found else bool(doms[name][1]))
    if found:
      numbered[name] = found[1:]
  return copyable, numbered


def _numbers(plan: Plan) -> set[str]:
  """The variables that hold numbers: the counts (and sums) of numerical heads, and the positions."""
  counts = {m.name for m in plan.modules if m.kind == 'numerical'} | {'positions'}
  return counts | {alias for alias, name in plan.aliases.items() if name in counts}


def _decisions_over(plan: Plan, reads: list[str], held: np.ndarray, tags: np.ndarray, doms, scored: bool = False
                    ) -> Decisions | None:
  """The decisions that give ``tags`` from ``held`` (the values of ``reads`` at each position; one row of each
  (values, tag) pair is enough): None where the values do not decide the tags, or above ``DECISION_LIMIT``
  entries. With ``scored``, scores (``scored_decisions``) where no tree is within the limit."""
  if not _decides(held, tags):
    return None
  first = _distinct_rows(held)[0]
  reached, tags = held[first], tags[first]
  tree = _tree_over(plan, reads, reached, tags, doms)
  return tree if tree or not scored else scored_decisions(plan, reads, reached, tags, doms)


def _tree_over(plan: Plan, reads: list[str], reached: np.ndarray, tags: np.ndarray, doms) -> Decisions | None:
  """``_decisions_over``'s tree, over the distinct rows ``reached``."""
  # The tag may be a function of fewer of the variables over the combinations reached: drop each one (the
  # last written first) whose values the others' already decide, so the decisions read only what decides.
  columns = list(range(len(reads)))
  for i in reversed(range(len(reads))):
    rest = [c for c in columns if c != i]
    if _decides(reached[:, rest], tags):
      columns = rest
  keys = reached[:, columns]
  first = _distinct_rows(keys)[0] if columns else np.arange(1)
  copyable, numbered = _copyable(plan, [reads[c] for c in columns], keys[first], tags[first], doms)
  tree = decision_tree(keys[first], tags[first], copyable)
  if tree is None or entries_of(tree) > DECISION_LIMIT:
    return None
  return _decisions_of_tree([reads[c] for c in columns], tree, numbered)


def scored_decisions(plan: Plan, reads: list[str], held: np.ndarray, tags: np.ndarray, doms, bounded: bool = True
                     ) -> Decisions | None:
  """The tags as the highest of a score per tag (``Scores``, ``classifier_fit.affine``): a whole multiple of each
  number's value and a score per value of each other variable, over the fewest of ``reads`` (dropped greedily,
  the last written first, where the scores left write no more entries). None where no such scores give every
  row of ``held`` its tag, or (``bounded``) above ``DECISION_LIMIT`` entries.

  A tree tests values one at a time: where the tag compares a position with a sum of counts (sort's), it tests
  nearly every combination. Scores that grow with the counts state the comparison once."""
  numbers = _numbers(plan)

  def fit(columns: list[int]) -> Scores | None:
    found = classifier_fit.affine(held[:, columns], tags, [reads[c] in numbers for c in columns])
    if found is None:
      return None
    per_tag = lambda row: tuple(int(x) for x in row)
    return Scores(per_tag(found.tags), per_tag(found.bias),
                  tuple((columns[c], per_tag(w)) for c, w in found.weights.items() if w.any()),
                  # A value scoring 0 for every tag is left to the lookup's default.
                  tuple((columns[c], tuple((int(v), per_tag(row)) for v, row in zip(found.values[c], found.rows[c])
                                           if row.any())) for c in found.rows if found.rows[c].any()))

  columns = list(range(len(reads)))
  best = fit(columns)
  if best is None:
    return None
  for c in reversed(range(len(reads))):
    trial = fit([x for x in columns if x != c]) if len(columns) > 1 else None
    if trial is not None and entries_of(trial) <= entries_of(best):
      columns, best = [x for x in columns if x != c], trial
  if bounded and entries_of(best) > DECISION_LIMIT:
    return None
  return _decisions_of_tree(reads, best, {})


def _decisions_of_tree(names: list[str], tree: Leaf | Split | Scores, numbered: dict[str, tuple[str, int]]
                       ) -> Decisions:
  """The decisions of a tree over the columns ``names``, reading only those it tests or copies, in their order."""
  used = sorted(_columns_of(tree))
  reads = [names[c] for c in used]
  return Decisions(reads, _renumbered(tree, {c: i for i, c in enumerate(used)}),
                   {n: numbered[n] for n in reads if n in numbered and _copied(tree, reads.index(n))})


def _copied(node: Leaf | Split | Scores, column: int) -> bool:
  if isinstance(node, Scores):
    return False
  if isinstance(node, Leaf):
    return node.copy == column
  return any(_copied(child, column) for _, child in node.branches) or _copied(node.default, column)


# The most variables ``copied_decisions`` tests: their every pair is searched, each a tree of its own; each
# search first over COPY_SAMPLE of the combinations.
COPY_TESTS = 2
COPY_SAMPLE = 20_000


def copied_decisions(plan: Plan, names: list[str], held: np.ndarray, tags: np.ndarray, doms) -> Decisions | None:
  """The tags as decisions that test at most ``COPY_TESTS`` of the variables ``names`` and return a token
  variable's value (``return tok_1_0``), the tag a count names (``return f'#{count_0_1}'``) or a tag: the tree
  of fewest entries over every such choice of tested variables, any of ``names`` copied (``held``: their values
  at each tagged position). None where none tags every row, or above ``DECISION_LIMIT`` entries.

  The classifier's own variables may not decide in few entries where the tag is what one head copies at some
  positions and another head at others: the decision is then which variable to return, by a position or a
  count, and the variables it returns need not be among the classifier's."""
  rows = _distinct_rows(np.column_stack([held, tags]))[0]
  held, tags = held[rows], tags[rows]
  copyable, numbered = _copyable(plan, names, held, tags, doms)
  # The variables a leaf may return: those whose value is, or names, the tag somewhere.
  copies = [c for c in range(len(names)) if (named := _named(copyable[c], held[:, c])) is not None
            and (named == tags).any()]

  def tree_over(rows: np.ndarray, columns: list[int], k: int) -> Leaf | Split | None:
    keys = held[rows][:, columns]
    first, group = _distinct_rows(keys)
    if not (tags[rows][first][group] == tags[rows]).all():   # the columns do not decide the tags
      return None
    tree = decision_tree(keys[first], tags[rows][first], [copyable[c] for c in columns],
                         [i < k for i in range(len(columns))])
    return None if tree is None or entries_of(tree) > DECISION_LIMIT else tree

  # A tree that tags every row tags each of a sample of them, in as many entries or fewer: a search over a
  # sample rules most choices of tested variables out at a fraction of the cost (most_freq reaches 2 million).
  every = np.arange(len(held))
  sample = np.sort(np.random.default_rng(0).choice(every, COPY_SAMPLE, replace=False)) if (
      len(held) > COPY_SAMPLE) else None
  found = None
  for k in range(COPY_TESTS + 1):
    for tested in itertools.combinations(range(len(names)), k):
      columns = list(tested) + [c for c in copies if c not in tested]
      if not columns or (sample is not None and tree_over(sample, columns, k) is None):
        continue
      tree = tree_over(every, columns, k)
      if tree is not None and (found is None or entries_of(tree) < entries_of(found[1])):   # ties: fewer tests
        found = (columns, tree)
  if found is None:
    return None
  columns, tree = found
  order = sorted(range(len(columns)), key=lambda i: columns[i])   # the variables in the program's order
  tree = _renumbered(tree, {i: order.index(i) for i in range(len(columns))})
  return _decisions_of_tree([names[columns[i]] for i in order], tree, numbered)


def uncount_first(plan: Plan, doms, kept: set[str], decisions: Decisions, combinations: Combinations,
                  inputs: np.ndarray, lengths: np.ndarray, data_file: str) -> tuple[Plan, Decisions, list[str]]:
  """The plan with each counting head that the decisions alone read leaving out the keys of a token every input
  holds once (``_held_once``: ``<s>`` at position 0; ``</s>`` too where no query is causal), and the decisions
  found again over the counts it then gives: where its predicate held at that key, the count is one less
  (``count_same_token`` instead of ``k_token == q_token or k_token == '<s>'``). Kept only where the decisions
  still give every tagged position's tag and write fewer entries, or as many with a shorter predicate; the
  program is then checked on every input."""
  once = _held_once(plan, inputs, lengths)
  needed = _needs(plan, set(decisions.reads), doms)
  read_by_modules = {r for m in plan.modules if m.name in needed for r in m.reads}
  candidates = [m for m in plan.modules if m.kind == 'numerical' and len(m.reads) == 2 and m.reads[1] == 'tokens'
                and m.name in decisions.reads and m.name not in read_by_modules
                and not any(plan.aliases.get(r) == m.name for r in decisions.reads) and m.table[:, once].any()]
  if not candidates:
    return plan, decisions, []
  held, tags_at, values, tagged, _ = combinations
  queries = {m.name: values[m.reads[0]].ids[tagged] if m.reads[0] in values else np.zeros(len(held), np.int64)
             for m in candidates}
  # Those whose predicate selects such a key for a query that a tagged position holds.
  chosen = [(m, t) for t in once for m in candidates if m.table[np.unique(queries[m.name]), t].any()]
  if not chosen:
    return plan, decisions, []
  reads = list(decisions.reads)
  held = held[:, [[n for n in _variables(plan) if n in kept].index(n) for n in reads]]
  # One row per distinct (values read, tag, queries of those chosen): all the trials below need.
  first = _distinct_rows(np.column_stack([held, tags_at, *(queries[m.name] for m, _ in chosen)]))[0]
  held, tags = held[first], tags_at[first]
  modules, left_out = {m.name: m for m in plan.modules}, {}

  def size(d: Decisions, changed: list[Module]) -> tuple[int, int, int]:
    code = [line for module in changed for line in predicate_source(module, doms, plan.tokens)]
    return entries_of(d.tree), len(code), sum(map(len, code))

  def attempt(pairs: list[tuple[Module, int]]) -> None:
    """Each count of ``pairs`` without its key: kept where the decisions found again write less."""
    nonlocal held, decisions
    trial, after = held.copy(), {}
    for m, t in pairs:
      m, query = after.get(m.name, modules[m.name]), queries[m.name][first]
      table = m.table.copy()
      table[:, t] = False
      trial[:, reads.index(m.name)] -= m.table[query, t]
      # Only the decisions read it, at tagged positions: its predicate needs to hold only for the queries there.
      after[m.name] = dataclasses.replace(m, table=table, queried=(
          None if m.reads[0] == NOTHING else tuple(int(v) for v in np.unique(query))))
    found = _decisions_over(plan, reads, trial, tags, doms, scored=isinstance(decisions.tree, Scores))
    if isinstance(decisions.tree, Scores) and len(pairs) == 1:  # or the scores moved by the count's weight
      (m, t), = pairs
      moved = _shifted(decisions, m.name, m.reads[0], np.unique(queries[m.name][first]), m.table[:, t])
      if moved is not None and (found is None or size(moved, [*after.values()]) < size(found, [*after.values()])):
        found = moved
    if found is None or size(found, [*after.values()]) >= size(decisions, [modules[n] for n in after]):
      return
    modules.update(after)
    held, decisions = trial, found
    for m, t in pairs:
      left_out.setdefault(t, []).append(m.name)

  # Scores over counts of token sets alone may be shorter than over any of them with its key: all at once first.
  if isinstance(decisions.tree, Scores) and len(chosen) > 1:
    attempt(chosen)
  if not left_out:
    for pair in chosen:
      attempt([pair])
  if not left_out:
    return plan, decisions, []
  notes = [f"{_listed([f'`{n}`' for n in names])} {'leaves' if len(names) == 1 else 'leave'} out the key "
           f'{plan.tokens[t]!r} holds, once in every input: where a predicate held there it counts one less, and '
           'the decisions read it so.' for t, names in left_out.items()]
  after = dataclasses.replace(plan, modules=[modules[m.name] for m in plan.modules])
  program = _load(source(after, _needs(after, set(decisions.reads), doms), doms, 'checked', data_file, decisions),
                  {}, data_file)
  if not (program.predict_ids(inputs, lengths)[tagged] == tags_at).all():
    raise RuntimeError('leaving out a key of a count changed a prediction on the input space')
  return after, decisions, notes


def _shifted(decisions: Decisions, count: str, query: str, values: np.ndarray, shift: np.ndarray
             ) -> Decisions | None:
  """The scores that give every combination its tag once ``count`` is one less wherever ``shift[v]`` holds for the
  value v of its query variable ``query`` (``values``: those reached): the count's weight added to the bias where
  it shifts for every value, else to the scores of those values where the scores read ``query`` by value. None
  where the scores read the count by value, or shift by a query they do not read by value.

  A score whole multiple w of the count gives w·(c − 1) + w at the count one less: the tags stay. A linear
  program solved anew may well find as short scores, but it need not, and these are never longer where the
  shift is the same for every query."""
  scores, reads = decisions.tree, decisions.reads
  weights = {reads[c]: np.array(w) for c, w in scores.weights}
  if count not in weights:
    return None
  w, held = weights[count], shift[values].astype(bool)
  if held.all():
    return dataclasses.replace(decisions, tree=dataclasses.replace(
        scores, bias=tuple(int(x) for x in np.array(scores.bias) + w)))
  column = reads.index(query) if query in reads else None
  by_value = dict(scores.by_value)
  if column not in by_value:
    return None
  rows = {v: np.array(row) for v, row in by_value[column]}
  for v in values[held]:
    rows[int(v)] = rows.get(int(v), np.zeros_like(w)) + w
  written = tuple((v, tuple(int(x) for x in row)) for v, row in sorted(rows.items()) if row.any())
  return dataclasses.replace(decisions, tree=dataclasses.replace(
      scores, by_value=tuple((c, written if c == column else r) for c, r in scores.by_value)))


def _listed(items: list[str]) -> str:
  """``a``, ``a and b``, ``a, b and c``."""
  return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _held_once(plan: Plan, inputs: np.ndarray, lengths: np.ndarray) -> list[int]:
  """The tokens every input holds exactly once: at position 0 (``<s>``), or anywhere where the program reads
  every key (no causal mask), so that a count of keys holding it is one at every query."""
  real = np.arange(inputs.shape[1])[None, :] < lengths[:, None]
  some = lengths > 0
  once = []
  for t in np.unique(inputs[real]):
    held = (inputs == t) & real
    if (held[some].sum(1) == 1).all() and (not plan.causal or held[some, 0].all()):
      once.append(int(t))
  return once


def _scores_source(decisions: Decisions, doms, tokens: list[str]) -> list[str]:
  """``decide`` as the program writes scores: each variable read by value a lookup of its scores per tag, then
  each tag's score as a sum, and the highest-scoring tag returned."""
  reads, scores = decisions.reads, decisions.tree
  zero = '(' + ', '.join(['0'] * len(scores.tags)) + ')'
  others = '; the other variables add a score per value' if scores.by_value else ''
  lines = [f'def decide({", ".join(reads)}):',
           *textwrap.wrap('"""A position\'s tag: the one of highest score, exact where the task\'s inputs reach. A '
                          f'score grows by a whole multiple of each number{others}."""', WIDTH,
                          initial_indent='    ', subsequent_indent='    ')]
  for c, by_value in scores.by_value:
    name, is_token = reads[c], doms[reads[c]][1]
    items = [f'{_value(v, is_token, tokens)}: ({", ".join(map(str, row))})' for v, row in by_value]
    lines += _wrapped_set(f'{name}_score = ', items, f'.get({name}, {zero})', '    ')
  lines.append('    scores = {')
  for i, tag in enumerate(scores.tags):
    terms = [(1, f'{reads[c]}_score[{i}]') for c, _ in scores.by_value]
    terms += [(w[i], reads[c]) for c, w in scores.weights if w[i]]
    terms += [(scores.bias[i], '')] if scores.bias[i] else []
    pieces = []
    for k, (w, term) in enumerate(terms):
      size = str(abs(w)) if not term else '' if abs(w) == 1 else f'{abs(w)} * '
      sign = ('-' if w < 0 else '') if k == 0 else ('- ' if w < 0 else '+ ')
      pieces.append(f'{sign}{size}{term}')
    opening = f'        {tokens[tag]!r}: '
    if len(opening + ' '.join(pieces)) + 1 <= WIDTH:
      lines.append(f'{opening}{" ".join(pieces) or "0"},')
      continue
    lines.append(f'{opening}(')   # a long sum wraps inside parentheses, each line led by its sign
    for piece in pieces:
      if len(lines[-1]) + len(piece) + 3 > WIDTH and not lines[-1].endswith('('):
        lines.append(' ' * (len(opening) + 1))
      lines[-1] += piece if lines[-1].endswith(('(', ' ')) else f' {piece}'
    lines[-1] += '),'
  return lines + ['    }', '    return max(scores, key=scores.get)']


def _decisions_source(decisions: Decisions, doms, tokens: list[str]) -> list[str]:
  """``decide`` as the program writes it: the tree's tests as ``if``s over the variables' values (tokens as
  strings), each split's default after its tests; or its scores (``_scores_source``)."""
  if isinstance(decisions.tree, Scores):
    return _scores_source(decisions, doms, tokens)
  reads = decisions.reads

  def write(node, indent):
    if isinstance(node, Leaf):
      if node.copy is None:
        return [f'{indent}return {tokens[node.tag]!r}']
      name = reads[node.copy]
      if name not in decisions.numbered:
        return [f'{indent}return {name}']
      return [f'{indent}return {_number_text(name, *decisions.numbered[name])}']
    name = reads[node.column]
    is_token = doms[name][1]
    single = lambda values, child: len(values) == 1 and isinstance(child, Leaf) and child.copy is None
    lookup = [(values[0], child.tag) for values, child in node.branches if single(values, child)]
    formula = None if is_token else _formula(name, lookup, tokens)
    if (not formula and len(lookup) == len(node.branches) > 1 and isinstance(node.default, Leaf)
        and node.default.copy is None):
      items = [f'{_value(v, is_token, tokens)}: {tokens[tag]!r}' for v, tag in lookup]
      return _wrapped_set('return ', items, f'.get({name}, {tokens[node.default.tag]!r})', indent)
    out = []
    for values, child in node.branches:
      if formula and single(values, child):
        continue
      test = _test(name, values, doms[name][0], is_token, tokens)
      if (isinstance(child, Split) and len(child.branches) == 1 and isinstance(child.branches[0][1], Leaf)
          and child.default == node.default):  # where the inner test fails, these values meet the default
        inner, leaf = child.branches[0]
        column = reads[child.column]
        test += f' and {_test(column, inner, *doms[column], tokens)}'
        child = leaf
      out += [f'{indent}if {test}:', *write(child, indent + '    ')]
    if formula:  # the tag is the number itself, give or take a constant: f'#{count}'
      test = _test(name, tuple(v for v, _ in lookup), doms[name][0], False, tokens)
      line = f'{indent}return {formula} if {test} else {tokens[node.default.tag]!r}' if (
          isinstance(node.default, Leaf) and node.default.copy is None) else ''
      if not out and line and len(line) <= WIDTH:
        return [line]
      out += [f'{indent}if {test}:', f'{indent}    return {formula}']
    return _folded(out + write(node.default, indent), indent)

  return [f'def decide({", ".join(reads)}):',
          '    """A position\'s tag from its values of DECIDES, exact where the task\'s inputs reach."""',
          *write(decisions.tree, '    ')]


def _folded(lines: list[str], indent: str) -> list[str]:
  """``if test: return a`` then ``return b`` as ``return a if test else b``, where that fits on a line."""
  if len(lines) < 3 or not lines[-3].startswith(f'{indent}if ') or not lines[-1].startswith(f'{indent}return '):
    return lines
  body = lines[-2][len(indent):]
  if not body.startswith('    return ') or ' if ' in body or ' if ' in lines[-1]:  # one conditional a line
    return lines
  line = f'{indent}return {body[11:]} if {lines[-3][len(indent) + 3:-1]} else {lines[-1][len(indent) + 7:]}'
  return lines if len(line) > WIDTH else lines[:-3] + [line]


def _formula(name: str, lookup: list[tuple[int, int]], tokens: list[str]) -> str | None:
  """The tags of a number's values as an f-string of it where there is one, over three values or more: each
  tag the same text followed by the value plus one constant (``f'#{count}'``, ``f'#{count - 1}'``)."""
  if len(lookup) < 3:
    return None
  split = [NUMBERED.fullmatch(tokens[tag]) for _, tag in lookup]
  if not all(split) or len({m.group(1) for m in split}) != 1:
    return None
  shifts = {int(m.group(2)) - v for (v, _), m in zip(lookup, split)}
  if len(shifts) != 1:
    return None
  return _number_text(name, split[0].group(1), shifts.pop())


def _test(name: str, values: tuple[int, ...], dom, is_token: bool, tokens: list[str]) -> str:
  """``name`` takes one of ``values``, in the shortest form exact on its domain ``dom`` (``_shortest``), else
  ``in`` a set."""
  short = _shortest(name, values, dom, is_token, tokens)
  return short or f'{name} in {{{", ".join(_value(v, is_token, tokens) for v in sorted(values))}}}'


def _variables(plan: Plan) -> list[str]:
  """Every variable in the order the model writes them (the classifier's order, which its sums follow), a merged
  module's among them."""
  return [n for n in plan.readout if n != 'bias']


def _needs(plan: Plan, kept_readout: set[str], doms) -> set[str]:
  """The variables the readout's kept terms need, with everything they read (a head that matches no key reads
  its value alone: ``at_first``)."""
  by_name = {m.name: m for m in plan.modules}
  live, todo = set(), list(kept_readout) + ['tokens', 'positions']
  while todo:
    n = todo.pop()
    if n in live:
      continue
    live.add(n)
    if n in by_name:
      m = by_name[n]
      todo += [m.reads[2]] if _never(m, doms) or _every(m, doms) else list(m.reads)
    elif n in plan.aliases:
      todo.append(plan.aliases[n])
  return live


def _load(text: str, readout: dict[str, np.ndarray], data_file: str):
  """Imports a program text from a temporary folder with its readout beside it (``_indexed``: a row per value
  it may hold, or ``_reached``'s data file); the program reads its readout when imported, so the folder is
  removed then."""
  with tempfile.TemporaryDirectory(prefix='symjax_program_') as folder:
    path = os.path.join(folder, 'program.py')
    with open(path, 'w') as f:
      f.write(text)
    np.savez(os.path.join(folder, data_file), **_indexed(readout))
    return tables_decompile.load_program(path)


def _indexed(readout: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """A readout of a row per value a variable may hold (the model's: ``plan.readout``) as the data file holds
  one (``CLASSIFY_TABLE``): every value listed, every tag; a data file's (or none) as it is."""
  if not readout or 'tags' in readout:  # decisions in the code, or a data file
    return readout
  out = {'tags': np.arange(len(readout['bias']))}
  for name, rows in readout.items():
    out[name] = rows
    if name != 'bias':
      out[f'{name}.values'] = np.arange(len(rows))
  return out


def _reached(plan: Plan, doms, readout: dict[str, np.ndarray], text: str, inputs: np.ndarray,
             lengths: np.ndarray, exhaustive: bool, data_file: str) -> dict[str, np.ndarray]:
  """The data file of a classifier ``readout`` (a row per value): each variable's rows for the values its
  domain holds only, and, where ``inputs`` are the task's every input, the tags it gives a tagged position
  only (a tag that is never the highest changes no argmax where it is left out). Checked: ``text`` tags every
  input as with ``readout``."""
  full = _indexed(readout)
  want = _load(text, full, data_file).predict_ids(inputs, lengths)
  real = np.arange(inputs.shape[1])[None, :] < lengths[:, None]
  tags = np.unique(want[tagged_positions(plan, inputs, real)]) if exhaustive else full['tags']
  if not len(tags):  # no position is tagged: any one tag
    tags = full['tags'][:1]
  out = {'bias': readout['bias'][tags], 'tags': tags}
  for name, rows in readout.items():
    if name != 'bias':
      values = np.array(sorted(doms[plan.aliases.get(name, name)][0]), np.int64)
      out[name], out[f'{name}.values'] = rows[np.ix_(values, tags)], values
  if ((_load(text, out, data_file).predict_ids(inputs, lengths) != want) & real).any():
    raise RuntimeError("the classifier's reached rows and tags changed a tag")
  return out


def _run(plan: Plan, doms, live: set[str], readout: dict[str, np.ndarray], inputs: np.ndarray, lengths: np.ndarray,
         data_file: str) -> tuple[dict, np.ndarray]:
  """Every variable of the program over ``live`` on ``inputs`` (``Variable``s, [inputs, positions]), and which
  positions are real."""
  program = _load(source(plan, live, doms, 'run', data_file), readout, data_file)
  n = inputs.shape[1]
  real = np.arange(n)[None, :] < lengths[:, None]
  program.ALLOWED = real[:, None, :] & (np.tril(np.ones((n, n), bool)) if plan.causal else True)
  values = program.run(program.Variable(inputs.astype(np.int32), True),
                       program.Variable(np.broadcast_to(np.arange(n, dtype=np.int32), inputs.shape), False))
  return values, real


def _logits(plan: Plan, ids: dict[str, np.ndarray], names: list[str], bias: np.ndarray, rows=slice(None)
            ) -> np.ndarray:
  """The classifier's scores as the written program sums them (the same float32 additions, in its order)."""
  total = 0
  for name in names:
    total = total + plan.readout[name][ids[name][rows]]
  return bias + total


def prune(plan: Plan, doms, inputs: np.ndarray, lengths: np.ndarray, data_file: str
          ) -> tuple[set[str], np.ndarray]:
  """The classifier rows kept, and its bias: each variable's rows are left out when no prediction at the tagged
  positions of ``inputs`` (``tagged_positions``) changes.

  Each trial subtracts the variable's rows from the running scores; positions whose lead there is within
  rounding of a tie are rescored exactly as the program sums, and the final set is checked the same way."""
  names = _variables(plan)
  everything = set(names)
  values, real = _run(plan, doms, everything, _readout(plan, everything), inputs, lengths, data_file)
  tagged = tagged_positions(plan, inputs, real)
  # Positions holding the same value of every variable score alike: each such tuple is scored once.
  held = np.stack([values[name].ids[tagged] for name in names], -1).astype(np.int64)
  distinct = held[_distinct_rows(held)[0]]
  ids = {name: distinct[:, i] for i, name in enumerate(names)}
  kept, bias = list(names), plan.readout['bias']
  logits = _logits(plan, ids, kept, bias)
  want = logits.argmax(-1)
  rows = np.arange(len(want))
  others = np.arange(logits.shape[1])[None] != want[:, None]
  # A variable that holds one value on every input adds the same row everywhere: leaving it out moves that row
  # into the bias (a head whose predicate never holds reads position 0, whatever its value's domain). The last
  # written is tried first, and the passes repeat while one more can go.
  held_values = {name: np.unique(ids[name]) for name in names}
  replace = {name: plan.readout[name][held_values[name][0]] if len(held_values[name]) == 1
             else np.zeros_like(bias) for name in names}
  for _ in range(len(names)):
    before = len(kept)
    for name in sorted(kept, key=lambda n: -names.index(n)):
      trial = logits - plan.readout[name][ids[name]] + replace[name]
      new_bias = bias + replace[name]
      top = trial[rows, want]
      lead = top - np.where(others, trial, -np.inf).max(-1)
      if (lead < 0).any():
        continue
      # Within rounding of a tie, the first of the tied tags wins: rescore those positions as the program does.
      unsure = np.nonzero(lead <= 1e-4 * (1 + np.abs(top)))[0]
      without = [m for m in kept if m != name]
      if (_logits(plan, ids, without, new_bias, unsure).argmax(-1) == want[unsure]).all():
        kept, logits, bias = without, trial, new_bias
    if len(kept) == before:
      break
  if not (_logits(plan, ids, kept, bias).argmax(-1) == want).all():  # the rescoring above makes this unreachable
    raise RuntimeError('pruning changed a prediction on the input space')
  return set(kept), bias


# Why a classifier fit stopped short, in its note.
UNSETTLED = 'a linear program did not settle within `classifier_fit.WORK_LIMIT` (simplex iterations × nonzeros)'


def refit(plan: Plan, doms_of, kept: set[str], bias: np.ndarray, inputs: np.ndarray, lengths: np.ndarray,
          data_file: str) -> tuple[Plan, set[str], np.ndarray, list[str]]:
  """The classifier fit anew over fewer of the ``kept`` variables (``classifier_fit.sparsest``): the same tag at
  every tagged position of ``inputs`` (the task's every input), from integer rows; what only the variables left
  out read then leaves the program, and the modules are loosened again (``loosen``: fewer variables reach a tag,
  so more of each module is free). The last written is tried first, as ``prune`` does. The plan, the variables
  kept, the bias and the notes; the plan as it was where none can go."""
  doms = doms_of(plan)
  reads = [n for n in _variables(plan) if n in kept]
  if len(reads) < 2:
    return plan, kept, bias, []
  values, real = _run(plan, doms, _needs(plan, kept, doms), _readout(plan, kept, bias), inputs, lengths, data_file)
  held = np.stack([values[n].ids[tagged_positions(plan, inputs, real)] for n in reads], -1).astype(np.int64)
  del values
  held = held[_distinct_rows(held)[0]]
  tags = _logits(plan, {n: held[:, i] for i, n in enumerate(reads)}, reads, bias).argmax(-1)
  try:
    fit = classifier_fit.sparsest(held, tags, len(bias), order=list(reversed(range(len(reads)))))
  except classifier_fit.Unsettled:
    return plan, kept, bias, [f'The classifier is not fit anew: {UNSETTLED}.']
  if fit is None:
    return plan, kept, bias, []
  # Every variable left out adds nothing: the plan's classifier is the new one, for the passes after this one.
  readout = {n: np.zeros((plan.card, len(bias)), np.int64) for n in plan.readout}
  readout['bias'] = fit.bias
  for c in fit.columns:
    readout[reads[c]][fit.values[c]] = fit.rows[c]
  after = dataclasses.replace(plan, readout=readout)
  names = [reads[c] for c in fit.columns]
  if not (_logits(after, {n: held[:, reads.index(n)] for n in names}, names, fit.bias).argmax(-1) == tags).all():
    raise RuntimeError('fitting the classifier anew changed a prediction on the input space')
  dropped = [n for n in reads if n not in names]
  note = (f'The classifier is fit anew over {len(names)} of its {len(reads)} variables, with integer rows: the '
          'same tag at every tagged position of every input of the task (a linear program). Left out: '
          + ', '.join(f'`{n}`' for n in dropped) + '.'
          + (f' The search for fewer stopped: {UNSETTLED}.' if fit.unsettled else ''))
  after, loosened = loosen(after, doms_of, inputs, lengths, data_file)
  return after, set(names), fit.bias, [note, *loosened]


def _check_same(before: Plan, before_doms, after: Plan, after_doms, inputs: np.ndarray, lengths: np.ndarray,
                data_file: str) -> None:
  """RuntimeError unless the simplified plan's program tags every input as the plan it came from."""
  tags = []
  for plan, doms in ((before, before_doms), (after, after_doms)):
    everything = set(_variables(plan))
    program = _load(source(plan, everything, doms, 'checked', data_file), _readout(plan, everything), data_file)
    tags.append(program.predict_ids(inputs, lengths))
  if not (tags[0] == tags[1]).all():
    raise RuntimeError('simplifying the program changed a prediction on the input space')


def _readout(plan: Plan, kept: set[str], bias: np.ndarray | None = None) -> dict[str, np.ndarray]:
  bias = plan.readout['bias'] if bias is None else bias
  return {'bias': bias, **{n: plan.readout[n] for n in plan.readout if n in kept}}


@dataclasses.dataclass
class CodeProgram:
  """A decompiled program: its source, the readout (its only data), and its size."""

  source: str
  tables: dict[str, np.ndarray]  # the classifier's data file; empty when its decisions are in the code
  entries: int                   # the classifier's numbers: table cells, or decisions × (values read + tag)
  lines: int
  exhaustive: bool
  notes: list[str]      # one sentence per head and MLP kept, in the program's order
  names: dict[str, str] = dataclasses.field(default_factory=dict)  # the model's name -> the code's, where they differ
  left: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # ``leftovers``: empty lists when simplified
  model_lines: int = 0  # the lines the model decides: ``run`` and the decisions (the rest is the same runtime)
  decisions: Decisions | None = None  # the classifier in the code, where it is there


def build(params, cfg, tokens: list[str], inputs: np.ndarray, lengths: np.ndarray, exhaustive: bool,
          origin: str = 'memory', data_file: str = 'program.npz', untagged: tuple[int, ...] = (),
          fit_classifier: bool = True) -> CodeProgram:
  """The pruned program of a Transformer Program, pruned on ``inputs`` (token ids, each row ``lengths`` long);
  ``untagged``: the input tokens whose positions the task never tags (``untagged_tokens``); ``fit_classifier``
  as ``code_of`` takes it."""
  plan = plan_of(params, cfg)
  # The program reads inputs as long as those it is pruned and checked on (the model may take longer ones).
  plan.tokens, plan.max_len, plan.untagged = list(tokens), inputs.shape[1], tuple(untagged)
  return code_of(plan, inputs, lengths, exhaustive, origin, data_file, fit_classifier)


def _decided(plan: Plan, doms, live: set[str], kept: set[str], bias: np.ndarray, inputs: np.ndarray,
             lengths: np.ndarray, data_file: str) -> tuple[Plan, Decisions | None, dict | None, list[str]]:
  """On the task's every input: the classifier as decisions (``decisions_of``, None above their limit), with a
  count that takes in ``<s>`` counted without it (``uncount_first``); the plan, every live variable at every
  position where the run behind the decisions still holds the plan's (else None), and the notes."""
  if not kept:  # no variable changes a tag: the classifier is one tag
    return plan, decisions_of(plan, doms, kept, bias, None), None, []
  combinations = _tagged_combinations(plan, doms, live, kept, bias, inputs, lengths, data_file)
  decisions = decisions_of(plan, doms, kept, bias, combinations)
  if not decisions:
    copying = _copying(plan, doms, combinations, inputs, lengths, data_file)
    if copying:
      return plan, copying, combinations[2], []
    decisions = _scoring(plan, doms, kept, combinations, inputs, lengths, data_file)
    if not decisions:
      return plan, None, combinations[2], []
  before = plan
  plan, decisions, uncounted = uncount_first(plan, doms, kept, decisions, combinations, inputs, lengths, data_file)
  if entries_of(decisions.tree) > DECISION_LIMIT:  # scores the counts without their keys did not shorten enough
    return before, None, combinations[2], []
  return plan, decisions, None if uncounted else combinations[2], uncounted


def _scoring(plan: Plan, doms, kept: set[str], combinations: Combinations, inputs: np.ndarray,
             lengths: np.ndarray, data_file: str) -> Decisions | None:
  """``scored_decisions`` over the classifier's kept variables at the tagged positions, of any size (counts
  without ``<s>`` may yet shorten them: ``uncount_first``), checked: the program written with them tags every
  input as the classifier does."""
  held, tags, _, tagged, first = combinations
  decisions = scored_decisions(plan, [n for n in _variables(plan) if n in kept], held[first], tags[first], doms,
                               bounded=False)
  if decisions is None:
    return None
  return _checked(plan, doms, decisions, inputs, lengths, tagged, tags, data_file, 'the scores')


def _checked(plan: Plan, doms, decisions: Decisions, inputs: np.ndarray, lengths: np.ndarray, tagged: np.ndarray,
             tags: np.ndarray, data_file: str, what: str) -> Decisions:
  """``decisions``, once the program written with them gives every tagged position of ``inputs`` its tag in
  ``tags``: a RuntimeError naming ``what`` otherwise."""
  program = _load(source(plan, _needs(plan, set(decisions.reads), doms), doms, 'checked', data_file, decisions),
                  {}, data_file)
  if not (program.predict_ids(inputs, lengths)[tagged] == tags).all():
    raise RuntimeError(f'{what} changed a prediction on the input space')
  return decisions


def _copying(plan: Plan, doms, combinations: Combinations, inputs: np.ndarray, lengths: np.ndarray,
             data_file: str) -> Decisions | None:
  """``copied_decisions`` over every live variable at the tagged positions, checked: the program written with
  them tags every input as the classifier does."""
  _, tags, values, tagged, _ = combinations
  names = [n for n in _variables(plan) if n in values]
  decisions = copied_decisions(plan, names, np.stack([values[n].ids[tagged] for n in names], -1).astype(np.int64),
                               tags, doms)
  if decisions is None:
    return None
  return _checked(plan, doms, decisions, inputs, lengths, tagged, tags, data_file, 'the decisions that copy a variable')


def _unreached_filled(plan: Plan, doms_of, live: set[str], readout: dict[str, np.ndarray], values: dict | None,
                      inputs: np.ndarray, lengths: np.ndarray, data_file: str) -> tuple[Plan, list[str]]:
  """``fill_unreached`` on the task's every input (``values``: every live variable there, or None to run the
  program for them), simplified again (a predicate may now ignore its query, a head equal an earlier one), and
  checked: every live variable keeps its value at every real position, or at every tagged one for a module
  whose value elsewhere reaches no tag (a head exact only for the query values tagged positions hold may fold
  to other values there). The notes are empty where nothing was written anew."""
  doms = doms_of(plan)
  if values is None:
    values = _run(plan, doms, live, readout, inputs, lengths, data_file)[0]
  real = np.arange(inputs.shape[1])[None, :] < lengths[:, None]
  filled, notes = fill_unreached(plan, doms, live, values, real)
  if not notes:
    return plan, []
  filled, folded = simplify(filled, doms_of)  # a head that now matches no key may equal an earlier one
  after = _run(filled, doms_of(filled), live, readout, inputs, lengths, data_file)[0]
  free, tagged = untagged_free(plan), tagged_positions(plan, inputs, real)
  where = lambda n: tagged if n in free else real
  if any((after[n].ids[where(n)] != values[n].ids[where(n)]).any() for n in live if n in values):
    raise RuntimeError('writing unreached pairs anew changed a variable on the input space')
  return filled, notes + folded


def _simplified(plan: Plan, doms_of, inputs: np.ndarray, lengths: np.ndarray, exhaustive: bool, data_file: str
                ) -> tuple[Plan, list[str]]:
  """``plan`` simplified (``simplify``; on the task's every input, renamings merged too), heads exact only where
  the task tags (``restrict_to_tagged``), checked to tag ``inputs`` as the plan does; then, on the task's every
  input, loosened where no tag changes (``loosen``). The notes of each pass."""
  unsimplified = plan
  plan, notes = simplify(plan, doms_of)
  if exhaustive:  # a renaming found on the task's every input holds on every input
    plan, renamings = merge_renamings_everywhere(plan, doms_of, inputs, lengths, data_file)
    notes += renamings
  if plan.untagged:
    plan, restricted = restrict_to_tagged(plan, doms_of, inputs, lengths, data_file, exhaustive)
    notes += restricted
  _check_same(unsimplified, doms_of(unsimplified), plan, doms_of(plan), inputs, lengths, data_file)
  if exhaustive:  # what no tag reads may change: the shorter tables are written
    plan, loosened = loosen(plan, doms_of, inputs, lengths, data_file)
    notes += loosened
  return plan, notes


def code_of(plan: Plan, inputs: np.ndarray, lengths: np.ndarray, exhaustive: bool, origin: str = 'memory',
            data_file: str = 'program.npz', fit_classifier: bool = True) -> CodeProgram:
  """The code of ``plan``: simplified (``simplify``), checked to tag ``inputs`` as the plan does, and pruned;
  on the task's every input, its classifier fit anew over fewer variables (``refit``) unless ``fit_classifier``
  is False (the model's classifier, pruned only)."""
  real = np.arange(inputs.shape[1])[None, :] < lengths[:, None]
  input_tokens = [int(t) for t in np.unique(inputs[real])]
  first = {'tokens': tuple(int(t) for t in np.unique(inputs[lengths > 0, 0]))}  # what position 0 holds
  doms_of = lambda p: domains(p, input_tokens, first)
  plan, simplified = _simplified(plan, doms_of, inputs, lengths, exhaustive, data_file)
  doms = doms_of(plan)
  kept, bias = prune(plan, doms, inputs, lengths, data_file)
  if exhaustive and fit_classifier:  # a classifier over fewer variables may tag every input alike
    plan, kept, bias, refitted = refit(plan, doms_of, kept, bias, inputs, lengths, data_file)
    doms, simplified = doms_of(plan), simplified + refitted
  live = _needs(plan, kept, doms)
  # Decisions in the code only where the inputs are the task's every input: no other input can reach a
  # combination the table would decide and the decisions do not.
  decisions, values = None, None
  if exhaustive:
    plan, decisions, values, decided = _decided(plan, doms, live, kept, bias, inputs, lengths, data_file)
    if decided:  # a count that leaves out a key may now match the same keys whatever its query holds
      plan, folded = simplify(plan, doms_of, merge=False)
      doms, decided = doms_of(plan), decided + folded
    simplified += decided
  if decisions:  # what the decisions read, and what that reads: the rest of the program is not needed
    live = _needs(plan, set(decisions.reads), doms)
  if exhaustive:  # pairs of values no input reaches may be written either way: the shorter is written
    plan, filled = _unreached_filled(plan, doms_of, live, _readout(plan, kept, bias), values, inputs, lengths,
                                     data_file)
    if filled:
      doms, simplified = doms_of(plan), simplified + filled
      live = _needs(plan, set(decisions.reads) if decisions else kept, doms)
    del values
  # From here on the variables have the code's names; each module's comment names the model's head or MLP.
  names = names_of(plan, doms)
  r = lambda v: names.get(v, v)
  plan, doms = renamed(plan, names), {r(k): v for k, v in doms.items()}
  live, kept = {r(v) for v in live}, {r(v) for v in kept}
  if decisions:
    decisions = Decisions([r(v) for v in decisions.reads], decisions.tree,
                          {r(v): numbered for v, numbered in decisions.numbered.items()})
  origin_of = {v: k for k, v in names.items()}
  # A module's sentence names the model's head or MLP it comes from; the comment above its code is one line where
  # a brief sentence fits (``describe``'s ``brief``).
  named = lambda name, text: (text.replace(f'`{name}`', f'`{name}` ({origin_of[name]})', 1) if name in origin_of
                              else text)
  sentences = {m.name: named(m.name, describe(m, doms, plan.tokens)) for m in plan.modules if m.name in live}
  comments = {m.name: _one_line([named(m.name, describe(m, doms, plan.tokens, most=2, brief=b)) for b in range(3)])
              for m in plan.modules if m.name in live}
  where = ('every input of the task' if exhaustive else 'the inputs of the train and validation splits')
  needs = 'only NumPy' if decisions else f'only NumPy and the classifier in {data_file} beside it'
  header = textwrap.fill(
      f'Decompiled by symjax from the Transformer Program {origin}. predict(tokens) -> tags runs it; it '
      f'needs {needs}. Variables are named by what they hold (tok_, pos_, count_, mlp_, cat_) or mean '
      f'(prev_token, length, ...); comments name the model\'s head or MLP. What changes no prediction on {where} '
      'is left out.', HEADER_WIDTH, break_on_hyphens=False, break_long_words=False)
  text = source(plan, live, doms, header, data_file, decisions, comments)
  readout = {} if decisions else _reached(plan, doms, _readout(plan, kept, bias), text, inputs, lengths,
                                          exhaustive, data_file)
  notes = list(sentences.values()) + simplified
  note, entries = _classifier_note(decisions, readout)
  notes.append(note)
  left = leftovers(plan, doms, live, _run(plan, doms, live, readout or _readout(plan, kept, bias), inputs, lengths,
                                          data_file) if exhaustive else None)
  lines = text.splitlines()
  start = lines.index('def run(tokens, positions):')
  end = next(i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(' '))
  while not lines[end - 1]:  # the blank lines after run
    end -= 1
  run_lines = end - start
  decided = len(_decisions_source(decisions, doms, plan.tokens)) if decisions else 0
  return CodeProgram(text, readout, entries, len(lines), exhaustive, notes, names, left, run_lines + decided,
                     decisions)


def _classifier_note(decisions: Decisions | None, readout: dict[str, np.ndarray]) -> tuple[str, int]:
  """The sentence that says what the classifier is (scores, a tree, or the table ``readout``), and its entries."""
  if decisions and isinstance(decisions.tree, Scores):
    entries = entries_of(decisions.tree)
    return ('The classifier is a score per tag over ' + ', '.join(f'`{n}`' for n in decisions.reads)
            + f', {entries} whole numbers in all, each score a whole multiple of each number: the tag of highest '
            'score is the tag of every combination of them the task\'s inputs reach.', entries)
  if decisions:
    entries = entries_of(decisions.tree)
    return (f'The classifier is a tree of {entries} values and tags over '
            + (', '.join(f'`{n}`' for n in decisions.reads) or 'nothing') + ': every combination of them the '
            'task\'s inputs reach, and no other.', entries)
  variables = [n for n in readout if n not in ('bias', 'tags') and not n.endswith('.values')]
  return ('The classifier adds a row per value of ' + ', '.join(f'`{n}`' for n in variables)
          + f" that the variable can hold, and predicts the highest-scoring of {len(readout['tags'])} tags.",
          int(sum(v.size for v in readout.values())))


def leftovers(plan: Plan, doms, live: set[str], run: tuple[dict, np.ndarray] | None = None) -> dict[str, list[str]]:
  """What the simplifier should have left nowhere, among the ``live`` modules: a constant (one value), a
  predicate that never holds (written as such: a counting head), and a duplicate — equal to an earlier live
  variable as written, or, given ``run`` (``_run`` on the task's every input), up to a renaming of values."""
  modules = [m for m in plan.modules if m.name in live]
  constant = [m.name for m in modules if len(doms[m.name][0]) == 1]
  never = [m.name for m in modules if m.kind == 'numerical' and not _truth(m, doms).any()]
  seen, duplicate = set(), []
  for m in modules:
    signature = (m.kind, m.reads, _signature(m, doms))
    if signature in seen:
      duplicate.append(m.name)
    seen.add(signature)
  if run is not None:
    values, real = run
    # A module whose untagged positions reach no tag is a duplicate where it is one at the tagged positions.
    tagged = tagged_positions(plan, values['tokens'].ids, real)
    free = untagged_free(plan)
    earlier = ['tokens', 'positions']
    for m in modules:
      at = tagged if m.name in free else real
      if m.name not in duplicate and any(_renaming(values[e].ids[at], values[m.name].ids[at], plan.card)
                                         is not None for e in earlier):
        duplicate.append(m.name)
      earlier.append(m.name)
  return {'constant': constant, 'never': never, 'duplicate': duplicate}


def true_reads(params, cfg, tokens: list[str], inputs: np.ndarray, lengths: np.ndarray
               ) -> set[tuple[str, str, str]]:
  """The reads the program of a Transformer Program's ``params`` needs to tag ``inputs`` as the model does:
  {(variable, module, role)} in the model's names, role one of the selections (``query``, ``key``, ``value``,
  ``first``, ``second``) or ``readout``. Constants are folded and what no kept classifier row needs is left out,
  as in the code; modules are not merged, so that each read is one the model makes (a merged module is computed
  by the model all the same). These are the true edges of its circuit (``symjax.interpret.edges``)."""
  if cfg.kind != 'program':
    raise InputError(f"a circuit's true edges come from a program: a Transformer Program's code (model.kind "
                     f"'program') or a program-trained Symbolic Transformer's; this model is of kind {cfg.kind!r}, "
                     f"whose circuit no program states")
  plan = plan_of(params, cfg)
  plan.tokens, plan.max_len = list(tokens), inputs.shape[1]
  real = np.arange(inputs.shape[1])[None, :] < lengths[:, None]
  input_tokens = [int(t) for t in np.unique(inputs[real])]
  first = {'tokens': tuple(int(t) for t in np.unique(inputs[lengths > 0, 0]))}
  doms_of = lambda p: domains(p, input_tokens, first)
  folded, _ = simplify(plan, doms_of, merge=False)
  doms = doms_of(folded)
  kept, _ = prune(folded, doms, inputs, lengths, 'program.npz')
  live = _needs(folded, kept, doms)
  reads = {(v, 'logits', 'readout') for v in kept}
  for model_m, m in zip(plan.modules, folded.modules):
    if m.name not in live:
      continue
    roles = ('first', 'second') if m.kind == 'mlp' else ('query', 'key', 'value')
    for i, (role, chosen, now) in enumerate(zip(roles, model_m.reads, m.reads)):
      only_value = m.kind != 'mlp' and (_never(m, doms) or _every(m, doms))
      if now == NOTHING or (m.kind == 'mlp' and now != chosen) or (only_value and i < 2) or chosen == 'ones':
        continue
      reads.add((chosen, m.name, role))
  return reads


def true_edges(params, cfg, tokens: list[str], inputs: np.ndarray, lengths: np.ndarray) -> list[str]:
  """``true_reads`` as the names of the edges of the model's graph (``symjax.interpret.edges.Graph``); for a
  program-trained Symbolic Transformer (kind 'symbolic', ``model.hard``), the edges its program needs
  (``symjax.proj.decompile.true_edges``)."""
  from symjax.interpret import edges
  if cfg.kind == 'symbolic':
    from symjax.proj import decompile
    return decompile.true_edges(params, cfg, inputs, lengths)
  reads = true_reads(params, cfg, tokens, inputs, lengths)
  graph = edges.graph_of(cfg)
  return sorted(graph.edge_of(v, 'readout' if role == 'readout' else f'{m}.{role}')
                for v, m, role in reads)


def decompile(loaded, data_file: str = 'program.npz', fit_classifier: bool = True) -> CodeProgram:
  """The program of a loaded run of kind 'program' on a task with an input space (``input_space``);
  ``fit_classifier`` as ``code_of`` takes it."""
  from symjax import tasks
  task = tasks.get_task(loaded.config)
  if not hasattr(task, 'input_space'):
    raise InputError(f"decompiling a Transformer Program needs a task whose inputs can be listed (the RASP "
                     f"tasks and induction), got task {loaded.task!r}")
  inputs, exhaustive = task.input_space()
  lengths = (inputs != task.pad_id).sum(1)
  origin = f'in {loaded.workdir or "memory"} (step {loaded.step}, task {loaded.task})'
  return build(loaded.params, loaded.model_config, list(loaded.tokenizer.vocab.tokens), inputs, lengths,
               exhaustive, origin, data_file, untagged_tokens(task), fit_classifier)


def untagged_tokens(task) -> tuple[int, ...]:
  """The input tokens no position of the task's data tags (its target there is always PAD): ``<s>`` and
  ``</s>`` of the RASP tasks; ``<s>`` and the numbers of induction."""
  seen, tagged = set(), set()
  for split, x in task.data.inputs.items():
    seen |= set(np.unique(x).tolist())
    tagged |= set(np.unique(x[task.data.targets[split] != task.pad_id]).tolist())
  return tuple(sorted(seen - tagged - {task.pad_id}))
