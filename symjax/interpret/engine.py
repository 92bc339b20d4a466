"""The interpretability engine: the one place that compiles passes of ``symjax.interpret`` and keeps them.

A program is keyed on what changes its code — the model (its config), the sites hooked and cached, the hooks'
static structure — and ``jax.jit`` retraces it for new shapes only. All programs live in one cache of at most
``KEPT`` entries, the least recently used leaving first.

Hooks are data. A hook's code is the program's structure; the numbers and arrays it carries are the program's
arguments (``split``): the arguments of a ``functools.partial`` (or ``jax.tree_util.Partial``), a closure's
cells, a lambda's defaults and the module-level numbers its code reads. A loop of
``functools.partial(zero, head=h)`` or ``zero_head(h)`` therefore compiles once per site and shape, and an
inline lambda whose code was seen before reuses its program. A hook whose numbers must be concrete
(``range(h)``, a slice bound) is compiled once per value instead; one that needs concrete arrays (NumPy, a
Python branch on data) runs eagerly, and says so once per function.

Tiers, tried in order for a hook structure: ``'traced'`` (numbers as arguments), ``'static'`` (Python numbers
as constants, arrays as arguments), ``'eager'`` (no program).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import os
import sys
import types
from typing import Any, Callable, Hashable, Iterator

import jax
import numpy as np

from symjax.system.errors import InputError

KEPT = 256  # compiled programs, executables and traced shapes kept, together
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()


_MISSING = object()


def _kept(key: Hashable, make: Callable[[], Any]):
  value = _PROGRAMS.get(key, _MISSING)
  if value is _MISSING:
    value = _PROGRAMS[key] = make()
    while len(_PROGRAMS) > KEPT:
      _PROGRAMS.popitem(last=False)
  else:
    _PROGRAMS.move_to_end(key)
  return value


def compiled(key: Hashable, build: Callable[[], Callable]) -> Callable:
  """The jitted program for ``key``, ``jax.jit(build())`` on first use; every pass of the interpretability
  API is one of these."""
  return _kept(('jit', key), lambda: jax.jit(build()))


def signature(args) -> tuple:
  """What a compiled program is specialised to: its arguments' tree, shapes and dtypes."""
  leaves, tree = jax.tree.flatten(args)
  return tree, tuple((np.shape(x), x.dtype if hasattr(x, 'dtype') else type(x)) for x in leaves)


def executable(key: Hashable, program: Callable, args: tuple):
  """``program`` (a jitted program) compiled for ``args``, kept under ``key`` (which names the shapes too:
  ``signature``)."""
  return _kept(('executable', key), lambda: program.lower(*args).compile())


def has_executable(key: Hashable) -> bool:
  return ('executable', key) in _PROGRAMS


def compile_all(jobs: list[tuple]) -> None:
  """Compiles the executables of ``jobs`` [(key, program, args)] not kept yet, on as many threads as the
  machine has cores (XLA compiles outside Python's lock): a sweep's programs compile together, not in turn."""
  todo = list({key: (key, p, args) for key, p, args in jobs if ('executable', key) not in _PROGRAMS}.values())
  if len(todo) < 2:
    return
  with concurrent.futures.ThreadPoolExecutor(max(1, min(len(todo), os.cpu_count() or 1))) as pool:
    for (key, _, _), done in zip(todo, pool.map(lambda j: j[1].lower(*j[2]).compile(), todo)):
      _kept(('executable', key), lambda done=done: done)


def remembered(key: Hashable, compute: Callable[[], Any]):
  """What ``compute()`` gives (a pass's traced shapes, the positions a metric reads), kept under ``key``."""
  return _kept(('value', key), compute)


def clear() -> None:
  """Forgets every compiled program (and the hook tiers learned with them)."""
  _PROGRAMS.clear()
  _TIERS.clear()


def size() -> int:
  return len(_PROGRAMS)


# ----------------------------------------------------------------------------------------------------------
# Hooks as data: a hook split into its static structure (hashable) and its dynamic leaves.
# ----------------------------------------------------------------------------------------------------------
class Opaque(Exception):
  """A hook (or a value it carries) whose structure cannot be read: a callable object, a bound method, a
  mutable container (a dict or list a hook may write into). Such a hook is keyed on its own identity."""


# Functions of these packages are constants of a hook's structure (their code does not read a user's numbers).
LIBRARIES = frozenset({'jax', 'jaxlib', 'numpy', 'flax', 'optax', 'chex', 'einops', 'functools', 'builtins',
                       'math', 'operator', 'symjax', 'scipy', 'torch', 'transformer_lens', 'typing'})
_DEPTH = 8


@dataclasses.dataclass(frozen=True)
class Split:
  key: Hashable                           # the structure: equal keys, one program
  leaves: tuple                           # the numbers and arrays, in order
  rebuild: Callable[[Iterator], Any]      # leaves (tracers) -> the object, for the program's trace


def _leaf_key(x, static_numbers: bool):
  if isinstance(x, (int, float, complex)):
    return ('const', type(x), x) if static_numbers else ('py', type(x))
  return ('array', np.shape(x), str(np.asarray(x).dtype) if not isinstance(x, jax.Array) else str(x.dtype),
          getattr(x, 'weak_type', False))


def _is_leaf(x) -> bool:
  return (isinstance(x, (int, float, complex, np.ndarray, np.generic)) and not isinstance(x, bool)) or (
      isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer))


def _library(obj) -> bool:
  module = getattr(obj, '__module__', None) or ''
  return module.partition('.')[0] in LIBRARIES


def _constant(x) -> Split:
  return Split(('static', type(x), x), (), lambda it: x)


def _identity(x) -> Split:
  """A constant of the structure by identity (a module, a class, a library function): the key holds the
  object itself, so that its id is never reused by another while the program is kept."""
  return Split(('id', x), (), lambda it: x)


@functools.lru_cache(maxsize=1024)
def _global_names(code: types.CodeType) -> tuple[str, ...]:
  """The names ``code`` (and the functions and comprehensions defined in it) may read from its globals."""
  found = list(code.co_names)
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      found += _global_names(const)
  return tuple(dict.fromkeys(found))


def split(obj, static_numbers: bool = False, depth: int = 0) -> Split:
  """``obj`` (a hook, or a value one carries) as structure and leaves; ``Opaque`` where it cannot be read.
  ``static_numbers``: Python numbers are part of the structure (the ``'static'`` tier)."""
  if depth > _DEPTH:
    raise Opaque('nested too deeply')
  if obj is None or isinstance(obj, (bool, str, bytes, type(Ellipsis))):
    return _constant(obj)
  if _is_leaf(obj):
    if static_numbers and isinstance(obj, (int, float, complex)):
      return _constant(obj)
    return Split(('leaf', _leaf_key(obj, False)), (obj,), lambda it: next(it))
  if isinstance(obj, slice):
    parts = [split(p, True, depth + 1) for p in (obj.start, obj.stop, obj.step)]  # slice bounds are static
    return Split(('slice', *(p.key for p in parts)), (), lambda it: obj)
  if isinstance(obj, tuple):
    parts = [split(x, static_numbers, depth + 1) for x in obj]
    kind = type(obj)
    if kind is not tuple and not hasattr(kind, '_fields'):
      raise Opaque(f'a {kind.__name__}')
    make = (lambda xs: kind(*xs)) if kind is not tuple else tuple
    return Split(('tuple', kind, tuple(p.key for p in parts)), sum((p.leaves for p in parts), ()),
                 lambda it: make([p.rebuild(it) for p in parts]))
  if isinstance(obj, (types.ModuleType, type, types.BuiltinFunctionType, np.ufunc)):
    return _identity(obj)
  if isinstance(obj, functools.partial):
    fn = split(obj.func, static_numbers, depth + 1)
    args = [split(a, static_numbers, depth + 1) for a in obj.args]
    kw = {k: split(v, static_numbers, depth + 1) for k, v in sorted(obj.keywords.items())}
    kind = type(obj)
    return Split(('partial', kind, fn.key, tuple(a.key for a in args), tuple((k, v.key) for k, v in kw.items())),
                 fn.leaves + sum((a.leaves for a in args), ()) + sum((v.leaves for v in kw.values()), ()),
                 lambda it: kind(fn.rebuild(it), *[a.rebuild(it) for a in args],
                                 **{k: v.rebuild(it) for k, v in kw.items()}))
  if isinstance(obj, types.FunctionType):
    if _library(obj) and not obj.__closure__:
      return _identity(obj)
    return _function(obj, static_numbers, depth)
  if callable(obj) and _library(obj):   # a library's jitted or wrapped function
    return _identity(obj)
  raise Opaque(type(obj).__name__)


def _function(fn: types.FunctionType, static_numbers: bool, depth: int) -> Split:
  code, glob = fn.__code__, fn.__globals__
  cells = [split(c.cell_contents, static_numbers, depth + 1) for c in (fn.__closure__ or ())]
  defaults = [split(d, static_numbers, depth + 1) for d in (fn.__defaults__ or ())]
  kwdefaults = {k: split(v, static_numbers, depth + 1) for k, v in sorted((fn.__kwdefaults__ or {}).items())}
  names = [n for n in _global_names(code) if n in glob]
  globals_ = {n: split(glob[n], static_numbers, depth + 1) for n in names}
  varying = {n: s for n, s in globals_.items() if s.leaves or s.key[0] not in ('static', 'id')}
  parts = [*cells, *defaults, *kwdefaults.values(), *varying.values()]
  key = ('fn', code, tuple(c.key for c in cells), tuple(d.key for d in defaults),
         tuple((k, v.key) for k, v in kwdefaults.items()), tuple((n, s.key) for n, s in globals_.items()))

  def rebuild(it):
    new_cells = tuple(types.CellType(c.rebuild(it)) for c in cells)
    new_defaults = tuple(d.rebuild(it) for d in defaults) or None
    new_kw = {k: v.rebuild(it) for k, v in kwdefaults.items()} or None
    new_glob = glob
    if varying:
      new_glob = dict(glob)
      new_glob.update({n: s.rebuild(it) for n, s in varying.items()})
    out = types.FunctionType(code, new_glob, fn.__name__, new_defaults, new_cells or None)
    out.__kwdefaults__ = new_kw
    out.__dict__.update(fn.__dict__)
    return out
  return Split(key, sum((p.leaves for p in parts), ()), rebuild)


def fingerprint(obj) -> Hashable | None:
  """A key equal for two objects of the same structure and the same data (their leaves' values): what a
  result that depends on both is remembered under. None for an object whose structure cannot be read."""
  try:
    parts = split(obj)
  except Opaque:
    return None
  values = tuple(x if isinstance(x, (int, float, complex)) else (np.shape(x), str(np.asarray(x).dtype),
                                                                  np.asarray(x).tobytes()) for x in parts.leaves)
  return parts.key, values


def split_hooks(fns: dict[str, Callable], static_numbers: bool = False) -> Split:
  """A dict of hooks {site: fn} as one ``Split``; a hook whose structure cannot be read is keyed on itself
  (``('opaque', fn)``)."""
  parts = {}
  for name, fn in sorted(fns.items()):
    try:
      parts[name] = split(fn, static_numbers)
    except Opaque:
      parts[name] = Split(('opaque', fn), (), lambda it, fn=fn: fn)
  return Split(tuple((n, p.key) for n, p in parts.items()), sum((p.leaves for p in parts.values()), ()),
               lambda it: {n: p.rebuild(it) for n, p in parts.items()})


# ----------------------------------------------------------------------------------------------------------
# Hooked passes: compiled with the hooks' leaves as arguments, or eager where a hook needs concrete values.
# ----------------------------------------------------------------------------------------------------------
class NeedsConcrete(Exception):
  """Raised by a hook that cannot run on traced values (one written for torch tensors): the pass runs eagerly."""


UNTRACEABLE = (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError,
               jax.errors.TracerIntegerConversionError, jax.errors.TracerBoolConversionError, NeedsConcrete)
TIERS = ('traced', 'static', 'eager')
_TIERS: collections.OrderedDict = collections.OrderedDict()  # (pass key, structure) -> the tier that traced
_WARNED: set = set()


def hooked(key: Hashable, fns: dict[str, Callable], make: Callable[[dict[str, Callable]], Callable], args: tuple,
           run_eagerly: Callable[[dict[str, Callable]], Any]):
  """Runs ``make(hooks)(*args)`` compiled, the hooks' leaves passed as the program's last argument: the first
  tier of ``TIERS`` that traces. ``run_eagerly(fns)`` where none does (a one-line warning per hook function).
  ``key`` names the pass (model, cached sites...); the hooks' structure is added to it."""
  traced = split_hooks(fns)
  tier_key = (key, traced.key)
  try:
    hash(tier_key)
  except TypeError:  # a hook object that cannot be a key (it defines __eq__ without __hash__)
    return run_eagerly(fns)
  tier = _TIERS.get(tier_key)
  if tier is None and any(k[0] == 'opaque' for _, k in tier_key[1]):
    # A hook object seen for the first time: compiling a program for an object a loop may never pass again
    # costs more than the eager pass; its second call compiles.
    _remember(tier_key, 'traced')
    return run_eagerly(fns)
  for tier in TIERS[TIERS.index(tier or 'traced'):]:
    if tier == 'eager':
      break
    parts = traced if tier == 'traced' else split_hooks(fns, static_numbers=True)  # split once per tier
    program = compiled(('hooked', key, parts.key), lambda parts=parts: _with_leaves(make, parts))
    try:
      out = program(*args, parts.leaves)
    except InputError:
      raise
    except Exception as e:  # noqa: BLE001 (a number the hook needs concrete: a slice bound, a shape, a branch)
      _PROGRAMS.pop(('jit', ('hooked', key, parts.key)), None)
      if tier == 'traced' or isinstance(e, UNTRACEABLE):
        continue  # a real error in the hook raises again at the next tier, and at the last, eagerly
      raise
    _remember(tier_key, tier)
    return out
  out = run_eagerly(fns)
  _remember(tier_key, 'eager')
  _warn_eager(fns)
  return out


def _with_leaves(make, parts: Split):
  def run(*args):
    *args, leaves = args
    return make(parts.rebuild(iter(leaves)))(*args)
  return run


def _remember(key, tier: str) -> None:
  _TIERS[key] = tier
  _TIERS.move_to_end(key)
  while len(_TIERS) > 4 * KEPT:
    _TIERS.popitem(last=False)


def _warn_eager(fns: dict[str, Callable]) -> None:
  for name, fn in fns.items():
    code = getattr(getattr(fn, 'func', fn), '__code__', None) or id(fn)
    if code in _WARNED:
      continue
    if len(_WARNED) > 4 * KEPT:  # bounded: an old function may say it again
      _WARNED.clear()
    _WARNED.add(code)
    label = getattr(getattr(fn, 'func', fn), '__qualname__', type(fn).__name__)
    print(f'symjax: {label} ({name}) needs concrete values (NumPy, torch, or a Python branch on an array), so '
          f'it runs eagerly, uncompiled; written with jnp it compiles', file=sys.stderr)
