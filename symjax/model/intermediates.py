"""The one list of the named sites of a forward pass, for every reader: caches and hooks, distillation, the
interpretability tools.

Every site has one name, listed below (``blocks.{l}`` is block l, 0 = the first). The sites in ``SOWN`` are
written into the ``intermediates`` collection on every pass that makes it mutable
(``model.apply(variables, tokens, mutable=['intermediates'])``); ``flat(state['intermediates'])`` reads them
back as {name: array}. A hook session (``session``, used by ``symjax.interpret.run_with_cache`` and
``run_with_hooks``) sows any other site it keeps and replaces any site it hooks.
"""

import contextlib
import contextvars
import dataclasses
import dis
import functools
import re
from typing import Callable, Iterator

from symjax.system.errors import InputError

COLLECTION = 'intermediates'
# Sown on every pass that makes COLLECTION mutable (the rest only when a hook session keeps them).
SOWN = ('embed', 'attn.pattern', 'attn.v_mixture', 'ffn.mixture', 'x_t_mid', 'x_e_mid', 'resid_mid', 'x_t', 'x_e',
        'resid')


def flat(tree) -> dict:
  """The ``intermediates`` collection (nested by module, each value a 1-tuple) as {site name: value}, values
  keeping their type (JAX inside a step, NumPy in the tools)."""
  out = {}

  def walk(node):
    for key, value in node.items():
      if key.startswith(SOWN_PREFIX):
        out[key[len(SOWN_PREFIX):]] = value[0] if isinstance(value, tuple) else value
      elif hasattr(value, 'items'):
        walk(value)
  walk(tree)
  return out


def _one(value):
  """A sown value is a 1-tuple; a tree that was already unwrapped holds the array itself."""
  return value[0] if isinstance(value, tuple) else value


def streams(kind: str, num_layers: int, inter) -> list[dict]:
  """The state before block 0 and after each block l (index l + 1), as {'x_t', 'x_e', 'x'}
  ``[batch, time, d_model]``, from one forward pass's ``intermediates`` (the collection or its ``flat`` form).
  Arrays keep their type (JAX inside a step, NumPy in the interpretability tools).

  For the two-stream kinds X_t and X_e are the model's own streams. The standard model has one residual
  stream; it is split the same way, X_t = the input plus every attention update and X_e = the sum of the
  FFN updates, so that the kinds can be compared stream by stream."""
  sites = inter if 'embed' in inter else flat(inter)
  x = sites['embed']
  out = [{'x_t': x, 'x_e': x - x, 'x': x}]
  for l in range(num_layers):
    b = f'blocks.{l}.'
    if kind == 'standard':
      x_t, x_e, prev = out[-1]['x_t'], out[-1]['x_e'], out[-1]['x']
      mid, x = sites[b + 'resid_mid'], sites[b + 'resid']
      out.append({'x_t': x_t + (mid - prev), 'x_e': x_e + (x - mid), 'x': x})
    else:
      x_t, x_e = sites[b + 'x_t'], sites[b + 'x_e']
      out.append({'x_t': x_t, 'x_e': x_e, 'x': x_t + x_e})
  return out


# ----------------------------------------------------------------------------------------------------------
# Named sites for caches and hooks (``symjax.interpret.run_with_cache`` / ``run_with_hooks``). "Block l" and
# "layer l" mean the same thing everywhere: l = 0 is the first block, and ``embed`` is the state before it.
#
#   embed                      [batch, time, d_model]      the input state (X_t⁰; X_e⁰ = 0)
#   blocks.{l}.attn.v_mixture  [batch, time, heads, vocab]     symbolic: α of the values (eq. 27)
#   blocks.{l}.attn.q, .k      [batch, time, heads, head_dim]
#   blocks.{l}.attn.values     [batch, time, heads, head_dim]  what the heads move (two-stream: from X_t)
#   blocks.{l}.attn.scores     [batch, heads, q_time, k_time]  q·k/√d + ALiBi bias, −inf where masked
#   blocks.{l}.attn.pattern    [batch, heads, q_time, k_time]  attention weights
#   blocks.{l}.attn.gate       [batch, time, heads, head_dim]  gated attention: σ(g W_gate), what z is scaled by
#   blocks.{l}.attn.z          [batch, time, heads, head_dim]  each head's output
#   blocks.{l}.attn.out        [batch, time, d_model]          the attention update (two-stream: ΔX_t)
#   blocks.{l}.x_t_mid, .x_e_mid [batch, time, d_model]        two-stream models: the streams after the attention
#   blocks.{l}.resid_mid       [batch, time, d_model]          the state after the attention (X_t + X_e)
#   blocks.{l}.ffn.pre         [batch, time, d_model]          the FFN's normalised input
#   blocks.{l}.ffn.hidden      [batch, time, ff] or [heads, batch·time, ff]  the FFN's hidden units
#   blocks.{l}.ffn.mixture     [batch, time, heads, vocab]     symbolic: α of the FFN update (eq. 19)
#   blocks.{l}.ffn.out         [batch, time, d_model]          the FFN update (two-stream: ΔX_e)
#   blocks.{l}.x_t, .x_e       [batch, time, d_model]          two-stream models: the streams after block l
#   blocks.{l}.resid           [batch, time, d_model]          the state after block l (X_t + X_e)
#   blocks.{l}.pls.logits      [batch, time, vocab]            per-layer supervision: the shared head on block l
#   final.norm                 [batch, time, d_model]          the final LayerNorm's output
#   final.logits               [batch, time, vocab]
# ----------------------------------------------------------------------------------------------------------
SOWN_PREFIX = '@'
ATTN_SITES = ('v_mixture', 'q', 'k', 'values', 'scores', 'pattern', 'z', 'out')  # the order a pass meets them
FFN_SITES = ('pre', 'hidden', 'mixture', 'out')
STREAM_SITES = ('x_t', 'x_e', 'resid')
MID_SITES = ('x_t_mid', 'x_e_mid', 'resid_mid')
READ_ONLY = ('.resid', '.resid_mid')  # in a two-stream model: the sum X_t + X_e, which the model never passes on


def site_names(kind: str, num_layers: int, symbolic_layers: tuple[int, ...] = (), gate: bool = False,
               pls: bool = False) -> list[str]:
  """Every named site of a model, in the order a forward pass meets them. Mixtures exist in the layers
  listed in ``symbolic_layers`` only; X_t and X_e in the two-stream kinds only; ``attn.gate`` with gated
  attention and ``pls.logits`` with per-layer supervision (``ModelConfig.sites`` reads all of it)."""
  names_ = ['embed']
  for l in range(num_layers):
    attn = [s for s in ATTN_SITES if s != 'v_mixture' or l in symbolic_layers]
    if gate:
      attn.insert(attn.index('z'), 'gate')
    ffn = [s for s in FFN_SITES if s != 'mixture' or l in symbolic_layers]
    streams_ = STREAM_SITES if kind != 'standard' else ('resid',)
    mid = MID_SITES if kind != 'standard' else ('resid_mid',)
    names_ += [f'blocks.{l}.attn.{s}' for s in attn] + [f'blocks.{l}.{s}' for s in mid]
    names_ += [f'blocks.{l}.ffn.{s}' for s in ffn] + [f'blocks.{l}.{s}' for s in streams_]
    names_ += [f'blocks.{l}.pls.logits'] if pls else []
  return names_ + ['final.norm', 'final.logits']


# TransformerLens's names of the sites that are the same concept here (its utils.get_act_name short names, and
# its hook points' full names), so that a user may bring them: short name -> the site within blocks.{l}.
TRANSFORMER_LENS_SHORT = {'resid_mid': 'resid_mid', 'resid_post': 'resid', 'q': 'attn.q', 'k': 'attn.k',
                          'v': 'attn.values', 'attn_scores': 'attn.scores', 'pattern': 'attn.pattern', 'z': 'attn.z',
                          'attn_out': 'attn.out', 'mlp_out': 'ffn.out', 'post': 'ffn.hidden'}
_TL_FULL = {'hook_resid_pre': 'resid_pre', 'hook_resid_mid': 'resid_mid', 'hook_resid_post': 'resid_post',
            'attn.hook_q': 'q', 'attn.hook_k': 'k', 'attn.hook_v': 'v', 'attn.hook_attn_scores': 'attn_scores',
            'attn.hook_pattern': 'pattern', 'attn.hook_z': 'z', 'hook_attn_out': 'attn_out',
            'hook_mlp_out': 'mlp_out', 'mlp.hook_post': 'post', 'hook_in': 'resid_pre', 'hook_out': 'resid_post'}


def from_transformer_lens(key, num_layers: int):
  """The site a TransformerLens name means: ``('pattern', l)`` (l < 0 counts from the last block, as its
  cache reads it), ``'blocks.{l}.attn.hook_pattern'``, ``('resid_pre', l)`` (``embed`` for l = 0, else
  ``blocks.{l-1}.resid``), ``'ln_final.hook_normalized'``; any other key as it is."""
  if isinstance(key, tuple):
    if len(key) == 3 and isinstance(key[2], str):  # (name, layer, 'attn'): the kind of layer adds nothing here
      key = key[:2]
    if len(key) != 2 or not isinstance(key[0], str) or isinstance(key[1], bool) or not isinstance(key[1], int):
      raise InputError(f'a TransformerLens key is (name, layer) or (name, layer, layer_type), e.g. '
                       f'(\'pattern\', 0); got {key!r}')
    short, layer = key
    if short not in TRANSFORMER_LENS_SHORT and short != 'resid_pre':
      raise InputError(f'{short!r} is not a TransformerLens name symjax has; it has '
                       f'{["resid_pre", *TRANSFORMER_LENS_SHORT]}')
    if not -num_layers <= layer < num_layers:
      raise InputError(f'layer {layer} is out of range: the model has blocks 0..{num_layers - 1}')
    layer %= num_layers
    if short == 'resid_pre':
      return 'embed' if layer == 0 else f'blocks.{layer - 1}.resid'
    return f'blocks.{layer}.{TRANSFORMER_LENS_SHORT[short]}'
  if not isinstance(key, str):
    return key
  if key == 'ln_final.hook_normalized':
    return 'final.norm'
  head, dot, rest = key.partition('.')
  layer, dot2, hook_point = rest.partition('.')
  if head == 'blocks' and dot and dot2 and layer.isdigit() and hook_point in _TL_FULL:
    return from_transformer_lens((_TL_FULL[hook_point], int(layer)), num_layers)
  return key


def get_act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
  """TransformerLens's ``utils.get_act_name``: the full hook-point name of a short one (``('v', 0)`` ->
  ``'blocks.0.attn.hook_v'``, ``'pre5'`` -> ``'blocks.5.mlp.hook_pre'``, ``('in', 2)`` -> ``'blocks.2.hook_in'``),
  which every symjax call taking a site accepts; a full name comes back as it is."""
  if ('.' in name or name.startswith('hook_')) and layer is None and layer_type is None:
    return name
  match = re.match(r'([a-z]+)(\d+)([a-z]?.*)', name)
  if match is not None:
    name, layer, layer_type = match.group(1), int(match.group(2)), match.group(3) or None
  name = _TL_ALIASES.get(name, name)
  if name in ('k', 'v', 'q', 'z', 'rot_k', 'rot_q', 'result', 'pattern', 'attn_scores'):
    layer_type = 'attn'
  elif name in ('pre', 'post', 'mid', 'pre_linear'):
    layer_type = 'mlp'
  else:
    layer_type = _TL_LAYER_TYPES.get(layer_type, layer_type)
  full = (f'blocks.{layer}.' if layer is not None else '') + (f'{layer_type}.' if layer_type else '') + f'hook_{name}'
  return f'ln_final.{full}' if name in ('scale', 'normalized') and layer is None else full


_TL_ALIASES = {'attn': 'pattern', 'attn_logits': 'attn_scores', 'key': 'k', 'query': 'q', 'value': 'v',
               'mlp_pre': 'pre', 'mlp_mid': 'mid', 'mlp_post': 'post'}
_TL_LAYER_TYPES = {'a': 'attn', 'm': 'mlp', 'b': '', 'block': '', 'blocks': '', 'attention': 'attn'}


def transformer_lens_names(name: str, num_layers: int) -> list[str]:
  """TransformerLens's full names of site ``name`` (none where it has no such hook point): what a
  TransformerLens predicate over hook names (``names_filter``, ``add_hook``) is asked about."""
  return list(_transformer_lens_names_by_site(num_layers).get(name, ()))


@functools.lru_cache(maxsize=16)
def _transformer_lens_names_by_site(num_layers: int) -> dict[str, tuple[str, ...]]:
  """{site: its TransformerLens names}, built once per depth: a predicate asks it of every site at every
  call, and scanning every block's names for each site grew with the square of the depth."""
  by_site: dict[str, list[str]] = {'final.norm': ['ln_final.hook_normalized'], 'embed': ['hook_embed']}
  for l in range(num_layers):
    for full in _TL_FULL:
      tl = f'blocks.{l}.{full}'
      by_site.setdefault(from_transformer_lens(tl, num_layers), []).append(tl)
  return {site: tuple(names) for site, names in by_site.items()}


def transformer_lens_predicate(predicate: Callable[[str], bool], num_layers: int) -> Callable[[str], bool]:
  """``predicate`` over site names that also accepts a site whose TransformerLens name it accepts."""
  return lambda name: bool(predicate(name)) or any(predicate(n) for n in transformer_lens_names(name, num_layers))


@dataclasses.dataclass
class _Session:
  fns: dict[str, Callable]               # site name -> fn(value, name) -> value
  keep: Callable[[str], bool] | None     # which sites to sow (None: every one)


_SESSION: contextvars.ContextVar[_Session | None] = contextvars.ContextVar('symjax_hooks', default=None)


@contextlib.contextmanager
def session(fns: dict[str, Callable] | None = None, keep: Callable[[str], bool] | None = None) -> Iterator[None]:
  """Within it, every named site passes through ``fns`` (by name) and is sown into the ``intermediates``
  collection when that collection is mutable and ``keep(name)``. Outside it the sites cost nothing: the model is the
  one that trains."""
  token = _SESSION.set(_Session(dict(fns or {}), keep))
  try:
    yield
  finally:
    _SESSION.reset(token)


def active() -> bool:
  """Whether a hook session is open (the modules then compute every named site explicitly)."""
  return _SESSION.get() is not None


def site(module, local: str) -> str:
  """The public name of ``local`` (``attn.q``, ``ffn.mixture``, ``embed``...) inside ``module``."""
  layer_ = next((p for p in module.path if p.startswith('layer_')), None)
  return local if layer_ is None else f'blocks.{layer_[len("layer_"):]}.{local}'


def read_only_message(name: str) -> str:
  """The error for a hook at a two-stream model's ``resid`` or ``resid_mid``: the streams to hook instead."""
  base, _, last = name.rpartition('.')
  suffix = last.removeprefix('resid')
  return (f'{name} is read-only in a two-stream model (the sum X_t + X_e); hook its streams {base}.x_t{suffix} '
          f'and {base}.x_e{suffix} instead')


class HookName(str):
  """A site's name as a hook function receives it: the string itself, with the attributes of TransformerLens's
  ``HookPoint`` that hook functions read (``hook.name``, ``hook.layer()``), so theirs run unchanged."""

  @property
  def name(self) -> str:
    return str(self)

  def layer(self) -> int:
    """The block a ``blocks.{l}.…`` site belongs to."""
    parts = self.split('.')
    if parts[0] != 'blocks' or len(parts) < 3 or not parts[1].isdigit():
      raise InputError(f'{str(self)!r} is not a site of a block (blocks.{{l}}.…): it has no layer')
    return int(parts[1])


def hooked(name: str) -> bool:
  """Whether a hook function is registered at ``name`` in the open session."""
  s = _SESSION.get()
  return s is not None and name in s.fns


class HookValue:
  """A site's value as a hook receives it: the JAX array, which also takes TransformerLens's in-place writes
  (``value[:, :, h] = 0``, ``value[...] *= 0.5``, ``value *= 0``), each a functional update of ``.array``,
  so that a hook written for PyTorch tensors runs as written (returning None keeps the updated value).
  Everything else reads through to the array (its methods, operators and ``jnp`` functions that accept
  ``__jax_array__``)."""

  __slots__ = ('array',)
  __array_priority__ = 100  # NumPy defers its operators to this object's

  def __init__(self, array):
    self.array = array

  def __getattr__(self, name):
    return getattr(self.array, name)

  def __jax_array__(self):
    return self.array

  def __array__(self, dtype=None, copy=None):
    import numpy as np
    return np.asarray(self.array, dtype)

  def __repr__(self) -> str:
    return f'HookValue({self.array!r})'

  def __getitem__(self, index):
    return self.array[_unwrapped(index)]

  def __setitem__(self, index, new) -> None:
    self.array = self.array.at[_unwrapped(index)].set(_unwrapped(new))

  def __len__(self) -> int:
    return len(self.array)

  def __iter__(self):
    return iter(self.array)


def _unwrapped(x):
  if isinstance(x, HookValue):
    return x.array
  if isinstance(x, tuple):
    return tuple(_unwrapped(i) for i in x)
  return x


def _operator(name: str, in_place: bool = False):
  if in_place:  # value *= x: the update is kept in this object, as a tensor's would be
    op = f'__{name}__'

    def update(self, other):
      self.array = getattr(self.array, op)(_unwrapped(other))
      return self
    return update
  return lambda self, *other: getattr(self.array, f'__{name}__')(*map(_unwrapped, other))


for _name in ('add', 'sub', 'mul', 'truediv', 'floordiv', 'mod', 'pow', 'matmul', 'and', 'or', 'xor', 'lshift',
              'rshift'):
  setattr(HookValue, f'__{_name}__', _operator(_name))
  setattr(HookValue, f'__r{_name}__', _operator(f'r{_name}'))
  setattr(HookValue, f'__i{_name}__', _operator(_name, in_place=True))
for _name in ('neg', 'pos', 'abs', 'invert', 'lt', 'le', 'gt', 'ge', 'eq', 'ne', 'bool', 'int', 'float', 'index',
              'complex'):
  setattr(HookValue, f'__{_name}__', _operator(_name))
HookValue.__hash__ = None


def call_hook(fn: Callable, value, name: str):
  """``fn`` on ``value`` at site ``name``. A hook receives the array itself, which it may keep (a cache of its
  own); where it writes in place — an item assignment, which JAX's arrays refuse, or an in-place operator on
  its argument (``value *= 0``), which would rebind a local name and change nothing — it receives a
  ``HookValue`` instead, and the value it leaves is the site's new value."""
  if not _rebinds_argument(fn):
    try:
      out = fn(value, HookName(name))
    except TypeError as e:
      if 'immutable' not in str(e) and 'item assignment' not in str(e):
        raise
    else:
      return value if out is None else out
  held = HookValue(value)
  out = fn(held, HookName(name))
  out = held.array if out is None or out is held else out
  return out.array if isinstance(out, HookValue) else out


def _rebinds_argument(fn) -> bool:
  """Whether ``fn``'s code applies an in-place operator to its first parameter (``value *= 0``)."""
  while isinstance(fn, functools.partial):
    fn = fn.func
  code = getattr(fn, '__code__', None)
  return code is not None and _stores_first_argument(code)


@functools.lru_cache(maxsize=1024)
def _stores_first_argument(code) -> bool:
  if not code.co_argcount:
    return False
  first, before = code.co_varnames[0], None
  for i in dis.get_instructions(code):
    if i.opname == 'STORE_FAST' and i.argval == first and before is not None and (
        before.opname.startswith('INPLACE_') or (before.opname == 'BINARY_OP' and before.argrepr.endswith('='))):
      return True
    before = i
  return False


# The inputs edge patching gives each reader apart (``symjax.interpret.edges``), as TransformerLens's split inputs:
#   blocks.{l}.attn.q_input, .k_input, .v_input  [batch, time, heads, d_model]  what each head's query, key and
#                                value read before their norm (two-stream: the value reads X_t)
#   blocks.{l}.ffn.in          [batch, time, d_model]      what the FFN reads before its norm
#   final.in                   [batch, time, d_model]      what the final norm reads
# A block computes its heads' inputs apart only where a hook session hooks one of them; they are never sown.
INPUT_SITES = ('attn.q_input', 'attn.k_input', 'attn.v_input', 'ffn.in', 'final.in')


def splits(module) -> bool:
  """Whether the open hook session hooks a per-head input of ``module``'s attention (``INPUT_SITES``)."""
  s = _SESSION.get()
  return s is not None and any(site(module, f'attn.{p}_input') in s.fns for p in 'qkv')


def tap(module, local: str, value):
  """The value at a site edge patching alone reads or replaces (``INPUT_SITES``; a Transformer Program's
  selections, patterns and readout): what the session's hook there returns, else ``value``; never sown."""
  s = _SESSION.get()
  fn = None if s is None else s.fns.get(site(module, local))
  if fn is None:
    return value
  new = fn(value, HookName(site(module, local)))
  if new.shape != value.shape:
    raise InputError(f'the hook at {site(module, local)} returned shape {new.shape}; the site has {value.shape}')
  return new.astype(value.dtype)


def per_head(x, num_heads: int):
  """``x`` ``[..., d]`` as every head's own copy, ``[..., heads, d]``."""
  import jax.numpy as jnp
  return jnp.broadcast_to(x[..., None, :], (*x.shape[:-1], num_heads, x.shape[-1]))


def hook(module, local: str, value, replaceable: bool = True):
  """The value at a named site: ``value`` itself outside a hook session (sown when the site is one of
  ``SOWN``); inside one, what its hook function returns, sown when the session keeps it or it is one of
  ``SOWN``. ``replaceable=False`` marks a read-only site (a sum the model does not use as such): a hook there
  is an error naming the sites to hook instead."""
  s = _SESSION.get()
  name = site(module, local)
  if s is None:
    if local in SOWN:
      module.sow(COLLECTION, SOWN_PREFIX + name, value)
    return value
  fn = s.fns.get(name)
  if fn is not None:
    if not replaceable:
      raise InputError(read_only_message(name))
    new = call_hook(fn, value, name)  # TransformerLens's convention: None leaves the value as it is
    if getattr(new, 'shape', None) != value.shape:
      raise InputError(f'the hook at {name} returned shape {getattr(new, "shape", None)}; the site has '
                       f'{tuple(value.shape)}')
    value = new.astype(value.dtype)
  if local in SOWN or s.keep is None or s.keep(name):
    module.sow(COLLECTION, SOWN_PREFIX + name, value)  # the prefix keeps 'embed' apart from the embed module
  return value
