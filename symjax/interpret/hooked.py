"""A trained model as one object with TransformerLens's calls, so that each call need not restate the model,
its parameters and its tokenizer:

  hm = interpret.HookedModel(symjax.load('runs/symbolic'))
  logits, cache = hm.run_with_cache('<s> a 1 b 2 c 3 d 0 a')
  hm.to_str_tokens('<s> a 1 b 2')

Every call takes a text, a list of texts (padded to one length, with the key mask carried along), a 1-D
sequence of token ids or a 2-D batch of them. The functional API (``run_with_cache(model, params, ids)``)
stays for composing JAX code; this object calls it, with no second implementation of the model.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from symjax.interpret import core, engine, generation, grid, hooks
from symjax.model import intermediates as site_names
from symjax.run import sample
from symjax.system.errors import InputError

# Hooks as a dict {site: fn(value, name)}, or as TransformerLens writes them: a list of (site, fn) pairs.
Hooks = dict[str, Callable] | Sequence[tuple[str, Callable]]

# What the object's calls return: NumPy arrays, or torch tensors (``tensors='torch'``) for code written against
# TransformerLens, whose hooks then receive torch tensors too where they cannot run compiled.
TENSORS = ('numpy', 'torch')


class Tokens(np.ndarray):
  """Token ids ``[batch, time]`` as ``to_tokens`` gives them, carrying the key mask of texts padded to one
  length (``key_mask``; None where nothing is padded), so that the ids passed back to any call run with their
  padding masked."""

  key_mask: np.ndarray | None = None

  def __array_finalize__(self, obj) -> None:
    self.key_mask = None  # a slice or a sum of token ids is new ids: it carries no mask


def _torch():
  try:
    import torch
  except ImportError:
    raise InputError("tensors='torch' needs PyTorch (pip install torch); tensors='numpy' needs nothing") from None
  return torch


def _torch_hook(fn: Callable) -> Callable:
  """``fn``, written for torch tensors, as a hook: compiled where it runs on JAX's traced values as it is (an
  in-place write, arithmetic), else (``engine.NeedsConcrete``) eagerly, on a torch tensor of the value."""
  def torch_hook(value, hook):
    if isinstance(value, jax.core.Tracer):
      try:
        return site_names.call_hook(fn, value, str(hook))
      except InputError:
        raise
      except Exception as e:  # noqa: BLE001 (a torch method, a torch tensor it writes to: it runs eagerly)
        raise engine.NeedsConcrete(f'{fn!r} at {hook}') from e
    tensor = _torch().from_numpy(np.array(value))
    out = fn(tensor, hook)
    return jnp.asarray(np.asarray((tensor if out is None else out).detach().cpu()))
  return torch_hook


def hook_pairs(fwd_hooks: Hooks | None) -> list[tuple[str, Callable]]:
  """The (site, fn) pairs of either form, in order."""
  if not fwd_hooks:
    return []
  pairs = list(fwd_hooks.items()) if isinstance(fwd_hooks, dict) else list(fwd_hooks)
  if not all(isinstance(p, tuple) and len(p) == 2 and (isinstance(p[0], str) or callable(p[0])) and callable(p[1])
             for p in pairs):
    raise InputError('fwd_hooks must be a dict {site: fn} or a list of (site, fn) pairs (a site: a name, or a '
                     'predicate over names)')
  return pairs


def hook_dict(fwd_hooks: Hooks | None, num_layers: int) -> dict[str, Callable]:
  """{site: fn} of either form, the sites under symjax's names (TransformerLens's are translated); several
  hooks at one site run in order, each on what the one before returned."""
  by_site: dict[str, list[Callable]] = {}
  for site, fn in hook_pairs(fwd_hooks):
    by_site.setdefault(site_names.from_transformer_lens(site, num_layers), []).append(fn)
  return {site: hooks.chain(tuple(fns)) for site, fns in by_site.items()}


def _sampling_mode(mode, do_sample, temperature, top_k, top_p) -> str:
  """``generate``'s mode: the one named, else sampling where TransformerLens's arguments ask for it. A
  sampling argument given to a greedy call is an error, not ignored."""
  given = [n for n, v in (('temperature', temperature), ('top_k', top_k), ('top_p', top_p)) if v is not None]
  if mode is None:
    if do_sample is False or (do_sample is None and not given):
      mode = 'greedy'
    else:
      mode = 'top_p' if top_p is not None else 'top_k' if top_k is not None else 'temperature'
  if mode not in sample.MODES:
    raise InputError(f'mode must be one of {list(sample.MODES)}, got {mode!r}')
  if mode == 'greedy' and given:
    raise InputError(f'{", ".join(given)} given to greedy decoding, which takes none: pass do_sample=True or a '
                     f'sampling mode ({", ".join(sample.MODES[1:])})')
  return mode


def _is_batch(inputs) -> bool:
  """A list of texts, a list of id lists or a 2-D array, as against one text or one id sequence."""
  if isinstance(inputs, str):
    return False
  if isinstance(inputs, np.ndarray):
    return inputs.ndim == 2
  return bool(inputs) and isinstance(inputs[0], (str, Sequence, np.ndarray))


class HookedModel:
  """``HookedModel(run)`` for a loaded run (``symjax.load``), or ``HookedModel(model, params, tokenizer)``
  (the tokenizer is needed only for text: anything with ``encode(text) -> ids`` and ``decode(ids) -> text``).
  ``tensors='torch'``: every call returns torch tensors and takes them, and a hook that needs torch's methods
  receives a torch tensor (TransformerLens's code runs with only its model construction changed)."""

  def __init__(self, run_or_model, params=None, tokenizer=None, tensors: str = 'numpy'):
    if tensors not in TENSORS:
      raise InputError(f'tensors must be one of {list(TENSORS)}, got {tensors!r}')
    if tensors == 'torch':
      _torch()
    self.tensors = tensors
    if params is None:  # a loaded run
      if not all(hasattr(run_or_model, a) for a in ('model', 'params')):
        raise InputError('HookedModel takes a loaded run (symjax.load(workdir)) or a model and its params')
      run_or_model, params, tokenizer = run_or_model.model, run_or_model.params, run_or_model.tokenizer
    self.model, self.params, self.tokenizer = run_or_model, params, tokenizer
    self._hooks: list[tuple[str, Callable]] = []   # add_hook's, run before each call's own

  # TransformerLens's hooks that stay on the model: every call of this object runs them.
  def add_hook(self, name: str | Callable[[str], bool], hook: Callable) -> None:
    """Runs ``hook`` at site ``name`` (or at every site the predicate ``name`` accepts) in every later call
    of this object, until ``reset_hooks``. Functions that take the model object (patching, traces) run the
    model without them and say so."""
    pairs = self._expanded([(name, hook)])
    # The form and the names are checked now, not at the next call.
    hooks.check_names(self.model, list(hook_dict(pairs, self.cfg.num_layers)), hooking=True)
    self._hooks += pairs

  def reset_hooks(self) -> None:
    """Removes every hook ``add_hook`` (or an open ``hooks`` block) added."""
    self._hooks = []

  @contextlib.contextmanager
  def hooks(self, fwd_hooks: Hooks = ()):
    """``with hm.hooks(fwd_hooks=[(site, fn)]):`` every call inside runs these hooks too."""
    before = list(self._hooks)
    try:
      for site, fn in hook_pairs(fwd_hooks):
        self.add_hook(site, fn)
      yield self
    finally:
      self._hooks = before

  def _expanded(self, pairs: list[tuple]) -> list[tuple[str, Callable]]:
    """The pairs with a predicate over site names (symjax's or TransformerLens's) as one pair per site it
    accepts."""
    out = []
    for name, fn in pairs:
      if callable(name):
        accepts = site_names.transformer_lens_predicate(name, self.cfg.num_layers)
        out += [(n, fn) for n in hooks.valid_names(self.model) if accepts(n)]
      else:
        out.append((name, fn))
    return out

  def _all_hooks(self, fwd_hooks: Hooks | None) -> dict[str, Callable]:
    pairs = self._hooks + self._expanded(hook_pairs(fwd_hooks))
    if self.tensors == 'torch':
      pairs = [(site, _torch_hook(fn)) for site, fn in pairs]
    return hook_dict(pairs, self.cfg.num_layers)

  def _out(self, x):
    """A result as this object returns it: NumPy, or a torch tensor of it."""
    if self.tensors == 'numpy' or x is None:
      return x
    if isinstance(x, tuple):
      return tuple(self._out(v) for v in x)
    return _torch().from_numpy(np.array(x))

  @property
  def params(self):
    """The parameters, without Flax's partitioning boxes (assigning new ones is allowed)."""
    return self._params

  @params.setter
  def params(self, params):
    self._params = core.plain_params(params)

  def __repr__(self) -> str:
    """What TransformerLens's users read off a loaded model: its kind and shape, and its size."""
    c = self.model.config
    n = sum(int(np.size(p)) for p in jax.tree.leaves(self.params))
    return (f'HookedModel({c.kind}: {c.num_layers} layers, {c.num_heads} heads × {c.head_dim}, vocabulary '
            f'{c.vocab_size}, context {c.max_len}, {n:,} parameters)')

  @property
  def cfg(self):
    """The model's ``ModelConfig`` (TransformerLens's ``cfg``)."""
    return self.model.config

  def _encoded(self, text: str, prepend_bos: bool | None = None) -> np.ndarray:
    if self.tokenizer is None:
      raise InputError('this HookedModel has no tokenizer: pass token ids, or build it from symjax.load(...) or '
                       'with tokenizer=')
    ids = np.asarray(self.tokenizer.encode(text), np.int32).reshape(-1)
    if prepend_bos:
      bos = np.asarray(self.tokenizer.encode('<s>'), np.int32).reshape(-1)
      if bos.size != 1:
        raise InputError("prepend_bos=True needs a tokenizer with a '<s>' token; this one has none")
      ids = ids if ids.size and ids[0] == bos[0] else np.concatenate([bos, ids])
    if ids.size == 0:
      raise InputError(f'{text!r} is empty after tokenisation')
    return ids

  def to_tokens(self, inputs, pad_id: int = 0, prepend_bos: bool | None = None, padding_side: str | None = None,
                move_to_device: bool = True, truncate: bool = True):
    """Token ids ``[batch, time]`` (``Tokens``, or a torch tensor): a text or a 1-D id sequence is a batch of
    one; texts or id lists of unequal length are padded at the end with ``pad_id``, and the ids carry their
    key mask (``.key_mask``, False at the padding; None when nothing is padded), which every call reads.
    ``prepend_bos=True`` starts each text with the tokenizer's ``<s>`` where it does not already.
    TransformerLens's ``padding_side`` may be 'right' (the only side symjax pads); its ``move_to_device``
    and ``truncate`` change nothing here (the ids stay on the host, and a too-long input is refused by the
    call that runs it)."""
    if padding_side not in (None, 'right'):
      raise InputError(f"padding_side must be 'right' (symjax pads at the end, the key mask marking it), got "
                       f'{padding_side!r}')
    ids, mask = self._tokens_and_mask(inputs, pad_id, prepend_bos)
    out = self._out(ids) if self.tensors == 'torch' else ids.view(Tokens)
    out.key_mask = mask
    return out

  def _tokens_and_mask(self, inputs, pad_id: int = 0, prepend_bos: bool | None = None
                       ) -> tuple[np.ndarray, np.ndarray | None]:
    if isinstance(inputs, str):
      rows = [self._encoded(inputs, prepend_bos)]
    elif hasattr(inputs, '__array__') or (isinstance(inputs, Sequence) and inputs and not _is_batch(inputs)):
      ids = np.asarray(inputs)
      if ids.ndim not in (1, 2):
        raise InputError(f'token ids must be 1-D (one prompt) or 2-D (a batch), got shape {ids.shape}')
      mask = getattr(inputs, 'key_mask', None)
      return ids.reshape(1, -1) if ids.ndim == 1 else ids, mask
    elif isinstance(inputs, Sequence) and inputs:
      rows = [self._encoded(x, prepend_bos) if isinstance(x, str) else np.asarray(x, np.int32).reshape(-1)
              for x in inputs]
    else:
      raise InputError(f'inputs must be a text, a list of texts, or token ids; got {type(inputs).__name__}')
    length = max(len(r) for r in rows)
    ids = np.full((len(rows), length), pad_id, np.int32)
    mask = np.zeros((len(rows), length), bool)
    for i, r in enumerate(rows):
      ids[i, :len(r)], mask[i, :len(r)] = r, True
    return ids, (None if mask.all() else mask)

  def to_str_tokens(self, inputs) -> list[str] | list[list[str]]:
    """Each token of a text or of one id sequence as its string; a list per row for a batch (padding left
    out)."""
    ids, mask = self._tokens_and_mask(inputs)
    mask = np.ones(ids.shape, bool) if mask is None else mask
    rows = [[self.to_string([t]) for t, keep in zip(row, m) if keep] for row, m in zip(ids, mask)]
    return rows if _is_batch(inputs) else rows[0]

  def to_string(self, ids) -> str:
    """The text of token ids."""
    if self.tokenizer is None:
      raise InputError('this HookedModel has no tokenizer to decode with')
    return self.tokenizer.decode([int(i) for i in np.asarray(ids).reshape(-1)])

  def __call__(self, inputs, return_type: str | None = 'logits', key_mask=None, **kw) -> Any:
    """The logits ``[batch, time, vocab]`` (or the loss: ``return_type='loss'``; both: ``'both'``; nothing:
    None) of the inputs."""
    return self.run_with_hooks(inputs, {}, return_type=return_type, key_mask=key_mask, **kw)

  def loss_fn(self, logits, tokens, per_token: bool = False, attention_mask=None):
    """TransformerLens's ``loss_fn``: the cross-entropy of each next token of ``tokens`` under ``logits``
    ``[batch, time, vocab]``, ``[batch, time - 1]`` with ``per_token``, else its mean (over the real tokens
    where ``attention_mask`` says which)."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or np.shape(logits)[:2] != tokens.shape:
      raise InputError(f'logits {np.shape(logits)} and tokens {tokens.shape} must share [batch, time]')
    if per_token:
      return self._out(hooks.next_token_nll(logits, tokens).astype(np.float32))
    return self._out(hooks.next_token_loss(logits, tokens, weights=attention_mask))

  def to_single_token(self, text: str) -> int:
    """The id of a text that is one token (TransformerLens's ``to_single_token``)."""
    ids = self._encoded(text)
    if ids.size != 1:
      raise InputError(f'{text!r} is {ids.size} tokens, not one: {self.to_str_tokens(text)}')
    return int(ids[0])

  @property
  def W_E(self) -> np.ndarray:  # noqa: N802 (TransformerLens's name)
    """The input embedding ``[vocab, d_model]`` (token rows; positions, where learned, are apart)."""
    return core.embedding_table(self._tables())[:self.cfg.vocab_size]

  @property
  def W_U(self) -> np.ndarray:  # noqa: N802 (TransformerLens's name)
    """The readout ``[d_model, vocab]``: logits = LN_f(x) @ W_U (the embedding's transpose when tied)."""
    return core.readout_table(self.cfg, self._tables()).T

  def tokens_to_residual_directions(self, tokens) -> np.ndarray:
    """The readout's direction of each token, ``[..., d_model]``: a state's logit of the token is its final
    norm's output dotted with it (TransformerLens's ``tokens_to_residual_directions``); text works too."""
    ids = self._encoded(tokens) if isinstance(tokens, str) else np.asarray(tokens)
    if ids.size and not (np.issubdtype(ids.dtype, np.integer) and 0 <= ids.min() and ids.max() < self.cfg.vocab_size):
      raise InputError(f'tokens must be ids in 0..{self.cfg.vocab_size - 1}, got {ids.tolist()}')
    directions = self.W_U.T[ids]
    return directions[0] if isinstance(tokens, str) and ids.size == 1 else directions

  def _tables(self):
    if self.cfg.kind == 'program':
      raise InputError('a Transformer Program (model.kind program) has no embedding or readout matrix: its '
                       'variables are one-hot; read its program with python -m symjax.decompile')
    return self.params

  def run_with_cache(self, inputs, names: Sequence[str] | str | Callable[[str], bool] | None = None,
                     fwd_hooks: Hooks | None = None, key_mask=None, *, names_filter=None, incl_grad: bool = False,
                     metric: Callable | None = None, return_type: str = 'logits') -> tuple[Any, hooks.Cache]:
    """``symjax.interpret.run_with_cache`` on the inputs, the padding masked (``fwd_hooks`` applied while
    caching). ``names_filter`` is TransformerLens's name for ``names`` (a site, a list of them or a predicate);
    ``incl_grad`` adds each cached site's gradient of ``metric`` as ``{site}_grad``. ``return_type``: as
    ``__call__``'s."""
    if return_type not in ('logits', 'loss', 'both', None):
      raise InputError(f"return_type must be one of ['logits', 'loss', 'both', None], got {return_type!r}")
    if names is not None and names_filter is not None:
      raise InputError('pass the sites to cache as names= or names_filter=, not both')
    names = names_filter if names is None else names
    if callable(names):
      names = site_names.transformer_lens_predicate(names, self.cfg.num_layers)
    elif names is not None:
      names = [site_names.from_transformer_lens(n, self.cfg.num_layers)
               for n in ([names] if isinstance(names, str) else names)]
    ids, mask = self._ids_and_mask(inputs, key_mask)
    decode = (lambda i: self.to_string(i)) if self.tokenizer is not None else None
    logits, cache = hooks.run_with_cache(self.model, self.params, ids, names, key_mask=mask, decode=decode,
                                         hooks=self._all_hooks(fwd_hooks), incl_grad=incl_grad, metric=metric)
    if self.tensors == 'torch':
      cache.tensor = self._out
    if return_type in ('loss', 'both'):
      loss = hooks.next_token_loss(logits, ids)
      return (self._out(loss) if return_type == 'loss' else (self._out(logits), self._out(loss))), cache
    return (None if return_type is None else self._out(logits)), cache

  def run_with_hooks(self, inputs, fwd_hooks: Hooks, return_type: str | None = 'logits', key_mask=None,
                     **kw) -> Any:
    """``symjax.interpret.run_with_hooks`` on the inputs, the padding masked; ``return_type=None`` runs the
    pass for its hooks alone and returns None."""
    ids, mask = self._ids_and_mask(inputs, key_mask)
    fns = self._all_hooks(fwd_hooks)
    out = hooks.run_with_hooks(self.model, self.params, ids, fns, key_mask=mask,
                               return_type='logits' if return_type is None else return_type, **kw)
    return None if return_type is None else self._out(out)

  def sweep_hooks(self, inputs, site: str, hook: Callable, over: dict, return_type: str = 'loss',
                  metric: Callable | None = None, key_mask=None) -> np.ndarray:
    """One hook over a grid of its arguments, every setting in one compiled program
    (``symjax.interpret.grid.sweep_hooks``): ``hm.sweep_hooks(text, 'blocks.{layer}.attn.z', ablate,
    over={'layer': range(hm.cfg.n_layers), 'head': range(hm.cfg.n_heads)})`` gives ``[layers, heads]`` losses.
    """
    ids, mask = self._ids_and_mask(inputs, key_mask)
    if self._hooks:
      raise InputError('sweep_hooks runs one hook per setting: call it after hm.reset_hooks() or outside the '
                       'with block')
    return grid.sweep_hooks(self.model, self.params, ids, site, hook, over, key_mask=mask, return_type=return_type,
                            metric=metric)

  def _ids_and_mask(self, inputs, key_mask):
    ids, mask = self._tokens_and_mask(inputs)
    if key_mask is not None:
      if mask is not None:
        raise InputError('texts of unequal length carry their own key mask: pass key_mask= only with token ids')
      mask = np.asarray(key_mask, bool).reshape(ids.shape)
    return ids, mask

  def generate(self, inputs, max_new_tokens: int, stop_token: int | str | None = None,
               fwd_hooks: Hooks | None = None, mode: str | None = None, temperature: float | None = None,
               top_k: int | None = None, top_p: float | None = None, seed: int = 0, *,
               do_sample: bool | None = None, eos_token_id: int | None = None, use_past_kv_cache: bool = True):
    """Continues every prompt of ``inputs`` (texts of unequal length too) by up to ``max_new_tokens`` tokens,
    with ``fwd_hooks`` applied at every step; a row stops after ``stop_token`` (an id, or a text of one
    token; TransformerLens's ``eos_token_id`` too). Greedy unless sampling is asked for: ``mode``
    ('temperature', 'top_k', 'top_p'), ``do_sample=True``, or a ``temperature``, ``top_k`` or ``top_p``
    (the last given of top_p, top_k picks the filter, as in TransformerLens). Returns what came in: a text
    (or a list of texts) with its continuation, else an id array per prompt.

    The prompts run once and each new token over its own position, reading the kept keys and values, all in
    one compiled loop (``symjax.interpret.generation``; hooks then see each new position alone, as with
    TransformerLens's cache). ``use_past_kv_cache=False``, or a model the cache does not apply to, runs the
    full pass over one fixed buffer per token (the models are causal, so the tokens after a row's end change
    nothing before it)."""
    mode = _sampling_mode(mode, do_sample, temperature, top_k, top_p)
    temperature, top_k, top_p = (1.0 if temperature is None else temperature, 40 if top_k is None else top_k,
                                 0.9 if top_p is None else top_p)
    if eos_token_id is not None:
      if stop_token is not None and stop_token != eos_token_id:
        raise InputError(f'stop_token={stop_token!r} and eos_token_id={eos_token_id!r} disagree: give one')
      stop_token = eos_token_id
    if max_new_tokens < 1:
      raise InputError(f'max_new_tokens must be >= 1, got {max_new_tokens}')
    if not self.cfg.causal:
      raise InputError('generate continues text left to right: this model is not causal (model.causal=False)')
    ids, mask = self._ids_and_mask(inputs, None)
    lengths = ids.shape[1] - np.argmax(mask[:, ::-1], axis=1) if mask is not None else np.full(len(ids),
                                                                                                ids.shape[1])
    total = ids.shape[1] + max_new_tokens
    if total > self.cfg.max_len:
      raise InputError(f'the longest prompt ({ids.shape[1]} tokens) plus {max_new_tokens} new tokens = {total} '
                       f'exceeds model.max_len = {self.cfg.max_len}')
    stop = self._stop_id(stop_token)
    prompts = np.where(mask if mask is not None else True, ids, 0).astype(np.int32)
    fns = self._all_hooks(fwd_hooks)
    loop = lambda fns: self._generate_per_pass(prompts, lengths, max_new_tokens, fns, mode, temperature, top_k,
                                               top_p, stop, seed)
    if use_past_kv_cache and generation.applies(self.model, total):
      out = generation.generate(self.model, self.params, prompts, lengths, max_new_tokens, fns, mode, temperature,
                                top_k, top_p, stop, seed, loop)
    else:
      out = loop(fns)
    if isinstance(inputs, str):
      return self.to_string(out[0])
    if _is_batch(inputs) and isinstance(inputs[0], str):
      return [self.to_string(o) for o in out]
    out = [self._out(o) for o in out]
    return out if _is_batch(inputs) else out[0]

  def _generate_per_pass(self, prompts, lengths, max_new_tokens, fns, mode, temperature, top_k, top_p, stop, seed
                         ) -> list[np.ndarray]:
    """``generate`` without a cache: every step the full pass over one fixed buffer."""
    buffer = np.zeros((len(prompts), prompts.shape[1] + max_new_tokens), np.int32)
    buffer[:, :prompts.shape[1]] = prompts
    ends, done = np.asarray(lengths).copy(), np.zeros(len(prompts), bool)
    rows, rng = np.arange(len(prompts)), jax.random.key(seed)
    for _ in range(max_new_tokens):
      logits = np.asarray(hooks.apply_with_hooks(self.model, self.params, buffer, fns))[rows, ends - 1]
      if mode == 'greedy':
        token = logits.argmax(-1)
      else:
        rng, key = jax.random.split(rng)
        filtered = jax.vmap(lambda x: sample.filter_logits(x, mode, temperature, top_k, top_p))(jnp.asarray(logits))
        token = np.asarray(jax.random.categorical(key, filtered))
      live = ~done
      buffer[rows[live], ends[live]] = token[live]
      ends = ends + live
      done |= live & (token == stop) if stop is not None else done
      if done.all():
        break
    return [buffer[i, :ends[i]] for i in rows]

  def _stop_id(self, stop_token) -> int | None:
    if stop_token is None or isinstance(stop_token, (int, np.integer)):
      if stop_token is not None and not 0 <= stop_token < self.cfg.vocab_size:
        raise InputError(f'stop_token must be a token id in [0, {self.cfg.vocab_size}), got {stop_token}')
      return stop_token
    ids = self._encoded(stop_token)
    if ids.size != 1:
      raise InputError(f'stop_token {stop_token!r} is {ids.size} tokens; give one token')
    return int(ids[0])

  def test_prompt(self, prompt, answer, top_k: int = 10, prepend_space: bool = False, print_details: bool = True
                  ) -> dict[str, Any]:
    """TransformerLens's ``test_prompt``: how the model continues ``prompt`` with ``answer`` (a text or token
    ids), token by token: each answer token's rank, logit and probability, and the ``top_k`` tokens the model
    predicted there. Printed as a table (``print_details``) and returned."""
    prompt_ids = self._tokens_and_mask(prompt)[0][0]
    answer_ids = (self._encoded(answer) if isinstance(answer, str)
                  else np.asarray(answer, np.int32).reshape(-1))
    if prepend_space and isinstance(answer, str):
      answer_ids = self._encoded(' ' + answer)
    ids = np.concatenate([prompt_ids, answer_ids])
    logits = np.asarray(self(ids), np.float64)[0]
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    label = (lambda i: self.to_string([i])) if self.tokenizer is not None else str
    steps = []
    for j, token in enumerate(answer_ids):
      at = len(prompt_ids) - 1 + j
      order = np.argsort(-logits[at], kind='stable')
      steps.append({'token': label(int(token)), 'id': int(token), 'rank': int(np.flatnonzero(order == token)[0]),
                    'logit': float(logits[at, token]), 'prob': float(np.exp(logp[at, token])),
                    'top': [(label(int(t)), float(np.exp(logp[at, t]))) for t in order[:top_k]]})
    if print_details:
      print(f'prompt: {[label(int(t)) for t in prompt_ids]}')
      print(f'answer: {[s["token"] for s in steps]}')
      for s in steps:
        top = ', '.join(f'{t!r} {p:.2%}' for t, p in s['top'])
        print(f'  {s["token"]!r}: rank {s["rank"]}, logit {s["logit"]:.2f}, prob {s["prob"]:.2%} | top: {top}')
    return {'prompt': [label(int(t)) for t in prompt_ids], 'answer': steps}
