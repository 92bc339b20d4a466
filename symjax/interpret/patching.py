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

from symjax.interpret import core, hooks
from symjax.model import Transformer
from symjax.system.errors import InputError

# Axes of a site's value: (time axis, head axis or None). Sites not listed are [batch, time, features].
_PER_HEAD = ('.attn.q', '.attn.k', '.attn.values', '.attn.z', '.attn.v_mixture', '.ffn.mixture')
_HEAD_FIRST = ('.attn.scores', '.attn.pattern')


def axes(model: Transformer, name: str) -> tuple[int | None, int | None]:
  """(time axis, head axis) of a site's value; (None, None) when it has neither in a form one can index
  (the symbolic channel FFN's hidden units are [heads, batch·time, ff])."""
  if name.endswith(_PER_HEAD):
    return 1, 2
  if name.endswith(_HEAD_FIRST):
    return 2, 1   # [batch, heads, query position, key position]: a position is a query
  if name.endswith('.ffn.hidden') and model.config.kind == 'symbolic' and model.config.vocab_ffn == 'channel':
    return None, None
  return 1, None


def _selector(model, name, shape, positions, heads):
  time_axis, head_axis = axes(model, name)
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
    h = model.config.num_heads
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


def patch(model: Transformer, params, clean, corrupt, name: str | Sequence[str], positions=None, heads=None,
          metric: Callable[[np.ndarray], float] | None = None, clean_cache: hooks.Cache | None = None,
          key_mask=None):
  """``metric`` of the logits of ``corrupt`` run with ``name`` (one site or several) taken from ``clean`` at
  ``positions`` and ``heads`` (default: all of them); the logits themselves without a metric. Every prompt
  pair of the batch is patched. ``key_mask`` ``[batch, time]`` (False at padding) runs both prompts with
  their padding masked, so that prompts of unequal length patch as padded to one length."""
  clean, corrupt, key_mask = _pair(model, clean, corrupt, key_mask)
  sites = [name] if isinstance(name, str) else list(name)
  hooks.check_names(model, sites, hooking=True)
  if clean_cache is None or any(s not in clean_cache for s in sites):
    _, clean_cache = hooks.run_with_cache(model, params, clean, sites, key_mask=key_mask)

  def take_clean(value, site):
    source = np.asarray(clean_cache[site])
    index = _selector(model, site, value.shape, positions, heads)
    return value.at[index].set(source[index].astype(value.dtype))

  logits = hooks.run_with_hooks(model, params, corrupt, {s: take_clean for s in sites}, key_mask=key_mask)
  return logits if metric is None else metric(logits)


# One compiled program per (model, sites): every patch of a sweep runs in it, vmapped over the patches, and a
# later sweep of the same sites reuses it (jax.jit retraces only for new shapes).
_PATCHERS: dict = {}
CHUNK = 32  # patches per call of the compiled program: bounds its memory to CHUNK forward passes


def _patcher(model: Transformer, sites: tuple[str, ...]):
  key = (model, sites)
  if key not in _PATCHERS:
    def one(params, corrupt, key_mask, clean, mask):
      take = lambda s: lambda v, name: jnp.where(mask[s], clean[s].astype(v.dtype), v)
      return hooks.hooked_logits(model, params, corrupt, key_mask, {s: take(s) for s in sites})
    _PATCHERS[key] = jax.jit(jax.vmap(one, in_axes=(None, None, None, None, 0)))
  return _PATCHERS[key]


def patch_many(model: Transformer, params, clean, corrupt, masks: dict[str, np.ndarray], key_mask=None,
               clean_cache: hooks.Cache | None = None, chunk: int = CHUNK) -> np.ndarray:
  """The logits ``[patches, batch, time, vocab]`` of ``corrupt`` with, in patch i, each site s of ``masks``
  taken from ``clean`` where ``masks[s][i]`` (broadcast to the site's shape) is True: every patch in one
  compiled program, vmapped over the patches in chunks of ``chunk``. ``patch`` with one site equals row i
  of this with the mask of its positions and heads."""
  clean, corrupt, key_mask = _pair(model, clean, corrupt, key_mask)
  sites = tuple(masks)
  hooks.check_names(model, list(sites), hooking=True)
  if clean_cache is None or any(s not in clean_cache for s in sites):
    _, clean_cache = hooks.run_with_cache(model, params, clean, list(sites), key_mask=key_mask)
  count = {len(m) for m in masks.values()}
  if len(count) != 1:
    raise InputError(f'every site needs one mask per patch; got {sorted(count)} masks')
  run = _patcher(core.analysis_model(model), sites)
  values = {s: jnp.asarray(clean_cache[s]) for s in sites}
  km = None if key_mask is None else jnp.asarray(key_mask)
  out = []
  for start in range(0, count.pop(), chunk):
    mask = {s: jnp.asarray(m[start:start + chunk]) for s, m in masks.items()}
    out.append(np.asarray(run(params, jnp.asarray(corrupt), km, values, mask)))
  return np.concatenate(out)


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
  averages over the rows, ``'none'`` gives one value per row; ``batch=i`` reads row i alone."""
  if reduce not in REDUCTIONS:
    raise InputError(f'reduce must be one of {list(REDUCTIONS)}, got {reduce!r}')

  def metric(logits):
    logits = np.asarray(logits)
    rows = np.arange(logits.shape[0])
    at = np.broadcast_to(np.asarray(position), rows.shape)
    values = (logits[rows, at, np.broadcast_to(np.asarray(answer), rows.shape)]
              - logits[rows, at, np.broadcast_to(np.asarray(wrong), rows.shape)])
    if batch is not None:
      return float(values[batch])
    return values if reduce == 'none' else float(values.mean())
  return metric


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


def _recovered(model, params, clean, corrupt, metric, answer, wrong, key_mask=None):
  """The metric of a sweep: the user's, or the fraction of the logit difference recovered, the difference
  averaged over the batch's prompt pairs at each one's last real position."""
  if metric is not None:
    return metric
  clean_logits = hooks.run_with_hooks(model, params, clean, {}, key_mask=key_mask)
  corrupt_logits = hooks.run_with_hooks(model, params, corrupt, {}, key_mask=key_mask)
  rows = np.arange(clean.shape[0])
  last = np.full(rows.shape, clean.shape[1] - 1) if key_mask is None else key_mask.shape[1] - 1 - np.argmax(
      key_mask[:, ::-1], axis=1)
  if answer is None or wrong is None:
    answer, wrong = np.argmax(clean_logits[rows, last], -1), np.argmax(corrupt_logits[rows, last], -1)
    same = np.flatnonzero(answer == wrong)
    if same.size:
      raise InputError(f'clean and corrupt prompts predict the same token ({int(answer[same[0]])}) at the last '
                       f'position of pair {int(same[0])}: give answer= and wrong= tokens, or a metric=')
  diff = logit_difference(answer, wrong, last)
  low, high = diff(corrupt_logits), diff(clean_logits)
  if abs(high - low) < 1e-9:
    raise InputError('the logit difference is the same on the clean and the corrupt prompt: nothing to recover')

  def fraction_of_logit_difference_recovered(logits):
    return (diff(logits) - low) / (high - low)
  return fraction_of_logit_difference_recovered


def sweep_heads(model: Transformer, params, clean, corrupt, site: str = 'attn.z', metric=None, answer=None,
                wrong=None, key_mask=None, compiled: bool = False) -> Sweep:
  """Every head of every block patched from ``clean`` at ``blocks.{l}.{site}`` (all positions), in every
  prompt pair of the batch: values ``[layers, heads]``. ``compiled``: all the patches in one compiled
  program (``patch_many``), far faster; its logits differ from the eager passes' by float32 rounding, which a
  ratio of small logit differences (the default metric) can magnify."""
  clean, corrupt, key_mask = _pair(model, clean, corrupt, key_mask)
  metric = _recovered(model, params, clean, corrupt, metric, answer, wrong, key_mask)
  cfg = model.config
  sites = [f'blocks.{l}.{site}' for l in range(cfg.num_layers)]
  hooks.check_names(model, sites, hooking=True)
  _, cache = hooks.run_with_cache(model, params, clean, sites, key_mask=key_mask)
  _, head_axis = axes(model, sites[0])
  if head_axis is None:
    raise InputError(f'{site} has no head axis; sweep_heads patches {list(_PER_HEAD + _HEAD_FIRST)}')
  L, H = cfg.num_layers, cfg.num_heads
  if not compiled:
    values = np.array([[patch(model, params, clean, corrupt, s, heads=h, metric=metric, clean_cache=cache,
                              key_mask=key_mask) for h in range(H)] for s in sites])
    return Sweep(values, [f'block {l}' for l in range(L)], [f'head {h}' for h in range(H)],
                 f'patching {site} per head', _metric_name(metric))
  # Patch (l, h) takes head h of block l's site: the masks of the other blocks' sites are all False.
  shape = cache[sites[0]].shape
  masks = {}
  for l, s in enumerate(sites):
    one_hot = _one_hot(shape, head_axis, H)
    masks[s] = np.zeros((L * H, *one_hot.shape[1:]), bool)
    masks[s][l * H:(l + 1) * H] = one_hot
  logits = patch_many(model, params, clean, corrupt, masks, key_mask, cache)
  values = np.array([metric(row) for row in logits]).reshape(L, H)
  return Sweep(values, [f'block {l}' for l in range(L)], [f'head {h}' for h in range(H)],
               f'patching {site} per head', _metric_name(metric))


def sweep_positions(model: Transformer, params, clean, corrupt, streams: Sequence[str] | None = None, metric=None,
                    answer=None, wrong=None, decode: Callable | None = None, key_mask=None,
                    compiled: bool = False) -> Sweep:
  """The state after every block patched from ``clean`` at one position at a time: values ``[layers, time]``
  (``compiled``: in one compiled program, as ``sweep_heads``).
  The state is ``resid`` for the standard model and both streams, X_t and X_e, for the two-stream kinds
  (``streams`` picks others, e.g. ``['x_e']``)."""
  clean, corrupt, key_mask = _pair(model, clean, corrupt, key_mask)
  metric = _recovered(model, params, clean, corrupt, metric, answer, wrong, key_mask)
  cfg = model.config
  streams = list(streams or (['resid'] if cfg.kind == 'standard' else ['x_t', 'x_e']))
  per_layer = [[f'blocks.{l}.{s}' for s in streams] for l in range(cfg.num_layers)]
  every = [s for layer in per_layer for s in layer]
  hooks.check_names(model, every, hooking=True)
  _, cache = hooks.run_with_cache(model, params, clean, every, key_mask=key_mask)
  t, L = clean.shape[1], len(per_layer)
  if not compiled:
    values = np.array([[patch(model, params, clean, corrupt, sites, positions=p, metric=metric, clean_cache=cache,
                              key_mask=key_mask) for p in range(t)] for sites in per_layer])
    return _position_sweep(values, clean, decode, streams, _metric_name(metric))
  # Patch (l, p) takes position p of block l's states: the masks of the other blocks' states are all False.
  masks = {}
  for l, layer in enumerate(per_layer):
    for s in layer:
      shape = cache[s].shape
      one_hot = _one_hot(shape, axes(model, s)[0], t)
      masks[s] = np.zeros((L * t, *one_hot.shape[1:]), bool)
      masks[s][l * t:(l + 1) * t] = one_hot
  logits = patch_many(model, params, clean, corrupt, masks, key_mask, cache)
  return _position_sweep(np.array([metric(row) for row in logits]).reshape(L, t), clean, decode, streams,
                         _metric_name(metric))


def _position_sweep(values: np.ndarray, clean: np.ndarray, decode, streams, metric: str) -> Sweep:
  labels = [f'{p}:{decode([int(clean[0, p])])}' if decode else str(p) for p in range(clean.shape[1])]
  return Sweep(values, [f'block {l}' for l in range(len(values))], labels, f'patching {"+".join(streams)} per position',
               metric)


def _metric_name(metric) -> str:
  """What a sweep's metric measures, for its figure's title: the recovered fraction's own name, a named
  function's name, else 'metric'."""
  name = getattr(metric, '__name__', '')
  return name.replace('_', ' ') if name and name != '<lambda>' else 'metric'

