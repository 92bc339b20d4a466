"""Interventions without touching the model code: ablate a layer's X_t update (its attention) or X_e
update (its FFN), knock out one head, or patch an activation from another input, through Flax's method
interception (``flax.linen.intercept_methods``).

Sites, for layer l:
  ``Ablation('attention', l)``  the attention output: the X_t update of a two-stream block (eq. 12 / 28),
                                the attention residual update of a standard block
  ``Ablation('ffn', l)``        the FFN output: the X_e update (eq. 15 / Algorithm 1 line 8), or the MLP
                                residual update of a standard block
  ``Ablation('head', l, h)``    head h alone: its channel of the attention output in a two-stream block
                                (each head writes its own channel), its input to the output projection in a
                                standard block
Modes: ``'zero'``; ``'mean'`` (the mean over the valid positions of a reference batch — by default the
input itself); ``'patch'`` (the value the site takes on a source input of the same shape).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from symjax.interpret import core
from symjax.model import Transformer
from symjax.system.errors import InputError
from symjax.train import metrics

SITES = ('attention', 'ffn', 'head')
MODES = ('zero', 'mean', 'patch')


@dataclasses.dataclass(frozen=True)
class Ablation:
  site: str
  layer: int
  head: int | None = None
  mode: str = 'zero'

  def validate(self, cfg) -> None:
    if self.site not in SITES:
      raise InputError(f'ablation site must be one of {list(SITES)}, got {self.site!r}')
    if self.mode not in MODES:
      raise InputError(f'ablation mode must be one of {list(MODES)}, got {self.mode!r}')
    if not 0 <= self.layer < cfg.num_layers:
      raise InputError(f'ablation layer {self.layer} out of range: layers are 0..{cfg.num_layers - 1}')
    if self.site == 'head':
      if self.head is None or not 0 <= self.head < cfg.num_heads:
        raise InputError(f'head ablation needs head in 0..{cfg.num_heads - 1}, got {self.head!r}')
    elif self.head is not None:
      raise InputError(f"only site 'head' takes a head; got site {self.site!r} with head {self.head}")

  def __str__(self) -> str:
    where = f'L{self.layer}.H{self.head}' if self.site == 'head' else f'L{self.layer}.{self.site}'
    return f'{where} ({self.mode})'


@dataclasses.dataclass(frozen=True)
class _Hook:
  path: tuple[str, ...]      # module path
  on_input: bool             # act on the first argument (True) or on the output (False)
  get: Callable              # activation -> the site's value
  put: Callable              # (activation, new value) -> activation


def _hook(cfg, a: Ablation) -> _Hook:
  layer = f'layer_{a.layer}'
  if a.site in ('attention', 'ffn'):
    return _Hook((layer, a.site), False, lambda x: x, lambda x, v: jnp.broadcast_to(v, x.shape).astype(x.dtype))
  h, H = a.head, cfg.num_heads
  if cfg.kind == 'standard':  # [batch, time, heads, head_dim] entering the output projection
    return _Hook((layer, 'attention', 'out'), True, lambda x: x[..., h, :],
                 lambda x, v: x.at[..., h, :].set(jnp.broadcast_to(v, x[..., h, :].shape).astype(x.dtype)))

  def put(x, v):
    xh = x.reshape(*x.shape[:-1], H, -1)
    return xh.at[..., h, :].set(jnp.broadcast_to(v, xh[..., h, :].shape).astype(x.dtype)).reshape(x.shape)
  return _Hook((layer, 'attention'), False, lambda x: x.reshape(*x.shape[:-1], H, -1)[..., h, :], put)


def _interceptor(actions: dict[tuple[str, ...], list[tuple[bool, Callable]]]):
  """Applies ``fn(activation) -> activation`` at each module path (on its input or output)."""
  def intercept(next_fun, args, kwargs, context):
    if context.method_name != '__call__' or context.module.path not in actions:
      return next_fun(*args, **kwargs)
    todo = actions[context.module.path]
    for on_input, fn in todo:
      if on_input:
        args = (fn(args[0]),) + tuple(args[1:])
    out = next_fun(*args, **kwargs)
    for on_input, fn in todo:
      if not on_input:
        out = fn(out)
    return out
  return intercept


@core.takes_hooked_model
def capture(model: Transformer, params, tokens, sites: Sequence[Ablation], key_mask=None
            ) -> list[np.ndarray]:
  """The value each site takes on ``tokens`` (modes are ignored)."""
  model = core.analysis_model(model)
  hooks = [_hook(model.config, a) for a in sites]
  for a in sites:
    a.validate(model.config)
  found: list = [None] * len(hooks)
  actions: dict = {}
  for i, hk in enumerate(hooks):
    def record(x, i=i, hk=hk):
      found[i] = np.asarray(hk.get(x), np.float64)
      return x
    actions.setdefault(hk.path, []).append((hk.on_input, record))
  with nn.intercept_methods(_interceptor(actions)):
    core.run(model, params, tokens, key_mask)
  return found


@core.takes_hooked_model
def run_with(model: Transformer, params, tokens, ablations: Sequence[Ablation], key_mask=None,
             reference=None, reference_mask=None, source=None, source_mask=None):
  """Logits ``[batch, time, vocab]`` and intermediates of ``tokens`` with every ablation applied.

  ``reference``: the batch whose mean a 'mean' ablation uses, over its valid positions — a batch of the
  run's data (``run.batches('validation')[0]['inputs']``, with its ``key_mask`` as ``reference_mask``), or
  ``'prompt'`` for the prompt's own positions (a mean over one prompt is a weak baseline, so it is never
  the default). ``source``: the input a 'patch' ablation takes its values from (same shape as ``tokens``).
  """
  model = core.analysis_model(model)
  cfg = model.config
  tokens = core.as_batch(tokens, model.config.vocab_size)
  for a in ablations:
    a.validate(cfg)
  means = [a for a in ablations if a.mode == 'mean']
  patches = [a for a in ablations if a.mode == 'patch']
  values: dict[Ablation, np.ndarray] = {}
  if means:
    if reference is None:
      raise InputError("a 'mean' ablation needs reference=: a batch of the run's data to average over (e.g. "
                       "run.batches('validation')[0]['inputs']), or reference='prompt' for the prompt's own "
                       "positions")
    own = isinstance(reference, str) and reference == 'prompt'
    if isinstance(reference, str) and not own:
      raise InputError(f"reference must be a batch of token ids or 'prompt', got {reference!r}")
    ref = tokens if own else core.as_batch(reference, cfg.vocab_size)
    ref_mask = key_mask if own else reference_mask
    valid = np.ones(ref.shape, bool) if ref_mask is None else np.asarray(ref_mask, bool).reshape(ref.shape)
    for a, v in zip(means, capture(model, params, ref, means, ref_mask)):
      values[a] = v[valid].mean(0)
  if patches:
    if source is None:
      raise InputError("a 'patch' ablation needs source= tokens to take the activations from")
    src = core.as_batch(source, cfg.vocab_size)
    if src.shape != tokens.shape:
      raise InputError(f'patching needs a source of the same shape as the input: {src.shape} vs {tokens.shape}')
    for a, v in zip(patches, capture(model, params, src, patches, source_mask)):
      values[a] = v
  actions: dict = {}
  for a in ablations:
    hk = _hook(cfg, a)
    value = jnp.asarray(values[a], jnp.float32) if a in values else None
    def apply(x, hk=hk, value=value):
      return hk.put(x, jnp.zeros_like(hk.get(x)) if value is None else value)
    actions.setdefault(hk.path, []).append((hk.on_input, apply))
  with nn.intercept_methods(_interceptor(actions)):
    return core.run(model, params, tokens, key_mask)


@core.takes_hooked_model
def effect(model: Transformer, params, batch: dict[str, np.ndarray], ablations: Sequence[Ablation],
           weights: np.ndarray | None = None, **kw) -> dict[str, float]:
  """Loss and accuracy of ``batch`` (task format: inputs, targets, weights, key_mask) without and with
  the ablations, their changes, and the mean absolute change of the logits. ``weights`` overrides the
  batch's (e.g. to score only the positions that need a circuit). A 'mean' ablation averages over this
  batch of data unless ``reference=`` says otherwise."""
  w = batch['weights'] if weights is None else weights
  if 'reference' not in kw:
    kw.update(reference=batch['inputs'], reference_mask=batch.get('key_mask'))
  clean_logits, _ = core.run(core.analysis_model(model), params, batch['inputs'], batch.get('key_mask'))
  logits, _ = run_with(model, params, batch['inputs'], ablations, batch.get('key_mask'), **kw)
  clean = metrics.token_metrics(clean_logits, batch['targets'], w)
  hit = metrics.token_metrics(logits, batch['targets'], w)
  mask = np.asarray(w) > 0
  return {'clean_loss': clean['loss'], 'clean_accuracy': clean['accuracy'], 'loss': hit['loss'],
          'accuracy': hit['accuracy'], 'loss_change': hit['loss'] - clean['loss'],
          'accuracy_change': hit['accuracy'] - clean['accuracy'],
          'mean_abs_logit_change': float(np.abs(logits - clean_logits)[mask].mean()) if mask.any() else 0.0,
          'count': clean['count']}
