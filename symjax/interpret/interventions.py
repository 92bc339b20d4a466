"""Interventions named by what they ablate: a layer's X_t update (its attention) or X_e update (its FFN),
one head, zeroed, set to its mean or patched from another input — each a hook at a named site
(``symjax.interpret.hooks``), compiled by the engine like any other.

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
import functools
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from symjax.interpret import core, hooks
from symjax.model import Transformer
from symjax.model import intermediates as names
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


def _site(cfg, a: Ablation) -> str:
  """The named site an ablation acts at: the attention's or FFN's update, or, for one head, the heads'
  outputs entering the output projection (standard) or the attention update whose channel h the head writes
  (two-stream)."""
  if a.site == 'attention':
    return f'blocks.{a.layer}.attn.out'
  if a.site == 'ffn':
    return f'blocks.{a.layer}.ffn.out'
  return f'blocks.{a.layer}.attn.z' if cfg.kind == 'standard' else f'blocks.{a.layer}.attn.out'


def _chosen(x, head, heads: int, per_head: bool):
  """True where head ``head`` writes: its slice of the head axis (``[..., heads, d]``) or its channel of
  ``[..., d_model]``; broadcast to ``x``. ``head`` None: everywhere."""
  if head is None:
    return jnp.ones((), bool)
  if per_head:
    return (jnp.arange(x.shape[-2]) == head)[:, None]
  return jnp.arange(x.shape[-1]) // (x.shape[-1] // heads) == head


def _put(x, name, value, head, heads: int, per_head: bool):
  """The hook of an ablation: ``value`` (0 for 'zero') where the ablated part of the site is, ``x`` elsewhere.
  ``value`` and ``head`` are the hook's data, so the ablations of every head share one program."""
  return jnp.where(_chosen(x, head, heads, per_head), jnp.asarray(value, x.dtype), x)


def _part(cfg, a: Ablation, value: np.ndarray) -> np.ndarray:
  """What ``capture`` returns of a site's value: the ablated head's slice or channel, or all of it."""
  if a.site != 'head':
    return value
  if cfg.kind == 'standard':
    return value[..., a.head, :]
  return value.reshape(*value.shape[:-1], cfg.num_heads, -1)[..., a.head, :]


def _values(model, params, tokens, sites: Sequence[Ablation], key_mask) -> list[np.ndarray]:
  cache = hooks.run_with_cache(model, params, tokens, sorted({_site(model.config, a) for a in sites}),
                               key_mask=key_mask)[1]
  return [np.asarray(cache[_site(model.config, a)], np.float64) for a in sites]


@core.takes_hooked_model
def capture(model: Transformer, params, tokens, sites: Sequence[Ablation], key_mask=None
            ) -> list[np.ndarray]:
  """The value each site takes on ``tokens`` (modes are ignored)."""
  model = core.analysis_model(model)
  for a in sites:
    a.validate(model.config)
  return [_part(model.config, a, v) for a, v in zip(sites, _values(model, params, tokens, sites, key_mask))]


@core.takes_hooked_model
def run_with(model: Transformer, params, tokens, ablations: Sequence[Ablation], key_mask=None,
             reference=None, reference_mask=None, source=None, source_mask=None):
  """Logits ``[batch, time, vocab]`` and intermediates of ``tokens`` with every ablation applied, as hooks at
  their named sites (``_site``).

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
    for a, v in zip(means, _values(model, params, ref, means, ref_mask)):
      values[a] = v[valid].mean(0)
  if patches:
    if source is None:
      raise InputError("a 'patch' ablation needs source= tokens to take the activations from")
    src = core.as_batch(source, cfg.vocab_size)
    if src.shape != tokens.shape:
      raise InputError(f'patching needs a source of the same shape as the input: {src.shape} vs {tokens.shape}')
    for a, v in zip(patches, _values(model, params, src, patches, source_mask)):
      values[a] = v
  by_site: dict[str, list] = {}
  for a in ablations:
    value = np.float32(0) if a not in values else values[a].astype(np.float32)
    per_head = a.site == 'head' and cfg.kind == 'standard'
    by_site.setdefault(_site(cfg, a), []).append(functools.partial(
        _put, value=value, head=a.head, heads=cfg.num_heads, per_head=per_head))
  fns = {site: fns[0] if len(fns) == 1 else hooks.chain(tuple(fns)) for site, fns in by_site.items()}
  _, _, logits, state = hooks._apply(model, params, tokens, key_mask, fns, frozenset(), [names.COLLECTION])
  sown = names.flat(state[names.COLLECTION])
  return np.asarray(logits, np.float64), {n: np.asarray(v, np.float64) for n, v in sown.items()}


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
