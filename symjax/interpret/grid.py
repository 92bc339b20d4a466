"""Your own intervention family as one sweep: one hook run over a grid of its arguments, every setting in one
compiled program.

  losses = grid.sweep_hooks(model, params, tokens, 'blocks.{layer}.attn.z', ablate,
                            over={'layer': range(L), 'head': range(H)})        # [L, H]

The grid's names that appear in the site (``{layer}``) choose the site; the others are passed to the hook as
keyword arguments (``ablate(value, hook, head=h)``), traced, so that the settings of one site run vmapped
apart in one program, blocks before the site computed once. Each setting gives the loss (the mean
cross-entropy of the next token), the logits, or ``metric(logits)``, a scalar written with ``jnp``.
"""

from __future__ import annotations

import inspect
import itertools
import string
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from symjax.interpret import core, engine, hooks
from symjax.model import Transformer
from symjax.model import intermediates as names
from symjax.system.errors import InputError

RETURN_TYPES = ('loss', 'logits', 'metric')


def _grid(over: Mapping[str, Sequence]) -> dict[str, list]:
  if not isinstance(over, Mapping) or not over:
    raise InputError('over must be a dict {argument name: values}, e.g. {"layer": range(4), "head": range(4)}')
  grid = {}
  for name, values in over.items():
    values = list(values)
    if not values:
      raise InputError(f'over[{name!r}] is empty: give at least one value')
    grid[name] = values
  return grid


def _site_fields(site: str) -> list[str]:
  return [field for _, field, _, _ in string.Formatter().parse(site) if field]


def _hook_arguments(hook: Callable, wanted: list[str], site_fields: list[str]) -> None:
  """InputError naming a grid argument that is neither a field of the site nor a parameter of the hook."""
  try:
    signature = inspect.signature(hook)
  except (TypeError, ValueError):
    return
  params = signature.parameters.values()
  if any(p.kind == p.VAR_KEYWORD for p in params):
    return
  accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
  for name in wanted:
    if name not in accepted:
      raise InputError(f'over names {name!r}, which is neither a field of the site ({site_fields or "none"}) nor an '
                       f'argument of the hook (it takes {sorted(accepted)})')


def _loss(logits, tokens, key_mask):
  """The mean cross-entropy of each next token (the ``run_with_hooks(..., return_type='loss')`` of one
  setting), float32."""
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
  nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
  if key_mask is None:
    return nll.mean()
  w = key_mask[:, 1:].astype(jnp.float32)
  return (nll * w).sum() / jnp.maximum(w.sum(), 1e-9)


@core.takes_hooked_model
def sweep_hooks(model: Transformer, params, tokens, site: str, hook: Callable, over: Mapping[str, Sequence],
                key_mask=None, return_type: str = 'loss', metric: Callable | None = None) -> np.ndarray:
  """``hook`` at ``site`` for every setting of the grid ``over`` (``{name: values}``, the settings its
  product), in one compiled program. ``site`` may name grid arguments (``'blocks.{layer}.attn.z'``, or
  TransformerLens's ``'blocks.{layer}.attn.hook_z'``); every other grid argument is a keyword argument of the
  hook. Returns ``[*grid shape]`` losses (``return_type='loss'``), metrics (``metric=``, a function of the
  logits ``[batch, time, vocab]`` giving a scalar) or ``[*grid shape, batch, time, vocab]`` logits."""
  if metric is not None:
    return_type = 'metric'
  if return_type not in RETURN_TYPES:
    raise InputError(f'return_type must be one of {list(RETURN_TYPES)}, got {return_type!r}')
  if return_type == 'metric' and metric is None:
    raise InputError("return_type='metric' needs metric= (a function of the logits giving a scalar)")
  if not isinstance(site, str):
    raise InputError(f'site must be a site name, optionally with grid fields (blocks.{{layer}}.attn.z), got {site!r}')
  if not callable(hook):
    raise InputError(f'hook must be a function (value, hook, **grid arguments), got {type(hook).__name__}')
  grid = _grid(over)
  fields = _site_fields(site)
  unknown = [f for f in fields if f not in grid]
  if unknown:
    raise InputError(f'the site {site!r} names {unknown[0]!r}, which over does not give (it gives {list(grid)})')
  hook_args = [n for n in grid if n not in fields]
  _hook_arguments(hook, hook_args, fields)
  analysis = core.analysis_model(model)
  num_layers = model.config.num_layers
  settings = list(itertools.product(*grid.values()))
  site_of = [names.from_transformer_lens(site.format(**dict(zip(grid, s))), num_layers) for s in settings]
  sites = tuple(dict.fromkeys(site_of))
  hooks.check_names(model, list(sites), hooking=True)
  tokens = core.as_batch(tokens, model.config.vocab_size)
  km = None if key_mask is None else np.asarray(key_mask, bool).reshape(tokens.shape)
  # Settings grouped by site, in the grid's order within each: (site, setting indices, {argument: values}).
  groups = []
  for s in sites:
    index = [i for i, name in enumerate(site_of) if name == s]
    values = {n: np.asarray([settings[i][list(grid).index(n)] for i in index]) for n in hook_args}
    if any(v.dtype.kind not in 'biuf' for v in values.values()):
      raise InputError(f'over gives the hook {hook_args} values that are not numbers; only the site\'s fields may '
                       f'be other values')
    groups.append((s, index, values))
  args = tuple({'_setting': np.arange(len(index)), **values} for _, index, values in groups)

  def make(fns):
    user_hook, user_metric = fns['hook'], fns.get('metric')

    def run(params, tokens, km, args):
      def score(logits):
        if return_type == 'loss':
          return _loss(logits, tokens, km)
        return logits if return_type == 'logits' else user_metric(logits)

      out = []
      for (s, _, _), group in zip(groups, args):
        def one(a, s=s):
          a = {k: v for k, v in a.items() if k != '_setting'}
          return score(hooks.hooked_logits(analysis, params, tokens, km, {s: lambda v, name: user_hook(v, name, **a)}))
        out.append(jax.vmap(one)(group))  # blocks before the site do not depend on the setting: computed once
      return out
    return run

  fns = {'hook': hook, **({'metric': metric} if metric is not None else {})}
  out = engine.hooked(('grid', analysis, tuple((s, len(i)) for s, i, _ in groups), tuple(hook_args), return_type),
                      fns, make, (core.unboxed(params), tokens, km, args),
                      lambda fns: _eager(groups, fns, model, params, tokens, km, return_type))
  values = np.empty((len(settings), *np.shape(out[0])[1:]), np.asarray(out[0]).dtype)
  for (_, index, _), o in zip(groups, out):
    values[index] = np.asarray(o)
  if return_type == 'metric' and values.ndim != 1:
    raise InputError(f'the metric must return one number per setting; it returned shape {values.shape[1:]}')
  return values.reshape(*[len(v) for v in grid.values()], *values.shape[1:])


def _eager(groups, fns, model, params, tokens, km, return_type) -> list[np.ndarray]:
  """The settings one pass at a time (a hook or metric that needs concrete values)."""
  out = []
  for s, index, values in groups:
    rows = []
    for i in range(len(index)):
      a = {k: v[i].item() for k, v in values.items()}
      logits = hooks.apply_with_hooks(model, params, tokens, {s: lambda v, name, a=a: fns['hook'](v, name, **a)}, km)
      rows.append(np.asarray(_loss(logits, jnp.asarray(tokens), km) if return_type == 'loss' else
                             logits if return_type == 'logits' else fns['metric'](logits)))
    out.append(np.stack(rows))
  return out

