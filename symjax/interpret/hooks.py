"""A named cache of every site and hooks on any of them, as TransformerLens researchers know them.

  logits, cache = run_with_cache(model, params, tokens)
  cache['blocks.1.attn.pattern']            # [batch, heads, q_time, k_time]
  cache.top_tokens('blocks.1.x_e', -1)      # the exact mixture of X_e after block 1, last position
  logits = run_with_hooks(model, params, tokens, {'blocks.0.attn.z': zero_head(1)})

The sites and their shapes are listed once, in ``symjax.model.intermediates``: ``embed``, then for each
block l = 0..L−1 ``blocks.{l}.attn.{q,k,scores,pattern,values,v_mixture,z,out}``,
``blocks.{l}.ffn.{pre,hidden,mixture,out}`` and ``blocks.{l}.{x_t,x_e,resid}`` (the state after block l), and
``final.{norm,logits}``. Hooks run inside the model's own modules (no second implementation of the model):
``fn(value, name) -> value`` of the same shape. ``name`` is also TransformerLens's hook object (``name.name``,
``name.layer()``), and a hook that returns None leaves the value as it is, so its users' hooks run unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from symjax.interpret import core, decomposition, engine, mixtures, patterns
from symjax.model import Transformer
from symjax.model import intermediates as names
from symjax.system.errors import InputError

# Axes of a site's value: (time axis, head axis or None). Sites not listed are [batch, time, features].
PER_HEAD = ('.attn.q', '.attn.k', '.attn.values', '.attn.gate', '.attn.z', '.attn.v_mixture', '.ffn.mixture')
HEAD_FIRST = ('.attn.scores', '.attn.pattern')


def axes(model: Transformer, name: str) -> tuple[int | None, int | None]:
  """(time axis, head axis) of a site's value; (None, None) when it has neither in a form one can index
  (the symbolic channel FFN's hidden units are [heads, batch·time, ff])."""
  if name.endswith(PER_HEAD):
    return 1, 2
  if name.endswith(HEAD_FIRST):
    return 2, 1   # [batch, heads, query position, key position]: a position is a query
  if name.endswith('.ffn.hidden') and model.config.kind == 'symbolic' and model.config.symbolic.vocab_ffn == 'channel':
    return None, None
  return 1, None


def site_axes(model: Transformer, requested: Sequence[str], hooking: bool = True
              ) -> dict[str, tuple[int | None, int | None, int]]:
  """{site: (time axis, head axis, rank)} of each requested site's value, after ``check_names``: what a
  mask needs to broadcast against it. A per-head site is ``[batch, time, heads, d]`` or ``[batch, heads,
  time, time]``; every other site has three axes (``[batch, time, d]``, or a symbolic channel FFN's hidden
  units ``[heads, batch·time, ff]``)."""
  check_names(model, requested, hooking=hooking)
  return {s: (*axes(model, s), 4 if s.endswith(PER_HEAD + HEAD_FIRST) else 3) for s in requested}


RETURN_TYPES = ('logits', 'loss', 'both')  # 'both': (logits, loss), as TransformerLens's forward gives them


def valid_names(model: Transformer) -> list[str]:
  return list(_valid_names(model.config))


@functools.lru_cache(maxsize=64)
def _valid_names(cfg) -> tuple[str, ...]:
  """Every call checks its site names against these: listed once per configuration."""
  sites = cfg.sites()
  has_mixture = {'values': cfg.symbolic_site('values'), 'ffn': cfg.symbolic_site('ffn')}
  return tuple(s for s in sites if not ((s.endswith('.v_mixture') and not has_mixture['values'])
                                        or (s.endswith('.ffn.mixture') and not has_mixture['ffn'])))


def check_names(model: Transformer, requested: Sequence[str], hooking: bool = False) -> None:
  """InputError naming the valid sites when a name is unknown; when ``hooking``, also for ``resid`` of a
  two-stream model, which is the sum X_t + X_e and not a value the model passes on."""
  valid = _valid_names(model.config)
  unknown = [n for n in requested if n not in valid]
  if unknown:
    raise InputError(f'unknown site name {unknown[0]!r}; this {model.config.kind} model has {list(valid)}')
  resid = [n for n in requested if n.endswith(names.READ_ONLY)] if hooking and model.config.kind != 'standard' else []
  if resid:
    raise InputError(names.read_only_message(resid[0]))


def _apply(model: Transformer, params, tokens, key_mask, fns: dict[str, Callable], keep, mutable: list[str]):
  """One forward pass with ``fns`` at their sites, caching the sites ``keep`` names (None: all; a frozenset
  of names; a predicate): compiled by the engine, the hooks' numbers and arrays its arguments
  (``symjax.interpret.engine``); run as it is inside a caller's trace (``jax.grad`` of a metric, a vmapped
  sweep), where the caller compiles."""
  model = core.analysis_model(model)
  check_head_hooks(model, fns)
  tokens = core.as_batch(tokens, model.config.vocab_size) if not isinstance(tokens, jax.core.Tracer) else tokens
  km = None if key_mask is None else (key_mask if isinstance(key_mask, jax.core.Tracer)
                                      else np.asarray(key_mask, bool).reshape(tokens.shape))
  plain = core.unboxed(params)
  traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(
      (tokens, km) if plain is params else (plain, tokens, km)))  # a registered tree holds concrete arrays
  params = plain
  keep_fn = keep.__contains__ if isinstance(keep, frozenset) else keep
  mutable_ = list(mutable) or False

  def make(hook_fns):
    def run(params, tokens, km):
      with names.session(hook_fns, keep_fn):
        return model.apply({'params': params}, tokens, km, mutable=mutable_)
    return run

  def eager(hook_fns):
    return make(hook_fns)(params, jnp.asarray(tokens), None if km is None else jnp.asarray(km))
  if traced:
    out = eager(fns)
  else:  # NumPy arguments: the compiled call copies them in faster than jnp.asarray would
    out = engine.hooked(('forward', model, keep, tuple(mutable)), fns, make, (params, tokens, km), eager)
  logits, state = out if mutable else (out, {})
  return model, tokens, logits, state


DECOMPOSE_MODES = ('all', 'attn', 'mlp')  # TransformerLens's decompose_resid modes ('mlp': the FFN updates)


@dataclasses.dataclass
class Cache(Mapping):
  """Every cached site of one forward pass, by name (``symjax.model.intermediates`` lists them with their
  shapes), as float32 NumPy arrays with the batch axis first (``ffn.hidden`` of symbolic channel FFNs is
  heads-major, as the model computes it)."""

  model: Transformer
  params: Any
  tokens: np.ndarray                 # [batch, time]
  arrays: dict[str, np.ndarray]
  intermediates: dict[str, Any]   # every site the pass sowed (the cached ones and ``names.SOWN``), by name
  decode: Callable | None = None
  key_mask: np.ndarray | None = None  # [batch, time], False at padding: the mask the pass ran with
  tensor: Callable | None = None      # what an array is read as (HookedModel's torch tensors); None: NumPy

  def __getitem__(self, name: str | tuple[str, int]) -> np.ndarray:
    """The array of a site: its name, or TransformerLens's (``('pattern', 0)``, ``'blocks.0.attn.hook_z'``)."""
    name = names.from_transformer_lens(name, self.model.config.num_layers)
    if name not in self.arrays:
      raise KeyError(f'{name!r} is not in this cache; it has {list(self.arrays)}')
    return self.arrays[name] if self.tensor is None else self.tensor(self.arrays[name])

  def __iter__(self) -> Iterator[str]:
    return iter(self.arrays)

  def __len__(self) -> int:
    return len(self.arrays)

  def _position(self, position: int) -> int:
    t = self.tokens.shape[1]
    if not -t <= position < t:
      raise InputError(f'position {position} is outside the input of {t} tokens (allowed: {-t}..{t - 1})')
    return position % t

  def _head(self, head: int | None) -> None:
    h = self.model.config.num_heads
    if head is not None and not 0 <= head < h:
      raise InputError(f'head {head} is out of range: the model has heads 0..{h - 1}')

  def _ranked(self, weights: np.ndarray, k: int) -> list[tuple[str | int, float]]:
    order = np.argsort(-weights, kind='stable')[:k]
    label = (lambda i: self.decode([int(i)])) if self.decode else int
    return [(label(i), float(weights[i])) for i in order]

  @functools.cached_property
  def trace(self) -> mixtures.MixtureTrace:
    """The exact mixture trace of this pass (all-symbolic models), computed once."""
    return mixtures.from_intermediates(self.model.config, self.tokens, core._unwrap(self.intermediates))

  def top_tokens(self, name: str, position: int, head: int | None = None, k: int = 5, batch: int = 0
                 ) -> list | dict[int, list]:
    """The k tokens of largest weight in the exact mixture at ``name`` and ``position``, with their weights:
    of a mixture site (``attn.v_mixture``, ``ffn.mixture``: α itself) or of a stream (``embed``,
    ``blocks.{l}.x_t``, ``.x_e``, ``.resid``: the exact trace, whose weights are the stream's own
    coefficients). One head's list, or {head: list} for every head. For the softmax lens, which exists
    for any model, see ``lens_top_tokens``."""
    pos, b = self._position(position), batch
    self._head(head)
    if name.endswith(('.v_mixture', '.ffn.mixture')):
      weights = self[name][b, pos]                                        # [heads, vocab]
    else:
      stream = {'x_t': 'x_t', 'x_e': 'x_e', 'resid': 'x'}
      if name == 'embed':
        layer, which = 0, 'x_t'
      else:
        parts = name.split('.')
        if len(parts) != 3 or parts[0] != 'blocks' or parts[2] not in stream:
          raise InputError(f'{name!r} has no exact mixture; top_tokens reads the mixture sites (attn.v_mixture, '
                           f'ffn.mixture) and the streams (embed, blocks.L.x_t, .x_e, .resid); see lens_top_tokens')
        layer, which = int(parts[1]) + 1, stream[parts[2]]
      if not self.model.config.exact_mixtures:
        raise InputError(f'{name!r}: this model\'s streams are not exact token mixtures (an all-symbolic model '
                         f'with both sites projected is needed); use lens_top_tokens for the softmax lens')
      weights = getattr(self.trace, which)[layer][b, pos]
    weights = weights[:, :self.model.config.vocab_size]
    if head is not None:
      return self._ranked(weights[head], k)
    return {h: self._ranked(weights[h], k) for h in range(weights.shape[0])}

  def lens_top_tokens(self, name: str, position: int, head: int | None = None, k: int = 5, batch: int = 0
                      ) -> list | dict[int, list]:
    """The softmax lens (each channel read through its embedding slice) of a ``[batch, time, d_model]`` site:
    a reading, not the model's own weights."""
    pos = self._position(position)
    self._head(head)
    x = self[name]
    if x.ndim != 3 or x.shape[-1] != self.model.config.d_model:
      raise InputError(f'the lens reads [batch, time, d_model] sites; {name!r} has shape {x.shape}')
    cfg = self.model.config
    lens = core.channel_lens(x[batch:batch + 1, pos:pos + 1], core.embedding_table(self.params), cfg.num_heads,
                             cfg.vocab_size)[0, 0]
    return self._ranked(lens[head], k) if head is not None else {h: self._ranked(lens[h], k)
                                                                  for h in range(cfg.num_heads)}

  @functools.cached_property
  def _inter(self) -> dict[str, Any]:
    return core._unwrap(self.intermediates)

  def decompose(self, position: int = -1) -> dict[str, np.ndarray]:
    """The exact stream attribution of the logits at ``position``, ``{term: [batch, vocab]}``: the embedding
    and every block's attention and FFN update, whose terms sum to this pass's logits, with the hooks and
    key mask it was cached with (``symjax.interpret.stream_attribution``)."""
    pos = self._position(position)
    parts = decomposition.attribution_of(self.model.config, self.params, self._inter)
    return {k: v[:, pos] for k, v in parts.items()}

  # TransformerLens's decomposition of the residual stream (symjax.interpret.decomposition), with its
  # arguments in its order, so that its users' calls run unchanged.
  def decompose_resid(self, layer: int | None = None, mlp_input: bool = False, mode: str = 'all',
                      apply_ln: bool = False, pos_slice: int | slice | None = None, incl_embeds: bool = True,
                      return_labels: bool = False):
    """The embedding and each block's attention and FFN update before block ``layer`` (None or -1: all),
    ``[components, batch, time, d_model]``; with every block they sum to the state the final norm reads.
    ``mlp_input``: block ``layer``'s attention update too (what its FFN reads); ``mode``: 'all', 'attn' or
    'mlp' (the FFN updates); ``incl_embeds``: the embedding term; ``apply_ln``: through the frozen final
    norm (``apply_ln_to_stack``). Two-stream labels name the stream each term is added to
    (``0_attn_out.x_t``, ``0_ffn_out.x_e``)."""
    if mode not in DECOMPOSE_MODES:
      raise InputError(f'mode must be one of {list(DECOMPOSE_MODES)}, got {mode!r}')
    cfg = self.model.config
    count = decomposition._layer_count(cfg, layer)
    terms = decomposition.block_terms(cfg, self._inter)               # embedding, then attention, FFN per block
    kept = [terms[0]] if incl_embeds else []
    for l in range(min(count + (mlp_input and count < cfg.num_layers), cfg.num_layers)):
      attn, ffn = terms[1 + 2 * l], terms[2 + 2 * l]
      kept += [t for t, part in ((attn, 'attn'), (ffn, 'mlp')) if mode in ('all', part) and (l < count or t is attn)]
    stack = (np.stack([t for _, t in kept]) if kept else np.zeros((0, *terms[0][1].shape)))
    stack = decomposition._positions(stack, pos_slice, 2)
    if apply_ln:
      stack = self._final_ln(stack, pos_slice, count, mlp_input)
    labels = [label for label, _ in kept]
    return (stack, labels) if return_labels else stack

  def accumulated_resid(self, layer: int | None = None, incl_mid: bool = False, apply_ln: bool = False,
                        pos_slice: int | slice | None = None, mlp_input: bool = False, return_labels: bool = False):
    """The residual stream entering each block up to ``layer`` (None or -1: all, and then the state the
    final norm reads), ``[states, batch, time, d_model]`` (X_t + X_e for two streams), labelled as
    TransformerLens labels them: ``0_pre`` (the embedding), ``1_pre``, ..., ``final_post``. ``incl_mid``: the
    state after each block's attention too (``{l}_mid``); ``mlp_input``: that of block ``layer`` last;
    ``apply_ln``: each state through the final norm with its own statistics, a(x) ⊙ (x − μ(x)) without β
    (the logit lens; every block only)."""
    cfg = self.model.config
    count = decomposition._layer_count(cfg, layer)
    terms = [t for _, t in decomposition.block_terms(cfg, self._inter)]
    states, labels, state = [], [], terms[0]
    for l in range(count + 1):
      if l == cfg.num_layers:
        states.append(state)
        labels.append('final_post')
        break
      states.append(state)
      labels.append(f'{l}_pre')
      if (incl_mid and l < count) or (mlp_input and l == count):
        states.append(state + terms[1 + 2 * l])
        labels.append(f'{l}_mid')
      state = state + terms[1 + 2 * l] + terms[2 + 2 * l]
    stack = decomposition._positions(np.stack(states), pos_slice, 2)
    if apply_ln:
      if count < cfg.num_layers:
        raise InputError(f'apply_ln reads each state through the final norm: stack every block (layer=None), '
                         f'got layer={layer!r} of {cfg.num_layers}')
      stack = self.apply_ln_to_stack(stack, recompute_ln=True)
    return (stack, labels) if return_labels else stack

  def stack_head_results(self, layer: int | None = None, return_labels: bool = False,
                         incl_remainder: bool = False, pos_slice: int | slice | None = None, apply_ln: bool = False):
    """Each head's term of the blocks before ``layer`` (None or -1: all), ``[layers × heads, batch, time,
    d_model]``, labels ``L{l}H{h}`` (``.x_t`` in two-stream models, where head h writes channel h of X_t).
    ``incl_remainder``: one more term, the rest of the final state (embedding, FFN updates, later blocks),
    so that the stack sums to the state the final norm reads; ``apply_ln``: through the frozen final norm."""
    cfg = self.model.config
    two = '' if cfg.kind == 'standard' else '.x_t'
    count = decomposition._layer_count(cfg, layer)
    blocks = range(count)
    labels = [f'L{l}H{h}{two}' for l in blocks for h in range(cfg.num_heads)]
    stack = (np.concatenate([decomposition.head_terms(cfg, self.params, self.arrays, l) for l in blocks])
             if labels else np.zeros((0, *self.arrays['embed'].shape)))
    if incl_remainder:
      rest = decomposition.final_state(cfg, self._inter) - stack.sum(0)
      stack, labels = np.concatenate([stack, rest[None]]), labels + ['remainder']
    stack = decomposition._positions(stack, pos_slice, 2)
    if apply_ln:
      stack = self._final_ln(stack, pos_slice, count, False)
    return (stack, labels) if return_labels else stack

  def get_full_resid_decomposition(self, layer: int | None = None, mlp_input: bool = False,
                                   expand_neurons: bool = True, apply_ln: bool = False,
                                   pos_slice: int | slice | None = None, return_labels: bool = False):
    """The stream entering block ``layer`` (None or -1: the state the final norm reads) as the embedding,
    every head (``L{l}H{h}``), every FFN neuron (``L{l}N{n}``: its activation times its row of the output
    matrix; ``expand_neurons=False``: each FFN's update, ``{l}_mlp_out``) and ``bias``, what no head or
    neuron owns (the output biases); the terms sum to that state exactly. ``mlp_input``: block ``layer``'s
    heads too. Two-stream labels name their stream (``.x_t``, ``.x_e``). A symbolic FFN writes a vocabulary
    projection of its neurons, not their sum, so its neurons are not terms: ``expand_neurons=False`` there."""
    cfg = self.model.config
    count = decomposition._layer_count(cfg, layer)
    terms = decomposition.block_terms(cfg, self._inter)
    at = lambda x: decomposition._positions(np.asarray(x, np.float64), pos_slice, 1)   # [batch, time, ...]
    two = cfg.kind != 'standard'
    heads, head_labels = self.stack_head_results(layer=min(count + mlp_input, cfg.num_layers), pos_slice=pos_slice,
                                                 return_labels=True)
    parts, labels = [at(terms[0][1])[None], heads], [terms[0][0], *head_labels]
    params = nn.meta.unbox(self.params)
    for l in range(count):
      ffn = params[f'layer_{l}']['ffn']
      if not expand_neurons:
        label, term = terms[2 + 2 * l]
        parts.append(at(term)[None])
        labels.append(label)
        continue
      if 'wo' not in ffn:
        raise InputError(f'block {l}\'s FFN is symbolic: its update is a vocabulary projection of its neurons, '
                         f'not their sum; use expand_neurons=False')
      hidden = at(self[f'blocks.{l}.ffn.hidden'])                                   # [batch, (time,) ff]
      w_out = np.asarray(ffn['wo']['kernel'], np.float64)                            # [ff, d_model]
      parts.append(np.moveaxis(hidden[..., None] * w_out, -2, 0))
      labels += [f'L{l}N{n}' + ('.x_e' if two else '') for n in range(w_out.shape[0])]
    stack = np.concatenate(parts)
    # The state these terms make, as accumulated_resid gives it; what they leave over is the biases'.
    state = self.accumulated_resid(layer=count, mlp_input=mlp_input, pos_slice=pos_slice)[-1]
    stack = np.concatenate([stack, (state - stack.sum(0))[None]])
    labels.append('bias')
    if apply_ln:
      stack = self._final_ln(stack, pos_slice, count, mlp_input)
    return (stack, labels) if return_labels else stack

  def _final_ln(self, stack: np.ndarray, pos_slice, count: int, mlp_input: bool) -> np.ndarray:
    """``apply_ln`` of a stack of every block's terms: the frozen final norm (a block's own norm, which
    TransformerLens applies to a stack that ends inside the model, is not what symjax's readout reads)."""
    if count < self.model.config.num_layers or mlp_input:
      raise InputError(f'apply_ln applies the final norm, frozen at this pass\'s final state: stack every block '
                       f'(layer=None, mlp_input=False), got {count} of {self.model.config.num_layers} blocks')
    return self.apply_ln_to_stack(stack, pos_slice=pos_slice)

  def apply_ln_to_stack(self, stack: np.ndarray, layer: int | None = None, mlp_input: bool = False,
                        pos_slice: int | slice | None = None, batch_slice: int | slice | None = None,
                        has_batch_dim: bool = True, recompute_ln: bool = False) -> np.ndarray:
    """Each term of ``stack`` (``[components, *batch_and_pos, d_model]``, or one state ``[*batch_and_pos,
    d_model]``) through the final norm with its scale frozen at this pass's final state, a ⊙ (c − μ(c)) (no β,
    which ``ln_bias_logits`` gives): linear, so the terms still add up. ``pos_slice`` and ``batch_slice``
    must be the ones the stack was made with (``has_batch_dim=False``: its batch axis was taken away);
    ``recompute_ln``: each term normalised by its own statistics instead (the logit lens). The arguments are
    TransformerLens's; ``layer`` and ``mlp_input`` name the norm, and symjax's readout reads the final one
    (layer None, -1 or the number of blocks)."""
    cfg = self.model.config
    if decomposition._layer_count(cfg, layer) < cfg.num_layers or mlp_input:
      raise InputError(f'apply_ln_to_stack applies the final norm: give layer=None (or -1, {cfg.num_layers}) and '
                       f'mlp_input=False, got layer={layer!r}, mlp_input={mlp_input!r}')
    stack = np.asarray(stack, np.float64)
    if recompute_ln:
      a, _ = core.final_norm_affine(cfg, self.params, stack)
      return a * core.centre(cfg, stack)
    a, _ = decomposition.frozen_norm(cfg, self.params, self._inter)
    a = decomposition._positions(decomposition._positions(a, pos_slice, 1), batch_slice, 0)
    if not has_batch_dim and not isinstance(batch_slice, (int, np.integer)):  # an integer took the axis away
      if a.shape[0] != 1:
        raise InputError(f'has_batch_dim=False needs a batch of one prompt (or batch_slice=i); this cache has '
                         f'{a.shape[0]}')
      a = a[0]
    if stack.shape[-a.ndim:] != a.shape:
      raise InputError(f'the stack has terms of shape {stack.shape[1:]}, this cache\'s final state {a.shape} '
                       f'(after pos_slice and batch_slice): make the stack with the same slices')
    return a * core.centre(cfg, stack)

  def _rows(self, tokens, shape) -> np.ndarray:
    try:
      tokens = np.broadcast_to(np.asarray(tokens), shape)
    except ValueError:
      raise InputError(f'tokens of shape {np.shape(tokens)} do not fit the stack\'s {shape} (batch, and time '
                       f'unless one position was taken)') from None
    return decomposition.readout_rows(self.model.config, self.params, tokens)

  def logit_attrs(self, stack: np.ndarray, tokens, incorrect_tokens=None, pos_slice: int | slice | None = None,
                  batch_slice: int | slice | None = None, has_batch_dim: bool = True) -> np.ndarray:
    """Each term's direct effect on the logit of ``tokens`` (minus that of ``incorrect_tokens``), through the
    frozen final norm: ``[components, batch(, time)]``. ``tokens``: one id, or one per batch row (and
    position). With every term, these plus ``ln_bias_logits`` are the logits themselves. ``pos_slice``,
    ``batch_slice``, ``has_batch_dim``: how the stack was sliced (``apply_ln_to_stack``)."""
    applied = self.apply_ln_to_stack(stack, pos_slice=pos_slice, batch_slice=batch_slice,
                                     has_batch_dim=has_batch_dim)
    rows = self._rows(tokens, applied.shape[1:-1])
    if incorrect_tokens is not None:
      rows = rows - self._rows(incorrect_tokens, applied.shape[1:-1])
    return decomposition.token_logits(applied, rows)

  def ln_bias_logits(self, tokens, incorrect_tokens=None, pos_slice: int | slice | None = None) -> np.ndarray:
    """The final norm's β read out at ``tokens`` (minus ``incorrect_tokens``): the part of the logits that no
    term of the stream owns, ``[batch(, time)]``."""
    _, beta = decomposition.frozen_norm(self.model.config, self.params, self._inter)
    beta = decomposition._positions(beta, pos_slice, 1)
    rows = self._rows(tokens, beta.shape[:-1])
    if incorrect_tokens is not None:
      rows = rows - self._rows(incorrect_tokens, beta.shape[:-1])
    return decomposition.token_logits(beta[None], rows)[0]

  def detect_head(self, pattern, exclude_bos: bool = False, exclude_current_token: bool = False) -> np.ndarray:
    """``[layers, heads]``: how much each head of this pass attends as ``pattern`` says
    (``symjax.interpret.patterns.detect_head``): 'previous_token_head', 'duplicate_token_head',
    'induction_head', or an array ``[query, key]`` / ``[batch, query, key]``."""
    attention = np.stack([self[f'blocks.{l}.attn.pattern'] for l in range(self.model.config.num_layers)])
    return patterns.detect_head(attention, pattern, self.tokens, self.key_mask, exclude_bos, exclude_current_token)

  def attention_figure(self, layer: int | None = None, batch: int = 0):
    """The cached attention pattern of every head of ``layer`` (default: every block) for prompt ``batch``,
    queries down and keys across, labelled with the tokens (its padding left out): a matplotlib Figure."""
    num_layers = self.model.config.num_layers
    if layer is not None and not 0 <= layer < num_layers:
      raise InputError(f'layer {layer} is out of range: the model has blocks 0..{num_layers - 1}')
    layers = range(num_layers) if layer is None else [layer]
    missing = [f'blocks.{l}.attn.pattern' for l in layers if f'blocks.{l}.attn.pattern' not in self.arrays]
    if missing:
      raise InputError(f'{missing[0]} is not in this cache: run_with_cache without names=, or name it')
    keep = np.ones(self.tokens.shape[1], bool) if self.key_mask is None else self.key_mask[batch]
    pattern = np.stack([self[f'blocks.{l}.attn.pattern'][batch] for l in layers])[:, :, keep][..., keep]
    labels = [lab for lab, k in zip(self.to_str_tokens(batch) if self.decode else
                                    [str(int(t)) for t in self.tokens[batch]], keep) if k]
    titles = [[f'L{l}.H{h}' for h in range(pattern.shape[1])] for l in layers]
    return patterns.attention_figure(pattern, labels, titles=titles)

  def to_str_tokens(self, batch: int = 0) -> list[str]:
    if self.decode is None:
      raise InputError('this cache has no tokenizer: pass decode= (e.g. run.tokenizer.decode) to run_with_cache')
    return [self.decode([int(t)]) for t in self.tokens[batch]]


@core.takes_hooked_model
def run_with_cache(model: Transformer, params, tokens, names_: Sequence[str] | Callable[[str], bool] | None = None,
                   key_mask=None, decode: Callable | None = None, hooks: dict[str, Callable] | None = None,
                   incl_grad: bool = False, metric: Callable[[jax.Array], jax.Array] | None = None
                   ) -> tuple[np.ndarray, Cache]:
  """Logits ``[batch, time, vocab]`` and a ``Cache`` of every named site (or of ``names_``: a list of names
  or a predicate on them), with ``hooks`` (as ``run_with_hooks``) applied while caching. ``incl_grad``: the
  cache also holds ``{site}_grad``, the gradient of ``metric`` (logits -> scalar, with ``jnp``) at each
  cached site that can be hooked (``site_gradients``)."""
  if incl_grad and metric is None:
    raise InputError('incl_grad=True needs metric= (a function of the logits giving a scalar, e.g. '
                     'lambda l: l[:, -1, answer].mean())')
  check_names(model, list(hooks or {}), hooking=True)
  if names_ is not None and not callable(names_):
    check_names(model, list(names_))
    keep = frozenset(names_)
  else:
    keep = names_
  analysis, tokens, logits, state = _apply(model, params, tokens, key_mask, hooks or {}, keep, [names.COLLECTION])
  km = None if key_mask is None else np.asarray(key_mask, bool).reshape(tokens.shape)
  sown = {n: np.asarray(v) for n, v in names.flat(state[names.COLLECTION]).items()}
  wanted = (lambda n: True) if keep is None else keep.__contains__ if isinstance(keep, frozenset) else keep
  # In the order the pass meets them (a compiled pass returns them sorted by name).
  cache = Cache(analysis, params, tokens, {n: sown[n] for n in valid_names(model) if n in sown and wanted(n)},
                sown, decode, km)
  if incl_grad:
    two_stream = model.config.kind != 'standard'
    sites = [n for n in cache.arrays if not (two_stream and n.endswith(names.READ_ONLY))]  # a read-only sum
    _, grads = site_gradients(model, params, tokens, metric, sites, key_mask, hooks)
    cache.arrays.update({f'{n}_grad': g for n, g in grads.items()})
  return np.asarray(logits), cache


@core.takes_hooked_model
def run_with_hooks(model: Transformer, params, tokens, hooks: dict[str, Callable], key_mask=None,
                   return_type: str = 'logits', targets=None, weights=None) -> np.ndarray | float:
  """The model with ``hooks`` {site name: ``fn(value, name) -> value``} applied where the sites are met.
  ``return_type='loss'``: the mean cross-entropy of ``targets`` (default: the next token of ``tokens``,
  weighted by ``weights`` where given); ``'both'``: (logits, loss)."""
  if return_type not in RETURN_TYPES:
    raise InputError(f'return_type must be one of {list(RETURN_TYPES)}, got {return_type!r}')
  check_names(model, list(hooks), hooking=True)
  _, tokens, logits, _ = _apply(model, params, tokens, key_mask, hooks, frozenset(), [])
  if return_type == 'logits':
    return np.asarray(logits)
  loss = next_token_loss(logits, tokens, targets, weights)
  return (np.asarray(logits), loss) if return_type == 'both' else loss


def next_token_nll(logits, tokens, targets=None) -> np.ndarray:
  """Each position's cross-entropy of ``targets`` under ``logits`` ``[batch, time, vocab]``, in float64; by
  default of each next token of ``tokens`` (``[batch, time - 1]``). A few small arrays: NumPy, not a string of
  eager JAX calls."""
  logits = np.asarray(logits, np.float64)
  if targets is None:
    logits, targets = logits[:, :-1], np.asarray(tokens)[:, 1:]
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  return -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]


def next_token_loss(logits, tokens, targets=None, weights=None) -> np.float64:
  """The mean of ``next_token_nll`` (``run_with_hooks``' loss), weighted by ``weights`` ``[batch, time]``
  where given."""
  nll = next_token_nll(logits, tokens, targets)
  if weights is not None and targets is None:
    weights = np.asarray(weights)[:, 1:]
  w = np.ones_like(nll) if weights is None else np.asarray(weights, np.float64)
  return np.float64((nll * w).sum() / max(w.sum(), 1e-9))


def hooked_logits(model: Transformer, params, tokens: jax.Array, key_mask: jax.Array | None,
                  fns: dict[str, Callable]) -> jax.Array:
  """The logits of ``model`` (an ``analysis_model``) with ``fns`` applied at their sites: arrays in, arrays
  out, no checks, so that it can be traced with every argument abstract (compiled sweeps)."""
  with names.session(fns, lambda name: False):
    return model.apply({'params': nn.meta.unbox(params)}, tokens, key_mask)


@core.takes_hooked_model
def apply_with_hooks(model: Transformer, params, tokens, hooks: dict[str, Callable], key_mask=None) -> jax.Array:
  """The logits ``[batch, time, vocab]`` of the model with ``hooks`` applied, as a JAX array: the functional
  core of ``run_with_hooks``, which ``jax.grad`` and ``jax.jit`` go through (hooks written with ``jnp``)."""
  check_names(model, list(hooks), hooking=True)
  return _apply(model, params, tokens, key_mask, hooks, frozenset(), [])[2]


@core.takes_hooked_model
def site_gradients(model: Transformer, params, tokens, metric: Callable[[jax.Array], jax.Array],
                   names_: Sequence[str], key_mask=None, hooks: dict[str, Callable] | None = None
                   ) -> tuple[float, dict[str, np.ndarray]]:
  """(metric of the logits, {site: ∂ metric / ∂ its value}): the gradient at each named site through the
  rest of the model (TransformerLens's backward hooks), with ``hooks`` applied as in the forward pass.
  ``metric`` maps the logits to a scalar with ``jnp``. A zero is added at each site, and the gradients are
  those of the metric with respect to these zeros."""
  names_ = list(names_)
  check_names(model, names_ + list(hooks or {}), hooking=True)
  _, cache = run_with_cache(model, params, tokens, names_, key_mask=key_mask, hooks=hooks)

  def with_deltas(deltas):
    fns = dict(hooks or {})
    for n in names_:
      inner = fns.get(n)
      fns[n] = lambda v, name, n=n, inner=inner: (inner(v, name) if inner else v) + deltas[n].astype(v.dtype)
    return metric(apply_with_hooks(model, params, tokens, fns, key_mask))

  value, grads = jax.value_and_grad(with_deltas)({n: jnp.zeros(cache[n].shape, jnp.float32) for n in names_})
  return float(value), {n: np.asarray(g) for n, g in grads.items()}


@core.takes_hooked_model
def attribution_patch(model: Transformer, params, clean, corrupt, metric: Callable[[jax.Array], jax.Array],
                      names_: Sequence[str], key_mask=None) -> dict[str, np.ndarray]:
  """Attribution patching: the first-order estimate of what patching each site from ``clean`` into
  ``corrupt`` does to ``metric``, (clean − corrupt) ⊙ ∂metric/∂site at the corrupt run, summed over the
  site's last axis: ``[batch, time]`` for a state, ``[batch, time, heads]`` for a per-head site
  (``attn.z``, ``attn.q``...), ``[batch, heads, query]`` for ``attn.pattern`` and ``attn.scores``. Summed
  over any positions and heads, it estimates patching those; it is exact for a metric linear in the site."""
  names_ = list(names_)
  _, clean_cache = run_with_cache(model, params, clean, names_, key_mask=key_mask)
  _, corrupt_cache = run_with_cache(model, params, corrupt, names_, key_mask=key_mask)
  _, grads = site_gradients(model, params, corrupt, metric, names_, key_mask)
  return {n: ((clean_cache[n].astype(np.float64) - corrupt_cache[n]) * grads[n]).sum(-1) for n in names_}


def chain(fns: tuple[Callable, ...]) -> Callable:
  """One hook running ``fns`` in order (a None result leaves the value as it is); the engine reads the
  functions it closes over as hooks (``symjax.interpret.engine``)."""
  if len(fns) == 1:
    return fns[0]

  def chained(value, name):
    for fn in fns:
      out = fn(value, name)
      value = value if out is None else out
    return value
  return chained


def check_head_hooks(model: Transformer, fns: dict[str, Callable]) -> None:
  """InputError for a per-head hook (``zero_head``) naming a head the model lacks, before the pass runs: raised
  inside it, the error would come out of JAX's trace with its traceback note appended."""
  heads = model.config.num_heads
  for name, fn in fns.items():
    head = fn.keywords.get('head') if isinstance(fn, functools.partial) and fn.func is _zero_head else None
    if head is not None and not 0 <= head < heads:
      raise InputError(_head_out_of_range(head, name, heads))


def _head_out_of_range(head: int, name: str, heads: int) -> str:
  return f'zero_head({head}) at {name}: head out of range, the model has heads 0..{heads - 1}'


def _zero_head(value, name, head):
  axis = 1 if name.endswith(('.scores', '.pattern')) else value.ndim - 2
  # .at[] would drop an index out of range without a word; a traced head was checked by check_head_hooks.
  if not isinstance(head, jax.core.Tracer) and not 0 <= head < value.shape[axis]:
    raise InputError(_head_out_of_range(head, name, value.shape[axis]))
  chosen = (jnp.arange(value.shape[axis]) == head).reshape([-1 if a == axis else 1 for a in range(value.ndim)])
  return jnp.where(chosen, jnp.zeros((), value.dtype), value)


def zero_head(head: int) -> Callable:
  """A hook for a per-head site (``attn.q``, ``.k``, ``.values``, ``.z`` ``[..., heads, d]``; ``.scores``,
  ``.pattern`` ``[batch, heads, ...]``) that sets one head to zero. The head is the hook's data, so a loop
  over heads compiles one program (``symjax.interpret.engine``)."""
  return functools.partial(_zero_head, head=head)
