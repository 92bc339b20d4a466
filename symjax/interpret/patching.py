"""Activation patching: run a corrupted prompt with one site taken from a clean run, and sweeps of it over
layers × heads and layers × positions, as TransformerLens researchers do it.

  recovered = patching.sweep_heads(model, params, clean, corrupt)      # [layers, heads]
  recovered.figure()                                                   # a heatmap

The default metric is the fraction of the logit difference recovered at the last (real) position:
(m(patched) − m(corrupt)) / (m(clean) − m(corrupt)), with m the logit of the clean prediction minus the logit
of the corrupt one (or of ``answer`` minus ``wrong`` when given), averaged over the batch's prompt pairs.
Any function of the logits can replace it. Prompts of unequal length are padded to one length and patched
with ``key_mask`` (False at the padding).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from symjax.interpret import core, engine, hooks, suffix
from symjax.model import Transformer
from symjax.system.errors import InputError

axes, _PER_HEAD, _HEAD_FIRST = hooks.axes, hooks.PER_HEAD, hooks.HEAD_FIRST


def _selector(name: str, time_axis: int | None, head_axis: int | None, shape, positions, heads):
  index: list = [slice(None)] * len(shape)
  if positions is not None:
    if time_axis is None:
      raise InputError(f'{name} has no position axis to patch; patch it whole (positions=None)')
    positions = np.atleast_1d(np.asarray(positions))
    t = shape[time_axis]
    if np.any((positions < -t) | (positions >= t)):
      raise InputError(f'positions {positions.tolist()} are outside the input of {t} tokens (allowed: {-t}..{t - 1})')
    index[time_axis] = positions % t
  if heads is not None:
    if head_axis is None:
      raise InputError(f'{name} has no head axis; heads= applies to {list(_PER_HEAD + _HEAD_FIRST)}')
    heads = np.atleast_1d(np.asarray(heads))
    h = shape[head_axis]
    if np.any((heads < 0) | (heads >= h)):
      raise InputError(f'heads {heads.tolist()} are out of range: the model has heads 0..{h - 1}')
    index[head_axis] = heads
  if positions is not None and heads is not None:  # two index arrays would be paired: broadcast to the product
    p, h = index[time_axis], index[head_axis]
    if time_axis < head_axis:
      index[time_axis], index[head_axis] = p[:, None], h[None, :]
    else:
      index[head_axis], index[time_axis] = h[:, None], p[None, :]
  return tuple(index)


def _pair(model: Transformer, clean, corrupt, key_mask=None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
  clean = core.as_batch(clean, model.config.vocab_size)
  corrupt = core.as_batch(corrupt, model.config.vocab_size)
  if clean.shape != corrupt.shape:
    raise InputError(f'clean and corrupt prompts must have the same shape to patch position by position: '
                     f'{clean.shape} vs {corrupt.shape} (pad them to one length and pass key_mask= with False at '
                     f'the padding)')
  if key_mask is not None:
    key_mask = np.asarray(key_mask, bool)
    if key_mask.shape != clean.shape:
      raise InputError(f'key_mask must have the prompts\' shape {clean.shape} (True at real tokens), got '
                       f'{key_mask.shape}')
  return clean, corrupt, key_mask


# A causal model's patches run in ``suffix``'s programs, which recompute only the blocks and positions a patch can
# change. Otherwise: one compiled program per (model, sites, patches per call): it runs the clean and the corrupt
# prompt, then the corrupt one once per patch, vmapped over the patches, with each site's clean value taken from the
# clean pass of the same program. Where a patch changes nothing (positions before the corrupted token) its logits
# are the corrupt run's, so the recovered fraction is 0 there. Only what follows the first patched site is batched
# over the patches (vmap leaves the rest unbatched), so a sweep over block l's sites recomputes blocks l… alone:
# large sweeps run one program per block for that reason; a small one runs all its blocks in one program and one
# call, the clean and corrupt runs shared and each block's patches vmapped apart. jax.jit retraces for new shapes
# only, and the next sweep of the same sites reuses the program.
CHUNK_TOKENS = suffix.CHUNK_TOKENS  # tokens per vmapped call (patches × batch × time): bounds a program's memory


def _program(model: Transformer, sites: tuple[str, ...]):
  def build():
    def run(params, tokens, key_mask, fns):
      return hooks.hooked_logits(model, params, tokens, key_mask, fns)

    def passes(params, clean, corrupt, key_mask, masks):
      # The clean and corrupt runs as one batch (one copy of the model in the program, not two), then the
      # patches, each taking its sites from the clean half.
      values, b = {}, clean.shape[0]
      # The clean half: the first b rows, or the first half of [heads, batch·time, ...] (a symbolic channel FFN's
      # hidden units).
      half = {s: (lambda v: v[:, :v.shape[1] // 2]) if axes(model, s)[0] is None else (lambda v: v[:b])
              for s in sites}
      keep = {s: (lambda v, name, s=s: (values.setdefault(s, half[s](v)), v)[1]) for s in sites}
      both = run(params, jnp.concatenate([clean, corrupt]), None if key_mask is None else
                 jnp.concatenate([key_mask, key_mask]), keep)

      def patched(mask):
        take = {s: (lambda v, name, s=s: jnp.where(mask[s], values[s].astype(v.dtype), v)) for s in mask}
        return run(params, corrupt, key_mask, take)
      # A tuple of groups (a small sweep's blocks): each vmapped apart, so each recomputes only the blocks
      # from its own on, and the clean and corrupt runs are shared by all.
      groups = masks if isinstance(masks, tuple) else (masks,)
      return both[:b], both[b:], jnp.concatenate([jax.vmap(patched)(g) for g in groups])
    return passes
  return engine.compiled(('patch', model, sites), build)


def _executable(model, sites, args):
  """The program of ``sites`` compiled for ``args``; a sweep compiles those of its blocks together first
  (``engine.compile_all``)."""
  return engine.executable(('patch', model, sites, engine.signature(args)), _program(model, sites), args)


def _compile_all(jobs: list[tuple]) -> None:
  engine.compile_all([(('patch', m, sites, engine.signature(args)), _program(m, sites), args)
                      for m, sites, args in jobs])


@dataclasses.dataclass
class _Patched:
  """One program's passes: the clean and corrupt runs' logits ``[batch, time, vocab]`` and the patches'
  ``[patches, batch, time, vocab]``."""
  clean: np.ndarray
  corrupt: np.ndarray
  patched: np.ndarray


def _rows(count: int, limit: int) -> int:
  """Patches per call: a power of two up to ``limit``, so that few shapes are compiled."""
  return min(limit, 1 << max(0, (count - 1).bit_length()))


def _run(model: Transformer, params, clean, corrupt, key_mask, masks: dict[str, np.ndarray],
         chunk: int | None = None) -> _Patched:
  """``masks`` {site: ``[patches, ...]`` booleans broadcast to the site's value}: patch i takes each site from
  the clean run where its mask is True: in ``suffix``'s programs for a causal model, else in ``_program``."""
  _patch_count(masks)
  analysis = core.analysis_model(model)
  if suffix.applies(analysis, clean.shape[1]):
    return _Patched(*suffix.run(analysis, params, clean, corrupt, key_mask, [masks], chunk))
  return _whole(analysis, params, clean, corrupt, key_mask, masks, chunk)


def _whole(analysis: Transformer, params, clean, corrupt, key_mask, masks: dict[str, np.ndarray],
           chunk: int | None = None) -> _Patched:
  """The patches of ``masks`` in ``_program``: the clean and corrupt runs and every patched run of the whole
  model in one program, vmapped over the patches in calls of ``chunk`` patches."""
  count, calls = _calls(params, clean, corrupt, key_mask, masks, chunk)
  out = []
  for args in calls:
    clean_logits, corrupt_logits, logits = _executable(analysis, tuple(masks), args)(*args)
    out.append(np.asarray(logits))
  return _Patched(np.asarray(clean_logits), np.asarray(corrupt_logits), np.concatenate(out)[:count])


def _patch_count(masks: dict[str, np.ndarray]) -> int:
  count = {len(m) for m in masks.values()}
  if len(count) != 1:
    raise InputError(f'every site needs one mask per patch; got {sorted(count)} masks')
  return count.pop()


def _calls(params, clean, corrupt, key_mask, masks, chunk=None) -> tuple[int, list[tuple]]:
  """(patches, the arguments of each call of the program): the patches padded to whole calls of a power of
  two rows each."""
  count = _patch_count(masks)
  params = core.unboxed(params)
  km = None if key_mask is None else jnp.asarray(key_mask)
  rows = _rows(count, chunk or max(1, CHUNK_TOKENS // clean.size))
  total = -(-count // rows) * rows
  padded = {s: np.concatenate([m, np.zeros((total - count, *m.shape[1:]), bool)]) for s, m in masks.items()}
  tokens = jnp.asarray(clean), jnp.asarray(corrupt)
  return count, [(params, *tokens, km, {s: jnp.asarray(m[start:start + rows]) for s, m in padded.items()})
                 for start in range(0, total, rows)]


def _run_groups(model: Transformer, params, clean, corrupt, key_mask, groups: list[dict[str, np.ndarray]]
                ) -> _Patched:
  """A small sweep's groups (one per block) in one call of one program: the clean and corrupt runs once,
  each group's patches vmapped apart (``_program``)."""
  sites = tuple(dict.fromkeys(s for g in groups for s in g))
  km = None if key_mask is None else jnp.asarray(key_mask)
  args = (core.unboxed(params), jnp.asarray(clean), jnp.asarray(corrupt), km,
          tuple({s: jnp.asarray(m) for s, m in g.items()} for g in groups))
  clean_logits, corrupt_logits, logits = _executable(core.analysis_model(model), sites, args)(*args)
  return _Patched(np.asarray(clean_logits), np.asarray(corrupt_logits), np.asarray(logits))


def _shape(model: Transformer, info: tuple[int | None, int | None, int], time: int) -> tuple[int, ...]:
  """A mask's shape for a site of ``info`` (``hooks.site_axes``: time axis, head axis, rank): the positions and
  heads at their axes, every other axis 1, to broadcast against the site's value."""
  time_axis, head_axis, rank = info
  shape = [1] * rank
  for axis, size in ((time_axis, time), (head_axis, model.config.num_heads)):
    if axis is not None:
      shape[axis] = size
  return tuple(shape)


def _masks(model: Transformer, axes_of: dict, time: int, positions, heads) -> dict[str, np.ndarray]:
  """One patch's masks ``[1, ...]`` (``axes_of``: ``hooks.site_axes``): True at ``positions`` and ``heads``
  (default: all of them)."""
  out = {}
  for s, info in axes_of.items():
    m = np.zeros(_shape(model, info, time), bool)
    m[_selector(s, info[0], info[1], m.shape, positions, heads)] = True
    out[s] = m[None]
  return out


def _every_block(model: Transformer, masks: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """``masks`` with the same site of every block, unpatched (a mask of False) where none was asked: one program
  then serves a loop over the blocks, as it serves a loop over heads or positions, rather than one per block.
  A False mask keeps the corrupt value exactly."""
  out = {}
  for s, m in masks.items():
    if not s.startswith('blocks.'):
      out[s] = m
      continue
    local = s.split('.', 2)[2]
    for l in range(model.config.num_layers):
      other = f'blocks.{l}.{local}'
      out[other] = masks.get(other, out.get(other, np.zeros_like(m)))
  return out


@core.takes_hooked_model
def patch(model: Transformer, params, clean, corrupt, name: str | Sequence[str], positions=None, heads=None,
          metric: Callable[[np.ndarray], float] | None = None, key_mask=None):
  """``metric`` of the logits of ``corrupt`` run with ``name`` (one site or several) taken from ``clean`` at
  ``positions`` and ``heads`` (default: all of them); the logits themselves without a metric. Every prompt
  pair of the batch is patched. ``key_mask`` ``[batch, time]`` (False at padding) runs both prompts with
  their padding masked, so that prompts of unequal length patch as padded to one length. One compiled program
  runs the clean, the corrupt and the patched pass (``_program``), once per sites and shapes: a loop over the
  heads or positions of a site compiles once, and its values equal the sweep's."""
  clean, corrupt, key_mask = _pair(model, clean, corrupt, key_mask)
  analysis = core.analysis_model(model)
  axes_of = hooks.site_axes(analysis, [name] if isinstance(name, str) else list(name))
  masks = _every_block(analysis, _masks(analysis, axes_of, clean.shape[1], positions, heads))
  logits = _whole(analysis, params, clean, corrupt, key_mask, masks).patched[0]
  return logits if metric is None else metric(logits)


@core.takes_hooked_model
def patch_many(model: Transformer, params, clean, corrupt, masks: dict[str, np.ndarray], key_mask=None,
               chunk: int | None = None) -> np.ndarray:
  """The logits ``[patches, batch, time, vocab]`` of ``corrupt`` with, in patch i, each site s of ``masks``
  taken from ``clean`` where ``masks[s][i]`` (broadcast to the site's shape) is True: every patch in one
  compiled program, vmapped over the patches in calls of ``chunk`` patches (default: as many as keep a call
  within ``CHUNK_TOKENS`` tokens)."""
  clean, corrupt, key_mask = _pair(model, clean, corrupt, key_mask)
  hooks.check_names(model, list(masks), hooking=True)
  return _run(model, params, clean, corrupt, key_mask, {s: np.asarray(m, bool) for s, m in masks.items()},
              chunk).patched


def _one_hot(shape: tuple[int, ...], axis: int, count: int) -> np.ndarray:
  """``[count, *shape]`` masks (every axis but ``axis`` of size 1, to broadcast): mask i is True at index i of
  ``axis``."""
  out = np.zeros((count, *[shape[a] if a == axis else 1 for a in range(len(shape))]), bool)
  index = [np.arange(count)] + [0] * len(shape)
  index[1 + axis] = np.arange(count)
  out[tuple(index)] = True
  return out


REDUCTIONS = ('mean', 'none')


def logit_difference(answer, wrong, position=-1, batch: int | None = None, reduce: str = 'mean'
                     ) -> Callable[[np.ndarray], float | np.ndarray]:
  """logits[answer] − logits[wrong] at ``position``, for every prompt of the batch: ``answer``, ``wrong`` and
  ``position`` are one value or one per batch row (a padded batch's last real positions). ``reduce='mean'``
  averages over the rows, ``'none'`` gives one value per row; ``batch=i`` reads row i alone. The function's
  ``positions`` attribute names the positions it reads: a sweep computes the patches' logits there alone
  (NaN elsewhere), and a metric of one's own may set it too. Its ``each`` attribute scores many patches in
  one call: logits ``[patches, batch, time, vocab]`` -> one value (or row of values) per patch."""
  if reduce not in REDUCTIONS:
    raise InputError(f'reduce must be one of {list(REDUCTIONS)}, got {reduce!r}')

  def each(logits):
    """The metric of every patch at once: logits ``[patches, batch, time, vocab]`` -> ``[patches]`` (or
    ``[patches, batch]``), as the loop over patches gives it (a sweep of 1,024 patches spent a third of its
    time in that loop). JAX arrays stay JAX arrays, so that gradients and jit go through the metric."""
    if not isinstance(logits, jax.Array):
      logits = np.asarray(logits)
    _check_metric_indices(logits.shape, answer, wrong, position, batch)
    rows = np.arange(logits.shape[1])
    at = np.broadcast_to(np.asarray(position), rows.shape)
    values = (logits[:, rows, at, np.broadcast_to(np.asarray(answer), rows.shape)]
              - logits[:, rows, at, np.broadcast_to(np.asarray(wrong), rows.shape)])
    if batch is not None:
      return values[:, batch]
    return values if reduce == 'none' else values.mean(1)

  def metric(logits):
    values = each((logits if isinstance(logits, jax.Array) else np.asarray(logits))[None])[0]
    if isinstance(values, jax.core.Tracer):  # inside jax.grad or jit (site_gradients, attribution_patch)
      return values
    return np.asarray(values) if reduce == 'none' and batch is None else float(values)
  metric.positions = position  # all it reads: a sweep computes the patches' logits there alone
  metric.each = each
  return metric


def _check_metric_indices(shape: tuple[int, ...], answer, wrong, position, batch: int | None) -> None:
  """InputError naming a token, position or row that logits ``[patches, batch, time, vocab]`` lack (NumPy would
  raise an IndexError deep in the sweep, or wrap a negative id around)."""
  _, rows, time, vocab = shape
  for what, ids, low, high in (('answer', answer, 0, vocab), ('wrong', wrong, 0, vocab),
                               ('position', position, -time, time)):
    ids = np.asarray(ids)
    if ids.size and (ids.min() < low or ids.max() >= high):
      raise InputError(f'logit_difference: {what} {ids.tolist()} is out of range; allowed {low}..{high - 1}')
    if ids.ndim and ids.shape != (rows,):
      raise InputError(f'logit_difference: {what} gives {ids.size} values for a batch of {rows} prompts; '
                       f'give one value or one per prompt')
  if batch is not None and not -rows <= batch < rows:
    raise InputError(f'logit_difference: batch={batch} is out of range for a batch of {rows} prompts')


@dataclasses.dataclass
class Sweep:
  """A patching sweep: ``values[i, j]`` the metric with site row i patched at column j; ``metric`` names
  what the values measure."""

  values: np.ndarray
  rows: list[str]
  columns: list[str]
  title: str
  metric: str = 'metric'

  def figure(self, annotate: bool | None = None):
    """A heatmap of ``values`` (matplotlib Figure): its colour scale symmetric about 0 and as wide as the
    values, each cell's value written in it (``annotate``; by default up to 400 cells), the row and column
    labels, and the metric in the title."""
    from matplotlib.figure import Figure
    rows, cols = self.values.shape
    fig = Figure(figsize=(min(24.0, max(4.5, 0.55 * cols + 2.0)), min(16.0, max(3.0, 0.45 * rows + 1.6))))
    ax = fig.add_subplot()
    finite = np.abs(self.values[np.isfinite(self.values)])
    bound = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    image = ax.imshow(self.values, cmap='RdBu', vmin=-bound, vmax=bound, aspect='auto')
    ax.set_xticks(range(cols), self.columns, fontsize=7, rotation=90)
    ax.set_yticks(range(rows), self.rows, fontsize=7)
    if annotate or (annotate is None and rows * cols <= 400):
      for (i, j), v in np.ndenumerate(self.values):
        ax.text(j, i, f'{v:.2f}', ha='center', va='center', fontsize=6,
                color='white' if abs(v) > 0.6 * bound else 'black')
    ax.set_title(f'{self.title}: {self.metric}', fontsize=9)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    return fig


class _Score:
  """A sweep's metric of each patch: the user's function of the logits, or the fraction of the logit
  difference recovered, (m(patched) − m(corrupt)) / (m(clean) − m(corrupt)), with m the logit difference at
  each prompt pair's last real position, averaged over the pairs, and the clean and corrupt runs those of the
  same compiled program as the patches."""

  def __init__(self, metric, answer, wrong, key_mask, shape, vocab_size: int):
    self.metric, self.answer, self.wrong, self.vocab_size = metric, answer, wrong, vocab_size
    rows = np.arange(shape[0])
    self.last = (np.full(rows.shape, shape[1] - 1) if key_mask is None
                 else key_mask.shape[1] - 1 - np.argmax(key_mask[:, ::-1], axis=1))
    self.name = _metric_name(metric) if metric is not None else 'fraction of logit difference recovered'

  def reads_from(self, time: int) -> int | None:
    """The first position the metric reads: the last real positions for the recovered fraction, a metric's
    ``positions`` (``logit_difference``'s) where it names them, else the first its trace reads
    (``metric_reads_from``); None (all of them) where that is position 0."""
    positions = self.last if self.metric is None else getattr(self.metric, 'positions', None)
    if positions is None and self.metric is not None:
      return metric_reads_from(self.metric, (len(self.last), time, self.vocab_size))
    return None if positions is None else int(np.min(np.asarray(positions) % time))

  def __call__(self, run: _Patched) -> np.ndarray:
    if self.metric is not None:
      each = getattr(self.metric, 'each', None)
      return np.asarray(each(run.patched), float) if each else metric_each(self.metric, run.patched)
    rows = np.arange(run.clean.shape[0])
    if self.answer is None or self.wrong is None:
      self.answer = np.argmax(run.clean[rows, self.last], -1)
      self.wrong = np.argmax(run.corrupt[rows, self.last], -1)
      same = np.flatnonzero(self.answer == self.wrong)
      if same.size:
        raise InputError(f'clean and corrupt prompts predict the same token ({int(self.answer[same[0]])}) at the '
                         f'last position of pair {int(same[0])}: give answer= and wrong= tokens, or a metric=')
    diff = logit_difference(self.answer, self.wrong, self.last)
    low, high = diff(run.corrupt), diff(run.clean)
    if abs(high - low) < 1e-9:
      raise InputError('the logit difference is the same on the clean and the corrupt prompt: nothing to recover')
    return (diff.each(run.patched).astype(float) - low) / (high - low)


def metric_each(metric: Callable, logits: np.ndarray) -> np.ndarray:
  """``metric`` of each patch's logits ``[patches, batch, time, vocab]``, vmapped in one compiled program (the
  metric's numbers its arguments, so a new lambda of the same code reuses it); one patch at a time where the
  metric needs concrete values."""
  def make(fns):
    return lambda logits: jax.vmap(fns['metric'])(logits)
  out = engine.hooked(('metric', 'each'), {'metric': metric}, make, (logits,),
                      lambda fns: np.array([fns['metric'](row) for row in logits]))
  out = np.asarray(out, float)
  if out.shape != (len(logits),):
    raise InputError(f'the metric must return one number per patch; it returned shape {out.shape[1:]}')
  return out


_DRAWS = 3  # random logits per test position: a metric that reads a position changes with all three


def metric_reads_from(metric: Callable, shape: tuple[int, int, int]) -> int | None:
  """The first position whose logits ``metric`` (logits ``[batch, time, vocab]`` -> scalar) depends on, found
  from its trace: the metric of random logits is compared with the same logits redrawn before each position
  r, all the r in one compiled call. None where it reads position 0 or cannot be traced: a sweep then computes
  the logits at every position. Remembered per metric (its code and data) and shape."""
  key = engine.fingerprint(metric)
  if key is None:
    return _reads_from(metric, shape)
  return engine.remembered(('metric reads from', key, shape), lambda: _reads_from(metric, shape))


def _reads_from(metric: Callable, shape: tuple[int, int, int]) -> int | None:
  rng = np.random.default_rng(0)
  base = rng.standard_normal(shape).astype(np.float32)
  others = rng.standard_normal((_DRAWS, *shape)).astype(np.float32)

  def make(fns):
    f = fns['metric']

    def run(base, others):
      before = lambda r: (jnp.arange(shape[1]) < r)[None, :, None]
      at = lambda r, other: f(jnp.where(before(r), other, base))
      return f(base), jax.vmap(jax.vmap(at, (None, 0)), (0, None))(jnp.arange(1, shape[1]), others)
    return run
  try:
    ref, redrawn = engine.hooked(('metric', 'reads_from'), {'metric': metric}, make, (base, others), lambda fns: None)
  except Exception:  # noqa: BLE001 (a metric that needs concrete values: the sweep keeps every position)
    return None
  ref, redrawn = np.asarray(ref), np.asarray(redrawn)
  if ref.shape != () or not np.isfinite(ref):
    return None
  same = np.all(redrawn.reshape(len(redrawn), -1) == ref, axis=1)   # [time - 1]: unchanged when redrawn before r
  first = int(np.argmin(same)) if not same.all() else len(same)      # the first r (minus 1) that changed it
  return first or None


def _sweep(model, params, clean, corrupt, groups: list[dict[str, np.ndarray]], score: _Score, key_mask):
  """The score of every patch of ``groups`` (one per block), in order: a program per group when each fills
  calls of its own, else one program and one call for all."""
  analysis = core.analysis_model(model)
  if suffix.applies(analysis, clean.shape[1]):
    return score(_Patched(*suffix.run(analysis, params, clean, corrupt, key_mask, groups,
                                      read_from=score.reads_from(clean.shape[1]))))
  patches = sum(len(next(iter(g.values()))) for g in groups)
  if patches * clean.size <= CHUNK_TOKENS:
    return score(_run_groups(model, params, clean, corrupt, key_mask, groups))
  _compile_all([(analysis, tuple(g), _calls(params, clean, corrupt, key_mask, g)[1][0]) for g in groups])
  return np.concatenate([score(_run(model, params, clean, corrupt, key_mask, g)) for g in groups])


def _one_site_per_patch(model, time: int, sites: list, axis: str) -> list[dict]:
  """One group per site: patch i of site s takes index i of its ``axis`` ('time' or 'head'); a list of sites
  in one entry (a two-stream state) are patched together."""
  groups = []
  for group in sites:
    group = [group] if isinstance(group, str) else group
    masks = {}
    for s, info in hooks.site_axes(model, group).items():
      a = info[0] if axis == 'time' else info[1]
      shape = _shape(model, info, time)
      masks[s] = _one_hot(shape, a, shape[a])
    groups.append(masks)
  return groups


def _heads_by_position(model, time: int, sites: list[str]) -> list[dict]:
  """One group per site: patch (p, h) takes head h at position p."""
  groups = []
  for s, info in hooks.site_axes(model, sites).items():
    time_axis, head_axis, _ = info
    shape = _shape(model, info, time)
    t, h = shape[time_axis], shape[head_axis]
    m = np.zeros((t * h, *shape), bool)
    for p in range(t):
      for k in range(h):
        index = [p * h + k] + [0] * len(shape)
        index[1 + time_axis], index[1 + head_axis] = p, k
        m[tuple(index)] = True
    groups.append({s: m})
  return groups


@core.takes_hooked_model
def sweep_heads(model: Transformer, params, clean, corrupt, site: str = 'attn.z', metric=None, answer=None,
                wrong=None, key_mask=None) -> Sweep:
  """Every head of every block patched from ``clean`` at ``blocks.{l}.{site}`` (all positions), in every
  prompt pair of the batch: values ``[layers, heads]``, all the patches of a block in one compiled program."""
  clean, corrupt, key_mask = _pair(model, clean, corrupt, key_mask)
  cfg = model.config
  sites = [f'blocks.{l}.{site}' for l in range(cfg.num_layers)]
  hooks.check_names(model, sites, hooking=True)
  if axes(model, sites[0])[1] is None:
    raise InputError(f'{site} has no head axis; sweep_heads patches {list(_PER_HEAD + _HEAD_FIRST)}')
  score = _Score(metric, answer, wrong, key_mask, clean.shape, model.config.vocab_size)
  values = _sweep(model, params, clean, corrupt, _one_site_per_patch(model, clean.shape[1], sites, 'head'),
                  score, key_mask).reshape(cfg.num_layers, cfg.num_heads)
  return Sweep(values, [f'block {l}' for l in range(cfg.num_layers)], [f'head {h}' for h in range(cfg.num_heads)],
               f'patching {site} per head', score.name)


@core.takes_hooked_model
def sweep_positions(model: Transformer, params, clean, corrupt, streams: Sequence[str] | None = None, metric=None,
                    answer=None, wrong=None, decode: Callable | None = None, key_mask=None) -> Sweep:
  """The state after every block patched from ``clean`` at one position at a time: values ``[layers, time]``.
  The state is ``resid`` for the standard model and both streams, X_t and X_e, for the two-stream kinds
  (``streams`` picks others, e.g. ``['x_e']``)."""
  clean, corrupt, key_mask = _pair(model, clean, corrupt, key_mask)
  cfg = model.config
  streams = list(streams or (['resid'] if cfg.kind == 'standard' else ['x_t', 'x_e']))
  per_layer = [[f'blocks.{l}.{s}' for s in streams] for l in range(cfg.num_layers)]
  hooks.check_names(model, [s for layer in per_layer for s in layer], hooking=True)
  score = _Score(metric, answer, wrong, key_mask, clean.shape, model.config.vocab_size)
  values = _sweep(model, params, clean, corrupt, _one_site_per_patch(model, clean.shape[1], per_layer, 'time'),
                  score, key_mask).reshape(cfg.num_layers, clean.shape[1])
  return _position_sweep(values, clean, decode, streams, score.name)


# TransformerLens's patching families (``transformer_lens.patching.get_act_patch_*``), one call each, with its
# names and shapes: clean and corrupt token batches in, the metric of each patch out. Each takes what the
# sweeps take (``metric``, or ``answer``/``wrong`` for the recovered fraction; ``key_mask``).
def _resid_pre(model, l: int) -> list[str]:
  """The state before block l: the embedding for l = 0 (X_e⁰ = 0 in both runs), else the state after l − 1."""
  if l == 0:
    return ['embed']
  return [f'blocks.{l - 1}.resid'] if model.config.kind == 'standard' else [f'blocks.{l - 1}.x_t',
                                                                          f'blocks.{l - 1}.x_e']


def _resid_mid(model, l: int) -> list[str]:
  return [f'blocks.{l}.resid_mid'] if model.config.kind == 'standard' else [f'blocks.{l}.x_t_mid',
                                                                          f'blocks.{l}.x_e_mid']


def _by_position(model, params, clean, corrupt, sites_of, metric, answer, wrong, key_mask) -> np.ndarray:
  clean, corrupt, key_mask = _pair(model, clean, corrupt, key_mask)
  per_layer = [sites_of(model, l) for l in range(model.config.num_layers)]
  hooks.check_names(model, [s for layer in per_layer for s in layer], hooking=True)
  score = _Score(metric, answer, wrong, key_mask, clean.shape, model.config.vocab_size)
  return _sweep(model, params, clean, corrupt, _one_site_per_patch(model, clean.shape[1], per_layer, 'time'),
                score, key_mask).reshape(model.config.num_layers, clean.shape[1])


@core.takes_hooked_model
def get_act_patch_resid_pre(model, params, clean, corrupt, metric=None, answer=None, wrong=None, key_mask=None):
  """``[layers, time]``: the state before block l patched at one position."""
  return _by_position(model, params, clean, corrupt, _resid_pre, metric, answer, wrong, key_mask)


@core.takes_hooked_model
def get_act_patch_resid_mid(model, params, clean, corrupt, metric=None, answer=None, wrong=None, key_mask=None):
  """``[layers, time]``: the state between block l's attention and its FFN patched at one position."""
  return _by_position(model, params, clean, corrupt, _resid_mid, metric, answer, wrong, key_mask)


@core.takes_hooked_model
def get_act_patch_resid_post(model, params, clean, corrupt, metric=None, answer=None, wrong=None, key_mask=None):
  """``[layers, time]``: the state after block l patched at one position (``sweep_positions``' values)."""
  return _by_position(model, params, clean, corrupt, lambda m, l: _resid_pre(m, l + 1), metric, answer, wrong,
                      key_mask)


@core.takes_hooked_model
def get_act_patch_attn_out(model, params, clean, corrupt, metric=None, answer=None, wrong=None, key_mask=None):
  """``[layers, time]``: block l's attention update (``attn.out``) patched at one position."""
  return _by_position(model, params, clean, corrupt, lambda m, l: [f'blocks.{l}.attn.out'], metric, answer, wrong,
                      key_mask)


@core.takes_hooked_model
def get_act_patch_mlp_out(model, params, clean, corrupt, metric=None, answer=None, wrong=None, key_mask=None):
  """``[layers, time]``: block l's FFN update (``ffn.out``) patched at one position."""
  return _by_position(model, params, clean, corrupt, lambda m, l: [f'blocks.{l}.ffn.out'], metric, answer, wrong,
                      key_mask)


@core.takes_hooked_model
def get_act_patch_attn_head_out_all_pos(model, params, clean, corrupt, metric=None, answer=None, wrong=None,
                                        key_mask=None):
  """``[layers, heads]``: head h's output (``attn.z``) of block l patched at every position."""
  return sweep_heads(model, params, clean, corrupt, 'attn.z', metric, answer, wrong, key_mask).values


@core.takes_hooked_model
def get_act_patch_attn_head_out_by_pos(model, params, clean, corrupt, metric=None, answer=None, wrong=None,
                                       key_mask=None):
  """``[layers, time, heads]``: head h's output (``attn.z``) of block l patched at one position."""
  clean, corrupt, key_mask = _pair(model, clean, corrupt, key_mask)
  cfg = model.config
  sites = [f'blocks.{l}.attn.z' for l in range(cfg.num_layers)]
  score = _Score(metric, answer, wrong, key_mask, clean.shape, model.config.vocab_size)
  values = _sweep(model, params, clean, corrupt, _heads_by_position(model, clean.shape[1], sites), score,
                  key_mask)
  return values.reshape(cfg.num_layers, clean.shape[1], cfg.num_heads)


@core.takes_hooked_model
def get_act_patch_block_every(model, params, clean, corrupt, metric=None, answer=None, wrong=None, key_mask=None):
  """``[3, layers, time]``: ``resid_pre``, ``attn_out`` and ``mlp_out`` of every block, one position at a time."""
  return np.stack([fn(model, params, clean, corrupt, metric, answer, wrong, key_mask)
                   for fn in (get_act_patch_resid_pre, get_act_patch_attn_out, get_act_patch_mlp_out)])


def _position_sweep(values: np.ndarray, clean: np.ndarray, decode, streams, metric: str) -> Sweep:
  labels = [f'{p}:{decode([int(clean[0, p])])}' if decode else str(p) for p in range(clean.shape[1])]
  return Sweep(values, [f'block {l}' for l in range(len(values))], labels, f'patching {"+".join(streams)} per position',
               metric)


def _metric_name(metric) -> str:
  """What a sweep's metric measures, for its figure's title: the recovered fraction's own name, a named
  function's name, else 'metric'."""
  name = getattr(metric, '__name__', '')
  return name.replace('_', ' ') if name and name != '<lambda>' else 'metric'

