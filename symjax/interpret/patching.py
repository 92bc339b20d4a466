"""Activation patching: run a corrupted prompt with one site taken from a clean run, and sweeps of it over
layers × heads and layers × positions, as TransformerLens researchers do it.

  recovered = patching.sweep_heads(model, params, clean, corrupt)      # [layers, heads]
  recovered.figure()                                                   # a heatmap

The default metric is the fraction of the logit difference recovered at the last position:
(m(patched) − m(corrupt)) / (m(clean) − m(corrupt)), with m the logit of the clean prediction minus the logit
of the corrupt one (or of ``answer`` minus ``wrong`` when given). Any function of the logits can replace it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

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


def _pair(model: Transformer, clean, corrupt) -> tuple[np.ndarray, np.ndarray]:
  clean = core.as_batch(clean, model.config.vocab_size)
  corrupt = core.as_batch(corrupt, model.config.vocab_size)
  if clean.shape != corrupt.shape:
    raise InputError(f'clean and corrupt prompts must have the same shape to patch position by position: '
                     f'{clean.shape} vs {corrupt.shape} (pad them to one length)')
  return clean, corrupt


def patch(model: Transformer, params, clean, corrupt, name: str | Sequence[str], positions=None, heads=None,
          metric: Callable[[np.ndarray], float] | None = None, clean_cache: hooks.Cache | None = None):
  """``metric`` of the logits of ``corrupt`` run with ``name`` (one site or several) taken from ``clean`` at
  ``positions`` and ``heads`` (default: all of them); the logits themselves without a metric."""
  clean, corrupt = _pair(model, clean, corrupt)
  sites = [name] if isinstance(name, str) else list(name)
  hooks.check_names(model, sites, hooking=True)
  if clean_cache is None or any(s not in clean_cache for s in sites):
    _, clean_cache = hooks.run_with_cache(model, params, clean, sites)

  def take_clean(value, site):
    source = np.asarray(clean_cache[site])
    index = _selector(model, site, value.shape, positions, heads)
    return value.at[index].set(source[index].astype(value.dtype))

  logits = hooks.run_with_hooks(model, params, corrupt, {s: take_clean for s in sites})
  return logits if metric is None else metric(logits)


def logit_difference(answer: int, wrong: int, position: int = -1, batch: int = 0) -> Callable[[np.ndarray], float]:
  """logits[answer] − logits[wrong] at ``position``."""
  return lambda logits: float(logits[batch, position, answer] - logits[batch, position, wrong])


@dataclasses.dataclass
class Sweep:
  """A patching sweep: ``values[i, j]`` the metric with site row i patched at column j."""

  values: np.ndarray
  rows: list[str]
  columns: list[str]
  title: str

  def figure(self):
    """A heatmap of ``values`` with its row and column labels (matplotlib Figure)."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(max(3.0, 0.45 * len(self.columns) + 1.5), max(2.0, 0.45 * len(self.rows) + 1.0)))
    ax = fig.add_subplot()
    bound = max(1.0, float(np.nanmax(np.abs(self.values))))
    image = ax.imshow(self.values, cmap='RdBu', vmin=-bound, vmax=bound, aspect='auto')
    ax.set_xticks(range(len(self.columns)), self.columns, fontsize=7, rotation=90)
    ax.set_yticks(range(len(self.rows)), self.rows, fontsize=7)
    ax.set_title(self.title, fontsize=9)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    return fig


def _recovered(model, params, clean, corrupt, metric, answer, wrong):
  """The metric of a sweep: the user's, or the fraction of the logit difference recovered."""
  if metric is not None:
    return metric
  clean_logits = hooks.run_with_hooks(model, params, clean, {})
  corrupt_logits = hooks.run_with_hooks(model, params, corrupt, {})
  if answer is None or wrong is None:
    answer, wrong = int(np.argmax(clean_logits[0, -1])), int(np.argmax(corrupt_logits[0, -1]))
    if answer == wrong:
      raise InputError(f'clean and corrupt prompts predict the same token ({answer}) at the last position: give '
                       f'answer= and wrong= tokens, or a metric=')
  diff = logit_difference(answer, wrong)
  low, high = diff(corrupt_logits), diff(clean_logits)
  if abs(high - low) < 1e-9:
    raise InputError('the logit difference is the same on the clean and the corrupt prompt: nothing to recover')
  return lambda logits: (diff(logits) - low) / (high - low)


def sweep_heads(model: Transformer, params, clean, corrupt, site: str = 'attn.z', metric=None, answer=None,
                wrong=None) -> Sweep:
  """Every head of every block patched from ``clean`` at ``blocks.{l}.{site}`` (all positions): values
  ``[layers, heads]``."""
  clean, corrupt = _pair(model, clean, corrupt)
  metric = _recovered(model, params, clean, corrupt, metric, answer, wrong)
  cfg = model.config
  sites = [f'blocks.{l}.{site}' for l in range(cfg.num_layers)]
  _, cache = hooks.run_with_cache(model, params, clean, sites)
  values = np.array([[patch(model, params, clean, corrupt, s, heads=h, metric=metric, clean_cache=cache)
                      for h in range(cfg.num_heads)] for s in sites])
  return Sweep(values, [f'block {l}' for l in range(cfg.num_layers)], [f'head {h}' for h in range(cfg.num_heads)],
               f'patching {site} per head')


def sweep_positions(model: Transformer, params, clean, corrupt, streams: Sequence[str] | None = None, metric=None,
                    answer=None, wrong=None, decode: Callable | None = None) -> Sweep:
  """The state after every block patched from ``clean`` at one position at a time: values ``[layers, time]``.
  The state is ``resid`` for the standard model and both streams, X_t and X_e, for the two-stream kinds
  (``streams`` picks others, e.g. ``['x_e']``)."""
  clean, corrupt = _pair(model, clean, corrupt)
  metric = _recovered(model, params, clean, corrupt, metric, answer, wrong)
  cfg = model.config
  streams = list(streams or (['resid'] if cfg.kind == 'standard' else ['x_t', 'x_e']))
  per_layer = [[f'blocks.{l}.{s}' for s in streams] for l in range(cfg.num_layers)]
  _, cache = hooks.run_with_cache(model, params, clean, [s for layer in per_layer for s in layer])
  t = clean.shape[1]
  values = np.array([[patch(model, params, clean, corrupt, sites, positions=p, metric=metric, clean_cache=cache)
                      for p in range(t)] for sites in per_layer])
  labels = [f'{p}:{decode([int(clean[0, p])])}' if decode else str(p) for p in range(t)]
  return Sweep(values, [f'block {l}' for l in range(cfg.num_layers)], labels,
               f'patching {"+".join(streams)} per position')
