"""Patching programs that recompute only what a patch can change.

In a causal model, a patch at block l and position p leaves every block before l and every position before p
as they were in the corrupt run. So a patch is computed by ``symjax.model.Suffix``: blocks l… over positions
s… (s ≤ p), their attention reading the corrupt run's keys and values of the positions before s. Positions
before the first one where a patch changes a value (clean ≠ corrupt there: the tokens the prompts share)
change nothing either, so the start s is chosen when the program runs, from the values: a patch that changes
nothing is not computed at all, and its logits are the corrupt run's.

One program (``_cache``) runs the clean and corrupt prompts once and keeps what the patches read: the sites'
clean and corrupt values, every block's corrupt keys and values, the corrupt state entering each block. Then
each block's patches run vmapped, a bucket of positions per call, with ``lax.switch`` over the starts their
positions allow (multiples of ``time / BUCKETS``) and the branch that computes nothing. Where the blocks are
of one kind, one program per site and bucket serves every block (``_shared``: the blocks in a loop,
the patched block an argument), so that a sweep compiles a few programs, not one per block and bucket.
Each program compiles once per sites and shapes, and the next sweep of the same sites reuses it.
"""

from __future__ import annotations

import concurrent.futures
import os

import jax
import jax.numpy as jnp
import numpy as np

from symjax.interpret import core, hooks
from symjax.model import FactoredBlock, StandardBlock, Suffix, Transformer
from symjax.model import intermediates as names
from symjax.model.masks import head_mask_matrix

BUCKETS = 4          # starts per input: more recompute less, but compile more programs and branches
CHUNK_TOKENS = 4096  # patch tokens per vmapped call (patches × batch × time): bounds a program's memory
_STATE_SITES = ('resid', 'x_t', 'x_e')


def applies(model: Transformer, time: int) -> bool:
  """Whether every position of the model reads only the positions up to its own (every head's mask below
  the diagonal), without relational edges: then a suffix is recomputed alone."""
  cfg = model.config
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


_PROGRAMS: dict = {}


def _cache(model: Transformer, sites: tuple[str, ...], firsts: tuple[int, ...]):
  """The clean and corrupt runs as one batch: (clean logits, corrupt logits, {site: (clean, corrupt)},
  {block: corrupt (keys, values)}, {first: corrupt state entering it: x, or (x_t, x_e)})."""
  key = ('cache', model, sites, firsts)
  if key not in _PROGRAMS:
    cfg = model.config
    kv = [f'blocks.{l}.attn.{s}' for l in range(cfg.num_layers) for s in ('k', 'values')]
    kept = tuple(dict.fromkeys((*sites, *kv, *(s for f in firsts for s in _entering(model, f)))))

    def run(params, clean, corrupt, key_mask):
      seen, b = {}, clean.shape[0]
      fns = {s: (lambda v, name, s=s: (seen.setdefault(s, v), v)[1]) for s in kept}
      km = None if key_mask is None else jnp.concatenate([key_mask, key_mask])
      logits = hooks.hooked_logits(model, params, jnp.concatenate([clean, corrupt]), km, fns)
      # Clean rows first; a site with no position axis ([heads, batch·time, ff]) has them in its first half.
      split = {s: (v[:, :v.shape[1] // 2], v[:, v.shape[1] // 2:]) if _time_axis(model, s) is None
               else (v[:b], v[b:]) for s, v in seen.items()}
      corrupt_of = lambda s: split[s][1]
      states = {}
      for f in firsts:
        entering = [corrupt_of(s) for s in _entering(model, f)]
        if cfg.kind == 'standard':
          states[f] = entering[0]
        else:  # X_e⁰ = 0 before block 0
          states[f] = tuple(entering) if f else (entering[0], jnp.zeros_like(entering[0]))
      kv_of = {l: (corrupt_of(f'blocks.{l}.attn.k'), corrupt_of(f'blocks.{l}.attn.values'))
               for l in range(cfg.num_layers)}
      return logits[:b], logits[b:], {s: split[s] for s in sites}, kv_of, states
    _PROGRAMS[key] = jax.jit(run)
  return _PROGRAMS[key]


def _slice(model, site: str, x, start: int):
  """``x`` (a site's value or a patch mask broadcast to it) from position ``start`` on."""
  return _from(_time_axis(model, site), x, start)


def _from(axis: int | None, x, start: int):
  """``x`` from index ``start`` of ``axis`` on (whole where it has no such axis or broadcasts along it)."""
  if axis is None or not start or x.shape[axis] == 1:
    return x
  return jax.lax.slice_in_dim(x, start, x.shape[axis], axis=axis)


def _patches(model: Transformer, sites: tuple[str, ...], first: int, starts: tuple[int, ...]):
  """The logits ``[patches, batch, time, vocab]`` of a bucket's patches (their masks {site: ``[patches,
  ...]``}), recomputed from block ``first`` and from the latest of ``starts`` not after the first position
  they change; the corrupt logits where they change nothing."""
  key = ('patches', model, sites, first, starts)
  if key not in _PROGRAMS:
    entering = _entering(model, first)

    def from_start(start, params, cache, key_mask, masks):
      _, corrupt_logits, values, kv, states = cache
      prefix = {l: (k[:, :start], v[:, :start]) for l, (k, v) in kv.items() if l >= first}
      state = jax.tree.map(lambda x: x[:, start:], states[first])

      def one(mask):
        def patch(s, v, name=None):
          return jnp.where(_slice(model, s, mask[s], start), _slice(model, s, values[s][0], start).astype(v.dtype), v)
        x = state
        for s in (s for s in entering if s in mask):  # the state entering block ``first``, patched before it
          if isinstance(x, tuple):
            x = (patch(s, x[0]), x[1]) if not s.endswith('.x_e') else (x[0], patch(s, x[1]))
          else:
            x = patch(s, x)
        fns = {s: (lambda v, name, s=s: patch(s, v)) for s in mask if s not in entering}
        with names.session(fns, lambda name: False):
          logits = Suffix(model.config, first).apply({'params': params}, x, prefix, key_mask)
        return jnp.concatenate([corrupt_logits[:, :start], logits], axis=1)
      return jax.vmap(one)(masks)

    def run(params, cache, key_mask, masks):
      corrupt_logits, values = cache[1], cache[2]
      rows, time = next(iter(masks.values())).shape[0], corrupt_logits.shape[1]
      changed = _changed(lambda s: _time_axis(model, s), values, masks, time)
      index = _branch(changed, starts)
      branches = [lambda ops, s=s: from_start(s, *ops) for s in starts]
      branches.append(lambda ops: jnp.broadcast_to(corrupt_logits, (rows, *corrupt_logits.shape)))
      return jax.lax.switch(index, branches, (params, cache, key_mask, masks))
    _PROGRAMS[key] = jax.jit(run)
  return _PROGRAMS[key]


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


def _both_streams(model, first: int, state, values: dict, masks: dict) -> tuple[dict, dict]:
  """A two-stream patch of the state entering a block names both streams (the one it leaves gets an all-False
  mask), in one order: the embedding (X_t alone, X_e⁰ = 0) then patches as the later blocks' states do, in
  the same program."""
  if model.config.kind == 'standard' or not any(r.startswith('in:') for r in masks):
    return values, masks
  values, masks = dict(values), dict(masks)
  like = next(m for r, m in masks.items() if r.startswith('in:'))
  for i, stream in enumerate(state):
    role = f'in:{i}'
    if role not in masks:
      values[role] = (stream, stream)
      masks[role] = jnp.zeros_like(like)
  order = sorted(masks, key=lambda r: (not r.startswith('in:'), r))
  return {r: values[r] for r in order}, {r: masks[r] for r in order}


def _role_axis(model, role: str):
  return 1 if role.startswith('in:') else _time_axis(model, 'blocks.0.' + role)


def _shared(model: Transformer, roles: tuple[str, ...], starts: tuple[int, ...]):
  """``_patches`` for the patches of any one block: blocks ``first``… (``first`` an argument, not a constant)
  run in a ``lax.fori_loop`` over their stacked parameters, the first of them patched, so that one program,
  compiled once, serves every block of a sweep."""
  key = ('shared', model, roles, starts)
  if key not in _PROGRAMS:
    cfg = model.config
    layers = cfg.num_layers
    block = (StandardBlock(cfg) if cfg.kind == 'standard' else
             FactoredBlock(cfg, symbolic=cfg.layer_kinds()[0] == 'symbolic'))
    inside = [r for r in roles if not r.startswith('in:')]

    def from_start(start, params, corrupt_logits, kv, state_in, values, key_mask, masks, first):
      stacked = jax.tree.map(lambda *x: jnp.stack(x), *[params[f'layer_{l}'] for l in range(layers)])
      keys, vals = (jnp.stack([kv[l][i][:, :start] for l in range(layers)]) for i in (0, 1))
      table = params['embed']['embedding']
      state = jax.tree.map(lambda x: x[:, start:], state_in)

      def one(mask):
        def patch(role, v, on=True):
          axis = _role_axis(model, role)
          return jnp.where(_from(axis, mask[role], start) & on, _from(axis, values[role][0], start).astype(v.dtype),
                           v)
        x = state
        for r in roles:
          if r.startswith('in:'):
            i = int(r[3:])
            x = patch(r, x) if not isinstance(x, tuple) else tuple(patch(r, y) if j == i else y
                                                                     for j, y in enumerate(x))

        def body(l, x):
          p, k, v = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, l, keepdims=False), (stacked, keys, vals))
          fns = {r: (lambda val, name, r=r: patch(r, val, l == first)) for r in inside}
          with names.session(fns, lambda name: False):
            if cfg.kind == 'standard':
              return block.apply({'params': p}, x, key_mask, True, None, (k, v))
            return block.apply({'params': p}, *x, table, key_mask, True, None, (k, v))
        x = jax.lax.fori_loop(first, layers, body, x)
        logits = Suffix(cfg, layers).apply({'params': params}, x, {}, key_mask)
        return jnp.concatenate([corrupt_logits[:, :start], logits], axis=1)
      return jax.vmap(one)(masks)

    def run(params, corrupt_logits, kv, state_in, values, key_mask, masks, first):
      rows = next(iter(masks.values())).shape[0]
      index = _branch(_changed(lambda r: _role_axis(model, r), values, masks, corrupt_logits.shape[1]), starts)
      branches = [lambda ops, s=s: from_start(s, *ops) for s in starts]
      branches.append(lambda ops: jnp.broadcast_to(corrupt_logits, (rows, *corrupt_logits.shape)))
      return jax.lax.switch(index, branches, (params, corrupt_logits, kv, state_in, values, key_mask, masks, first))
    _PROGRAMS[key] = jax.jit(run)
  return _PROGRAMS[key]


def _branch(changed: jax.Array, starts: tuple[int, ...]) -> jax.Array:
  """The index of the latest of ``starts`` not after the first position a patch changes; ``len(starts)``
  (the branch that computes nothing) where it changes none."""
  time = changed.shape[0]
  at = jnp.where(changed.any(), jnp.argmax(changed), time)
  return jnp.where(at >= time, len(starts), jnp.maximum(jnp.sum(jnp.asarray(starts) <= at) - 1, 0))


def _changed(time_axis, values, masks, time: int) -> jax.Array:
  """``[time]``: where some patch of ``masks`` takes a clean value that differs from the corrupt one (a site
  with no position axis counts at position 0: its patches start there). ``time_axis(key)``: the time axis
  of ``values[key]``."""
  out = jnp.zeros(time, bool)
  for s, m in masks.items():
    clean, corrupt = values[s]
    differs = m.any(0) & (clean != corrupt)
    axis = time_axis(s)
    if axis is None:
      out = out.at[0].set(out[0] | differs.any())
    else:
      out = out | differs.any(axis=tuple(a for a in range(differs.ndim) if a != axis))
  return out


_EXECUTABLES: dict = {}


def _signature(args) -> tuple:
  """What a compiled program is specialised to: the arguments' tree, shapes and dtypes."""
  leaves, tree = jax.tree.flatten(args)
  return tree, tuple((tuple(np.shape(x)), str(x.dtype)) for x in leaves)


def _compile_all(todo: list[tuple]) -> None:
  """Compiles ``todo`` [(key, jitted program, args)] on as many threads as the machine has cores (XLA
  compiles outside Python's lock)."""
  todo = list({key: (key, p, args) for key, p, args in todo if key not in _EXECUTABLES}.values())
  if not todo:
    return
  with concurrent.futures.ThreadPoolExecutor(max(1, min(len(todo), os.cpu_count() or 1))) as pool:
    for (key, _, _), compiled in zip(todo, pool.map(lambda j: j[1].lower(*j[2]).compile(), todo)):
      _EXECUTABLES[key] = compiled


def _spans(model, masks: dict[str, np.ndarray], time: int) -> tuple[np.ndarray, np.ndarray]:
  """Each patch's first and last patched position (every position where a mask does not name one)."""
  n = len(next(iter(masks.values())))
  lo, hi = np.full(n, time), np.full(n, -1)
  for s, m in masks.items():
    axis = _time_axis(model, s)
    if axis is None or m.shape[1 + axis] == 1:
      at = np.broadcast_to(m.reshape(n, -1).any(1)[:, None], (n, time))
    else:
      at = m.any(axis=tuple(a for a in range(1, m.ndim) if a != 1 + axis))
    lo = np.where(at.any(1), np.minimum(lo, np.argmax(at, 1)), lo)
    hi = np.where(at.any(1), np.maximum(hi, time - 1 - np.argmax(at[:, ::-1], 1)), hi)
  empty = lo > hi  # patches nothing: any bucket serves
  return np.where(empty, time - 1, lo), np.where(empty, time - 1, hi)


def run(model: Transformer, params, clean, corrupt, key_mask, groups: list[dict[str, np.ndarray]],
        limit: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(clean logits, corrupt logits, every patch's logits ``[patches, batch, time, vocab]`` in the order of
  ``groups``): ``model`` an analysis model that ``applies``; each group {site: ``[patches, ...]`` masks}, a
  block's patches; ``limit`` patches per call (default: ``CHUNK_TOKENS`` tokens)."""
  params = core.unboxed(params)
  time = clean.shape[1]
  width = -(-time // BUCKETS)
  starts = tuple(range(0, time, width))
  km = None if key_mask is None else jnp.asarray(key_mask)
  jobs = []   # (sites, first block, starts, patch indices, masks)
  offset = 0
  for g in groups:
    sites = tuple(g)
    first = min(_first_block(model, s) for s in sites)
    lo, hi = (x // width for x in _spans(model, g, time))
    whole = any(_time_axis(model, s) is None for s in sites)  # [heads, batch·time, ff]: from position 0 only
    for a, b in sorted(set(zip(lo.tolist(), hi.tolist()))):
      index = np.flatnonzero((lo == a) & (hi == b))
      jobs.append((sites, first, starts[:1] if whole else starts[a:b + 1], offset + index,
                   {s: m[index] for s, m in g.items()}))
    offset += len(lo)
  every = tuple(dict.fromkeys(s for g in groups for s in g))
  firsts = tuple(sorted({j[1] for j in jobs}))
  cache_args = (params, jnp.asarray(clean), jnp.asarray(corrupt), km)
  cache_key = ('cache', model, every, firsts, _signature(cache_args))
  _compile_all([(cache_key, _cache(model, every, firsts), cache_args)])
  cache = _EXECUTABLES[cache_key](*cache_args)
  base = (cache_key, _signature(cache))  # the patch programs' arguments but the masks
  rows_limit = limit or max(1, CHUNK_TOKENS // clean.size)
  calls = []
  for sites, first, job_starts, index, masks in jobs:
    rows = min(rows_limit, 1 << max(0, (len(index) - 1).bit_length()))
    total = -(-len(index) // rows) * rows
    padded = {s: np.concatenate([m, np.zeros((total - len(index), *m.shape[1:]), bool)]) for s, m in masks.items()}
    roles = _roles(model, sites, first)
    for at in range(0, total, rows):
      chunk = [jnp.asarray(m[at:at + rows]) for m in padded.values()]
      shapes = tuple(m.shape for m in chunk)
      if roles is None:
        program, args = _patches(model, sites, first, job_starts), (params, cache, km, dict(zip(sites, chunk)))
        key = ('patches', model, sites, first, job_starts, base, shapes)
      else:
        values, masks = _both_streams(model, first, cache[4][first], {r: cache[2][s] for r, s in zip(roles, sites)},
                                      dict(zip(roles, chunk)))
        program = _shared(model, tuple(masks), job_starts)
        args = (params, cache[1], cache[3], cache[4][first], values, km, masks, jnp.int32(first))
        key = ('shared', model, tuple(masks), job_starts, base, tuple(m.shape for m in masks.values()))
      calls.append((key, program, args, index[at:at + rows]))
  _compile_all([c[:3] for c in calls])
  out = np.empty((offset, *cache[1].shape), np.float32)
  results = [(_EXECUTABLES[key](*args), index) for key, _, args, index in calls]  # dispatched, then read
  for logits, index in results:
    out[index] = np.asarray(logits)[:len(index)]
  return np.asarray(cache[0]), np.asarray(cache[1]), out
