"""Patching programs that recompute only what a patch can change.

In a causal model, a patch at block l and position p leaves every block before l and every position before p
as they were in the corrupt run. So a patch is computed by ``symjax.model``'s blocks l… over positions s…
(s ≤ p), their attention reading the corrupt run's keys and values of the positions before s. A patch changes
nothing before the first position where the prompts differ (the embedding, only where their tokens differ), so
s is the latest multiple of ``time / BUCKETS`` not after the first position a patch may change, chosen from the
tokens before anything runs; a patch that can change nothing is not computed, and its logits are the corrupt
run's.

One program (``_cache``) runs the clean and corrupt prompts once and keeps what the patches read: the sites'
clean values, every block's corrupt keys and values, the corrupt state entering each block.
Where the blocks are of one kind, the patches of every block that share a start run in one program
(``_wave``): the blocks in turn, each over all the patches begun so far, a block's own patches joining as new
rows with the corrupt state entering it, so that a patch of block l costs blocks l… alone and every matrix
product runs over all the rows it serves. Blocks of two kinds (``symbolic_layers``) run a program per block
(``_patches``). Every program is dispatched before any result is read, compiles once per sites and shapes,
and the next sweep reuses it.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from symjax.interpret import core, engine, hooks
from symjax.model import FactoredBlock, StandardBlock, Suffix, Transformer
from symjax.model import intermediates as names
from symjax.model.masks import head_mask_matrix

# Starts per input. Each start is a program to compile (once per shapes); for patches spread over the
# positions, two starts recompute 3/4 of the suffix work of one, four 5/8: the two further starts save less
# than their compiles unless a sweep is rerun many times (benchmarks/results/sweep_starts_cpu_amd*.json).
BUCKETS = 2
CHUNK_TOKENS = 8192  # patch tokens per call (patches × batch × positions computed): bounds a program's memory
_STATE_SITES = ('resid', 'x_t', 'x_e')


def applies(model: Transformer, time: int) -> bool:
  """Whether every position of the model reads only the positions up to its own (every head's mask below
  the diagonal), without relational edges: then a suffix is recomputed alone."""
  return _causal(model.config, time)


@functools.lru_cache(maxsize=64)
def _causal(cfg, time: int) -> bool:
  if cfg.kind in ('lstm', 'program') or cfg.attention.relational:
    return False
  static = head_mask_matrix(tuple(cfg.mask_predicates()), time, time)
  return not np.triu(static, 1).any()


def _time_axis(model, site: str):
  return hooks.axes(model, site)[0]


def _first_block(model: Transformer, site: str) -> int:
  """The first block a patch at ``site`` changes: a block's output state enters the next block."""
  if site == 'embed':
    return 0
  if site.startswith('final.'):
    return model.config.num_layers
  _, layer, local = site.split('.', 2)
  return int(layer) + (local in _STATE_SITES)


def _entering(model: Transformer, first: int) -> list[str]:
  """The sites that hold the state entering block ``first`` (the sites a patch there replaces before it)."""
  if first == 0:
    return ['embed']
  b = f'blocks.{first - 1}.'
  return [b + 'resid'] if model.config.kind == 'standard' else [b + 'x_t', b + 'x_e']


def _state(model: Transformer, first: int, value_of) -> Any:
  """The state entering block ``first`` from its sites' values (``value_of(site)``): x, or (x_t, x_e)."""
  entering = [value_of(s) for s in _entering(model, first)]
  if model.config.kind == 'standard':
    return entering[0]
  return tuple(entering) if first else (entering[0], jnp.zeros_like(entering[0]))  # X_e⁰ = 0 before block 0


def _cache(model: Transformer, sites: tuple[str, ...], firsts: tuple[int, ...], read_from: int | None):
  """The clean and corrupt runs: (clean logits, corrupt logits, {site: (clean, corrupt)}, {block: corrupt
  (keys, values)}, {first: corrupt state entering it: x, or (x_t, x_e)}). ``read_from``: the logits from that
  position on (NaN before it), the last block run there alone over the whole pass's keys and values, and the
  rest of its pass left for XLA to remove. The clean and corrupt prompts run as one batch: computing the clean
  run only from where the prompts differ saved nothing measurable at warm calls, and its larger program made
  the first call slower (``benchmarks/results/clean_from_difference_cpu_amd.json``)."""
  key = ('cache', model, sites, firsts, read_from)
  def build():
    cfg = model.config
    last = cfg.num_layers - 1
    kv = [f'blocks.{l}.attn.{s}' for l in range(cfg.num_layers) for s in ('k', 'values')]
    extra = _entering(model, last) if read_from is not None else []
    kept = tuple(dict.fromkeys((*sites, *kv, *(s for f in firsts for s in _entering(model, f)), *extra)))
    capture = lambda seen, wanted: {s: (lambda v, name, s=s: (seen.setdefault(s, v), v)[1]) for s in wanted}

    def readout(params, seen, km):
      """The logits from ``read_from`` on, NaN before: the last block run again there over the pass's keys
      and values (``seen``: its sites), so that XLA removes the rest of its run."""
      prefix = {last: tuple(seen[f'blocks.{last}.attn.{s}'][:, :read_from] for s in ('k', 'values'))}
      state = jax.tree.map(lambda x: x[:, read_from:], _state(model, last, seen.__getitem__))
      tail = Suffix(cfg, last).apply({'params': params}, state, prefix, km)
      pad = jnp.full((tail.shape[0], read_from, tail.shape[-1]), jnp.nan, tail.dtype)
      return jnp.concatenate([pad, tail], axis=1)

    def run(params, clean, corrupt, key_mask):
      b, seen = clean.shape[0], {}
      km = None if key_mask is None else jnp.concatenate([key_mask, key_mask])
      logits = hooks.hooked_logits(model, params, jnp.concatenate([clean, corrupt]), km, capture(seen, kept))
      if read_from is not None:
        logits = readout(params, seen, km)
      # Clean rows first; a site with no position axis ([heads, batch·time, ff]) has them in its first half.
      split = {s: (v[:, :v.shape[1] // 2], v[:, v.shape[1] // 2:]) if _time_axis(model, s) is None
               else (v[:b], v[b:]) for s, v in seen.items()}
      clean_logits, corrupt_logits = logits[:b], logits[b:]
      corrupt_of = lambda s: split[s][1]
      states = {f: _state(model, f, corrupt_of) for f in firsts}
      kv_of = {l: (corrupt_of(f'blocks.{l}.attn.k'), corrupt_of(f'blocks.{l}.attn.values'))
               for l in range(cfg.num_layers)}
      return clean_logits, corrupt_logits, {s: split[s] for s in sites}, kv_of, states
    return run
  return engine.compiled(key, build)


def _from(axis: int | None, x, start: int):
  """``x`` from index ``start`` of ``axis`` on (whole where it has no such axis or broadcasts along it)."""
  if axis is None or not start or x.shape[axis] == 1:
    return x
  return jax.lax.slice_in_dim(x, start, x.shape[axis], axis=axis)


def _patches(model: Transformer, sites: tuple[str, ...], first: int, start: int):
  """The logits ``[patches, batch, time − start, vocab]`` of patches (their masks {site: ``[patches, ...]``})
  of blocks of two kinds, recomputed from block ``first`` over positions ``start``…, each block unrolled."""
  key = ('patches', model, sites, first, start)
  def build():
    entering = _entering(model, first)

    def run(params, cache, key_mask, masks):
      values, kv, states = cache[2], cache[3], cache[4]
      prefix = {l: (k[:, :start], v[:, :start]) for l, (k, v) in kv.items() if l >= first}
      state = jax.tree.map(lambda x: x[:, start:], states[first])

      def one(mask):
        def patch(s, v, name=None):
          axis = _time_axis(model, s)
          return jnp.where(_from(axis, mask[s], start), _from(axis, values[s][0], start).astype(v.dtype), v)
        x = state
        for s in (s for s in entering if s in mask):  # the state entering block ``first``, patched before it
          if isinstance(x, tuple):
            x = (patch(s, x[0]), x[1]) if not s.endswith('.x_e') else (x[0], patch(s, x[1]))
          else:
            x = patch(s, x)
        fns = {s: (lambda v, name, s=s: patch(s, v)) for s in mask if s not in entering}
        with names.session(fns, lambda name: False):
          return Suffix(model.config, first).apply({'params': params}, x, prefix, key_mask)
      return jax.vmap(one)(masks)
    return run
  return engine.compiled(key, build)


def _roles(model: Transformer, sites: tuple[str, ...], first: int) -> tuple[str, ...] | None:
  """The sites of a patch as roles that every block shares: ``in:0`` / ``in:1`` for the state entering block
  ``first`` (x or X_t / X_e), the local name (``attn.z``) for a site inside it; None when a site is elsewhere
  or the blocks differ (``symbolic_layers``), and the unrolled programs serve."""
  if len(set(model.config.layer_kinds())) != 1:
    return None
  entering, roles = _entering(model, first), []
  for s in sites:
    if s in entering:
      roles.append('in:1' if s.endswith('.x_e') else 'in:0')
    elif s.startswith(f'blocks.{first}.') and first < model.config.num_layers:
      roles.append(s.split('.', 2)[2])
    else:
      return None
  return tuple(roles)


def _both_streams(model: Transformer, roles: tuple[str, ...] | None) -> tuple[str, ...] | None:
  """A two-stream patch of the state entering a block names both streams, the one it leaves unpatched (an
  all-False mask), so that the embedding's patches (X_t alone: X_e⁰ = 0) and the later blocks' states share
  one program."""
  if roles is None or model.config.kind == 'standard' or not any(r.startswith('in:') for r in roles):
    return roles
  return tuple(dict.fromkeys(('in:0', 'in:1', *roles)))


def _role_axis(model, role: str):
  return 1 if role.startswith('in:') else _time_axis(model, 'blocks.0.' + role)


def _window(axis: int | None, x, lo: int, like):
  """``x`` at the positions ``like`` holds along ``axis``, ``lo``… (whole where it has no such axis or
  broadcasts along it)."""
  if axis is None or x.shape[axis] == 1:
    return x
  return jax.lax.slice_in_dim(x, lo, lo + like.shape[axis], axis=axis)


def _apply_block(block, axis_of: dict, p, x, mask, clean, lo, prefix, key_mask, table, kept=None, corrupt=None):
  """``block`` (its parameters ``p``) over positions lo… of ``x``, the patches of ``mask`` applied at the roles'
  sites (``axis_of``: each role's position axis); ``kept``: a dict that gets the block's attention keys and
  values. ``corrupt`` ({role: the corrupt run's value}): a patched site takes its unpatched positions from
  there rather than from what the block computes, which then only feeds the site and is left for XLA to
  remove (rows entering the block hold the corrupt state, so the two are the same: a head's patch skips its
  block's attention)."""
  def patch(r, v):
    if r not in clean:
      return v
    a = axis_of[r]
    base = v if corrupt is None else _window(a, corrupt[r], lo, v).astype(v.dtype)
    return jnp.where(_window(a, mask[r], lo, v), _window(a, clean[r], lo, v).astype(v.dtype), base)
  fns = {r: (lambda v, name, r=r: patch(r, v)) for r in clean}
  if kept is not None:
    for r in ('attn.k', 'attn.values'):
      fns[r] = lambda v, name, r=r: kept.setdefault(r, patch(r, v))
  with names.session(fns, lambda name: False):
    if isinstance(block, StandardBlock):
      return block.apply({'params': p}, x, key_mask, True, None, prefix)
    return block.apply({'params': p}, *x, table, key_mask, True, None, prefix)


def _new_rows(roles: tuple[str, ...], state, masks: dict, values: dict, rows: int, lo: int):
  """``rows`` copies of the corrupt state entering a block (x, or (x_t, x_e)) at positions lo…, each with its
  patch of that state (the roles ``in:i``, masks ``[rows, batch, time, d]``) applied."""
  new = jax.tree.map(lambda s: jnp.broadcast_to(s[:, lo:], (rows, *s[:, lo:].shape)), state)
  for r in (r for r in roles if r.startswith('in:')):
    i, m = int(r[3:]), _from(2, masks[r], lo)
    stream = new[i] if isinstance(new, tuple) else new
    patched = jnp.where(m, _from(1, values[r][0], lo)[None].astype(stream.dtype), stream)
    new = tuple(patched if j == i else y for j, y in enumerate(new)) if isinstance(new, tuple) else patched
  return new


def _wave(model: Transformer, roles: tuple[str, ...], start: int, plan: tuple[tuple[int, int], ...],
          read_from: int | None):
  """The logits ``[patches, batch, time − start, vocab]`` of the patches of several blocks of one kind, in one
  program: ``plan`` ((block, patches), …) in block order. The blocks run in turn, each over every patch begun
  so far, and each block that has patches adds them as new rows, entering it with the corrupt state: a patch
  of block l costs blocks l… alone, and every block's matrix products run over all the rows it serves.

  ``read_from`` (the first position a metric reads, after ``start``): the last block computes the positions
  before it only as far as its attention's keys and values, and the logits are ``[patches, batch, time −
  read_from, vocab]``. The last block runs twice, over those positions with its keys and values kept and over
  the rest with them as a prefix; XLA removes the first run's unused queries, attention and FFN."""
  key = ('wave', model, roles, start, plan, read_from)
  def build():
    cfg = model.config
    block = (StandardBlock(cfg) if cfg.kind == 'standard'
             else FactoredBlock(cfg, symbolic=cfg.layer_kinds()[0] == 'symbolic'))
    inside = [r for r in roles if not r.startswith('in:')]
    rows_of = dict(plan)

    apply = functools.partial(_apply_block, block, {r: _role_axis(model, r) for r in roles})

    def run(params, kv, states, values, key_mask, masks):
      table = params['embed']['embedding']
      x = None
      for l in range(plan[0][0], cfg.num_layers + 1):
        row_masks, before = None, 0
        if l in rows_of:
          # After the last block (a patch of its output state) the readout needs the metric's positions alone.
          lo = read_from if read_from is not None and l == cfg.num_layers else start
          new = _new_rows(roles, states[l], masks[l], values[l], rows_of[l], lo)
          before = 0 if x is None else jax.tree.leaves(x)[0].shape[0]
          x = new if x is None else jax.tree.map(lambda a, b: jnp.concatenate([a, b]), x, new)
          if inside:  # the rows begun in earlier blocks are not patched in this one
            row_masks = {r: masks[l][r] for r in inside}
        if l == cfg.num_layers:
          break
        p, prefix = params[f'layer_{l}'], (kv[l][0][:, :start], kv[l][1][:, :start])
        split = read_from is not None and l == cfg.num_layers - 1

        def step(x, mask, clean, corrupt, p=p, prefix=prefix, split=split):
          if not split:
            return apply(p, x, mask, clean, start, prefix, key_mask, table, corrupt=corrupt)
          cut = read_from - start
          kept = {}
          apply(p, jax.tree.map(lambda a: a[:, :cut], x), mask, clean, start, prefix,
                None if key_mask is None else key_mask[:, :read_from], table, kept, corrupt)
          prefix = tuple(jnp.concatenate([a, kept[r].astype(a.dtype)], axis=1)
                         for a, r in zip(prefix, ('attn.k', 'attn.values')))
          return apply(p, jax.tree.map(lambda a: a[:, cut:], x), mask, clean, read_from, prefix, key_mask, table,
                       corrupt=corrupt)
        if row_masks is None:
          x = jax.vmap(lambda x: step(x, {}, {}, None))(x)
        else:
          # The block's own patches run apart from the rows begun earlier, which it does not patch: entering
          # with the corrupt state, they take every patched site's other values from the corrupt run.
          clean = {r: values[l][r][0] for r in inside}
          corrupt = {r: values[l][r][1] for r in inside}
          ours = jax.vmap(lambda x, m: step(x, m, clean, corrupt))(
              jax.tree.map(lambda a: a[before:], x), row_masks)
          if before:
            earlier = jax.vmap(lambda x: step(x, {}, {}, None))(jax.tree.map(lambda a: a[:before], x))
            ours = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), earlier, ours)
          x = ours
      return jax.vmap(lambda x: Suffix(cfg, cfg.num_layers).apply({'params': params}, x, {}, key_mask))(x)
    return run
  return engine.compiled(key, build)


def _first_changes(model, masks: dict[str, np.ndarray], differs: np.ndarray) -> np.ndarray:
  """``[patches]``: the first position where each patch may write a clean value that differs from the corrupt
  one (``time`` where it writes none), from where the prompts differ (``differs`` ``[time]``, the tokens of
  any pair): the embedding differs only there, every later site from the first of them on (a causal model
  mixes a token into the positions after it). A site with no position axis counts at position 0."""
  time = differs.shape[0]
  first = np.full(len(next(iter(masks.values()))), time)
  reach = differs if not differs.any() else np.arange(time) >= np.argmax(differs)
  for s, m in masks.items():
    axis = _time_axis(model, s)
    if axis is None:
      at = np.where(m.reshape(len(m), -1).any(1) & differs.any(), 0, time)
    else:
      per = m.any(axis=tuple(a for a in range(1, m.ndim) if a != 1 + axis))  # [patches, time or 1]
      hit = per & (differs if s == 'embed' else reach)[None]
      at = np.where(hit.any(1), np.argmax(hit, 1), time)
    first = np.minimum(first, at)
  return first


def _pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def _chunks(pieces: list[tuple], limit: int) -> list[list[tuple]]:
  """(block, sites, patch indices, masks) pieces, in block order, as calls [[(block, sites, indices, masks,
  rows)]] of at most ``limit`` patches, each piece's indices padded to ``rows`` (a power of two). Where the
  blocks are distinct and ``limit`` allows, every call holds an equal part of each block's patches, padded
  alike, so that the calls share one compiled program (how the patches are split leaves their cost
  unchanged: a patch of block l costs blocks l… in any call).
  Otherwise the pieces are packed in turn, each block at most once per call, a piece larger than ``limit``
  split."""
  sizes = [len(index) for _, _, index, _ in pieces]
  if len({first for first, *_ in pieces}) == len(pieces) and len(pieces) <= limit:
    parts = next(n for n in range(1, max(sizes) + 1) if sum(_pow2(-(-k // n)) for k in sizes) <= limit)
    steps = [-(-k // parts) for k in sizes]
    return [[(first, sites, index[i * step:(i + 1) * step], {s: m[i * step:(i + 1) * step] for s, m in masks.items()},
              _pow2(step)) for (first, sites, index, masks), step in zip(pieces, steps)] for i in range(parts)]
  out, current, size = [], [], 0
  for first, sites, index, masks in pieces:
    for at in range(0, len(index), limit):
      rows = _pow2(len(index[at:at + limit]))
      part = (first, sites, index[at:at + limit], {s: m[at:at + limit] for s, m in masks.items()}, rows)
      if current and (size + rows > limit or current[-1][0] >= first):
        out.append(current)
        current, size = [], 0
      current.append(part)
      size += rows
  return out + ([current] if current else [])


def _jobs(model: Transformer, groups: list[dict[str, np.ndarray]], differs: np.ndarray, width: int
          ) -> tuple[dict, int]:
  """The patches of ``groups`` by the program that runs them: {(roles, start), or ((block, sites), start) for
  blocks of two kinds: [(block, sites, patch indices, masks)]}, and the number of patches. Each patch's
  start is the latest multiple of ``width`` not after the first position it changes; a patch that changes
  nothing is in none (its logits are the corrupt run's)."""
  time = differs.shape[0]
  jobs: dict = {}
  offset = 0
  for g in groups:
    sites, n = tuple(g), len(next(iter(g.values())))
    first = min(_first_block(model, s) for s in sites)
    changes = _first_changes(model, g, differs)
    whole = any(_time_axis(model, s) is None for s in sites)  # [heads, batch·time, ff]: from position 0 only
    starts = np.where(changes >= time, -1, 0 if whole else (changes // width) * width)
    roles = _both_streams(model, _roles(model, sites, first))
    for start in sorted(set(starts.tolist()) - {-1}):
      index = np.flatnonzero(starts == start)
      jobs.setdefault((roles or (first, sites), start), []).append(
          (first, sites, offset + index, {s: m[index] for s, m in g.items()}))
    offset += n
  return jobs, offset


def _assemble(results: list[tuple], patches: int, corrupt_logits: np.ndarray) -> np.ndarray:
  """Every patch's logits ``[patches, batch, time, vocab]`` from the programs' ``results`` [(logits, [(patch
  indices, rows)], start)]: the corrupt run's before a patch's start and for a patch not run, NaN from its
  start to a metric's first position where the program left them out."""
  time = corrupt_logits.shape[1]
  out = np.empty((patches, *corrupt_logits.shape), np.float32)
  done = np.zeros(patches, bool)
  for logits, placed, start in results:
    logits, at = np.asarray(logits), 0
    begin = time - logits.shape[2]  # the start, or a metric's first position after it
    for index, rows in placed:
      out[index, :, :start] = corrupt_logits[:, :start]
      out[index, :, start:begin] = np.nan
      out[index, :, begin:] = logits[at:at + len(index)]
      done[index] = True
      at += rows
  out[~done] = corrupt_logits
  return out


def run(model: Transformer, params, clean, corrupt, key_mask, groups: list[dict[str, np.ndarray]],
        limit: int | None = None, read_from: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(clean logits, corrupt logits, every patch's logits ``[patches, batch, time, vocab]`` in the order of
  ``groups``): ``model`` an analysis model that ``applies``; each group {site: ``[patches, ...]`` masks}, a
  block's patches; ``limit`` patches per call (default: ``CHUNK_TOKENS`` tokens computed). ``read_from``: the patches'
  logits are wanted from that position on only (a metric's positions); before it they are NaN where a patch
  ran."""
  params = core.unboxed(params)
  time = clean.shape[1]
  width = -(-time // BUCKETS)
  km = None if key_mask is None else np.asarray(key_mask, bool)
  every = tuple(dict.fromkeys(s for g in groups for s in g))
  firsts = tuple(sorted({min(_first_block(model, s) for s in g) for g in groups}))
  cache_args = (params, np.asarray(clean, np.int32), np.asarray(corrupt, np.int32), km)
  differs = (clean != corrupt).any(0)
  cache_key = ('cache', model, every, firsts, read_from, engine.signature(cache_args))
  cache_program = _cache(model, every, firsts, read_from)
  jobs, offset = _jobs(model, groups, differs, width)

  def plan(cache) -> list[tuple]:
    """(executable key, jitted program, arguments, [(patch indices, rows)], start) per call, its arguments
    parts of ``cache``: the cache program's outputs, or their shapes alone to compile."""
    calls = []
    for (what, start), pieces in jobs.items():
      rows_limit = limit or max(1, CHUNK_TOKENS // (clean.shape[0] * (time - start)))
      for chunk in _chunks(sorted(pieces, key=lambda piece: piece[0]), rows_limit):
        placed = [(index, rows) for _, _, index, _, rows in chunk]
        padded = [{s: np.concatenate([m, np.zeros((rows - len(m), *m.shape[1:]), bool)])
                   for s, m in masks.items()} for _, _, _, masks, rows in chunk]
        if isinstance(what[0], int):   # blocks of two kinds: an unrolled program per block
          (first, sites, _, _, _), = chunk
          program, args = _patches(model, sites, first, start), (params, cache, km, padded[0])
          key = ('patches', model, sites, first, start, engine.signature(args))
        else:
          order = tuple((first, rows) for (first, *_), (_, rows) in zip(chunk, placed))
          roles = [dict(zip(_roles(model, sites, first), sites)) for first, sites, *_ in chunk]
          values = {first: {r: cache[2][rs.get(r) or next(iter(rs.values()))] for r in what}
                    for (first, *_), rs in zip(chunk, roles)}
          masks = {first: {r: m[rs[r]] if r in rs else np.zeros_like(next(iter(m.values()))) for r in what}
                   for (first, *_), rs, m in zip(chunk, roles, padded)}
          states = {first: cache[4][first] for first, *_ in chunk}
          # The split last block slices positions: a site without a position axis is patched whole instead.
          reads = (read_from if read_from is not None and read_from > start
                   and all(_role_axis(model, r) is not None for r in what) else None)
          program, args = _wave(model, what, start, order, reads), (params, cache[3], states, values, km, masks)
          key = ('wave', model, what, start, order, reads, engine.signature(args))
        calls.append((key, program, args, placed, start))
    return calls

  # The first sweep on these shapes compiles the cache program and the patches' programs together (the latter
  # from the cache's output shapes): on as many cores as there are, rather than one after the other.
  if not engine.has_executable(cache_key):
    shapes = jax.eval_shape(cache_program, *cache_args)
    engine.compile_all([(cache_key, cache_program, cache_args)] + [c[:3] for c in plan(shapes)])
  cache = engine.executable(cache_key, cache_program, cache_args)(*cache_args)  # the patches queue behind it
  calls = plan(cache)
  engine.compile_all([c[:3] for c in calls])
  results = [(engine.executable(key, program, args)(*args), placed, start)  # dispatched, read below
             for key, program, args, placed, start in calls]
  clean_logits, corrupt_logits = np.asarray(cache[0]), np.asarray(cache[1])
  return clean_logits, corrupt_logits, _assemble(results, offset, corrupt_logits)

