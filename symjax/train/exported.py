"""The training step's traced program kept beside JAX's compilation cache, so that a rerun of the same
config on the same code starts without tracing the step again.

JAX's persistent cache keys a compiled program on the program itself, so a warm start still traces the
step in Python (the longest part of a warm start: the docs' "Performance" page) only to find the key.
``export`` serializes the traced step with ``jax.export`` (JAX's format for a lowered program), ``write``
keeps it under a key made of everything the trace reads (``step_key``: symjax's own source, the versions of
the libraries it traces through, the config, the typed model config, the step's options, JAX's settings, the
devices and mesh, and the shapes, dtypes and shardings of the batch). ``read`` and ``flat_step`` give back a
jitted step that calls the kept program with the shardings and donation it was exported with, and
``as_step`` a function of the run's state. XLA inlines the call, so it compiles to the program the traced
step compiles to (tested bit for bit), and JAX's cache then holds its executable as usual.

The initial state is kept there too (``write_state``, ``read_state``), under a key made the same way (the
config holds the seed): a warm start then reads its arrays instead of reading the initialiser's program from
the cache and running it. Only states up to ``MAX_STATE_BYTES`` are kept.

A file that is unreadable or corrupt is one warning line and the step is traced (the state initialised) as
before. Only a run on a single process, with a local cache folder, keeps its step and state: the others trace
and initialise at every start.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import io
import json
import os
import re
import sys
import threading
import zipfile
from typing import Any, Callable

import jax
import jaxlib
import numpy as np

from symjax.system import files

FOLDER = 'symjax-steps'  # inside JAX's compilation cache folder
SUFFIX = '.jaxexport'
STATE_SUFFIX = '.state'
# What a kept state saves is the initialiser's read from the cache and its run, about half a second on a
# laptop's CPU whatever the model's size; a larger state would cost more in writing and disk than that.
MAX_STATE_BYTES = 64 << 20
# A sweep keeps a state per config and seed: past this total, the states read least recently are deleted.
MAX_KEPT_STATES_BYTES = 256 << 20
_DIGEST_BYTES = 32  # a SHA-256 of the serialized program, written after it


@functools.cache
def source_digest() -> str:
  """A digest of every Python file of the installed symjax package (its code is what the trace runs)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the symjax package
  digest = hashlib.sha256()
  for folder, subfolders, names in os.walk(root):
    subfolders.sort()  # os.walk follows this order: the same digest on every file system
    for name in sorted(names):
      if name.endswith('.py'):
        path = os.path.join(folder, name)
        digest.update(os.path.relpath(path, root).encode() + b'\0')
        with open(path, 'rb') as f:
          digest.update(f.read() + b'\0')
  return digest.hexdigest()


@functools.cache
def versions() -> tuple[str, ...]:
  """The versions of Python and of the libraries the step is traced through. Flax's and Optax's are read from
  their installed metadata, not imported: ``symjax.train.early`` keys a step before the trainer imports them."""
  return (jax.__version__, jaxlib.__version__, importlib.metadata.version('flax'),
          importlib.metadata.version('optax'), sys.version)


def _avals(tree) -> list[str]:
  return [f'{x.shape} {x.dtype} {getattr(x, "sharding", None)}' for x in jax.tree.leaves(tree)]


def step_key(name: str, config, model_config, options, mesh, abstract_batch) -> str:
  """The key of one step's program (or, named 'init', of the initial state): a digest of everything its trace
  depends on (the module docstring). The state's shapes, dtypes and shardings follow from the rest, so a start
  finds its kept step before tracing the initialiser for them; ``as_step`` and ``read_state`` check them."""
  parts = {
      'step': name,
      'source': source_digest(),
      'versions': list(versions()),
      'config': config.to_json_best_effort(sort_keys=True),
      'model_config': repr(model_config),
      'options': repr(options),
      'jax_config': sorted((k, repr(v)) for k, v in jax.config.values.items()),
      'devices': [(d.platform, d.device_kind, d.id) for d in jax.devices()],
      'mesh': repr(mesh),
      'batch': [str(jax.tree.structure(abstract_batch))] + _avals(abstract_batch),
  }
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def path_for(key: str, suffix: str = SUFFIX) -> str | None:
  """Where the step (``suffix`` STATE_SUFFIX: the state) of this key is kept: in JAX's compilation cache
  folder, if it is a local one and this is the only process; None otherwise (the step is then traced, the
  state initialised, at every start)."""
  cache = jax.config.jax_compilation_cache_dir
  if not cache or '://' in cache or jax.process_count() > 1:
    return None
  return os.path.join(os.path.expanduser(cache), FOLDER, key + suffix)


def _warn(message: str) -> None:
  print(f'WARNING: {message}', file=sys.stderr)


def export(step_fn, abstract_state, abstract_batch) -> bytes:
  """The jitted ``step_fn(state, batch) -> (state, metrics)`` for these shapes and shardings, serialized by
  ``jax.export`` and followed by its SHA-256. Its trace is the one JAX holds for them, if any.

  The state's pytree is stored as the flat tuple of its leaves: JAX serializes only the pytree types it
  knows, and the program sees the leaves in that order anyway; ``as_step`` rebuilds the state from the run's
  own pytree."""
  try:
    exported = jax.export.export(step_fn)(abstract_state, abstract_batch)
  except ValueError as e:  # custom calls without JAX's promise of stability (a fused GPU kernel)
    targets = sorted(set(re.findall(r'custom_call @([\w$.\-]+)', step_fn.lower(abstract_state,
                                                                              abstract_batch).as_text())))
    if 'custom call' not in str(e) or not targets:
      raise
    # The key holds the exact versions of JAX and jaxlib, so the program is only ever read back by the JAX
    # that wrote it: the stability JAX promises across versions is not needed.
    exported = jax.export.export(step_fn, disabled_checks=[
        jax.export.DisabledSafetyCheck.custom_call(t) for t in targets])(abstract_state, abstract_batch)
  new_state, metrics = jax.tree.unflatten(exported.out_tree, exported.out_avals)
  flat = lambda tree: tuple(jax.tree.leaves(tree))
  exported = dataclasses.replace(
      exported, in_tree=jax.tree.structure(((flat(abstract_state), abstract_batch), {})),
      out_tree=jax.tree.structure((flat(new_state), metrics)))
  blob = bytes(exported.serialize())
  return blob + hashlib.sha256(blob).digest()


def write(path: str, data: bytes, what: str = 'training step', again: str = 'traces it again') -> bool:
  """Writes ``export``'s (or ``write_state``'s) bytes to ``path``; another process sees the old file or the new
  one, never half. False, with a warning line, if it cannot be written there: the run goes on all the same."""
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    files.write_atomically(path, data)
  except OSError as e:
    reason = f'{e.strerror}: {e.filename}' if e.strerror and e.filename else str(e)
    _warn(f'the {what} cannot be kept in {path} ({reason}); the next start {again}')
    return False
  return True


def read(path: str, what: str = 'training step', instead: str = 'tracing the step', quiet: bool = False
         ) -> bytes | None:
  """``export``'s (or ``write_state``'s) bytes kept at ``path``, or None if there are none (a warning line if
  the file is there but unreadable or corrupt, unless ``quiet``: a guess of ``symjax.train.early``, whose
  failure the trainer's own read then reports)."""
  warn = (lambda message: None) if quiet else _warn
  try:
    with open(path, 'rb') as f:
      data = f.read()
  except (FileNotFoundError, NotADirectoryError):
    return None
  except OSError as e:
    warn(f'the kept {what} {path} cannot be read ({e.strerror or e}); {instead} instead')
    return None
  blob, digest = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
  if len(data) <= _DIGEST_BYTES or hashlib.sha256(blob).digest() != digest:
    warn(f'the kept {what} {path} is corrupt (its checksum does not match); {instead} again')
    return None
  return data


def write_state(path: str, state) -> bool:
  """Keeps the arrays of the initial ``state`` at ``path`` (NumPy's format, then a SHA-256) if they hold at
  most MAX_STATE_BYTES and no PRNG key; whether it did (a warning line if the folder cannot be written). Each
  array is saved as unsigned integers of its width with its dtype's name, which NumPy's format cannot name for
  ml_dtypes' types (bfloat16)."""
  leaves = jax.tree.leaves(state)
  if (sum(x.nbytes for x in leaves) > MAX_STATE_BYTES
      or any(jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) for x in leaves)):
    return False
  arrays = [np.asarray(x) for x in leaves]
  buffer = io.BytesIO()
  np.savez(buffer, dtypes=np.array([str(a.dtype) for a in arrays]),
           **{f'a{i}': a.view(f'u{a.dtype.itemsize}') for i, a in enumerate(arrays)})
  blob = buffer.getvalue()
  if not write(path, blob + hashlib.sha256(blob).digest(), 'initial state', 'initialises it again'):
    return False
  _drop_old_states(os.path.dirname(path))
  return True


def _drop_old_states(folder: str) -> None:
  """Deletes the kept states of ``folder`` read or written least recently, past MAX_KEPT_STATES_BYTES in all."""
  try:
    stats = [(e.path, e.stat()) for e in os.scandir(folder) if e.name.endswith(STATE_SUFFIX)]
    kept = sorted(((st.st_mtime, st.st_size, p) for p, st in stats), reverse=True)
  except OSError:  # another process is deleting them too
    return
  total = 0
  for _, size, path in kept:
    total += size
    if total > MAX_KEPT_STATES_BYTES:
      try:
        os.remove(path)
      except OSError:
        pass


def read_state(path: str, abstract_state):
  """The state ``write_state`` kept at ``path``, as arrays with ``abstract_state``'s shardings; None if none is
  kept there (a warning line if the file is unreadable, corrupt or holds other shapes or dtypes)."""
  data = read(path, 'initial state', 'initialising the state')
  if data is None:
    return None
  want = jax.tree.leaves(abstract_state)
  try:
    with np.load(io.BytesIO(data[:-_DIGEST_BYTES]), allow_pickle=False) as saved:
      names = [str(n) for n in saved['dtypes']]
      arrays = [saved[f'a{i}'] for i in range(len(names))]
  except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:  # not write_state's format
    _warn(f'the kept initial state {path} cannot be read ({type(e).__name__}: {e}); initialising the state instead')
    return None
  got = [(a.shape, name) for a, name in zip(arrays, names)]
  if got != [(tuple(w.shape), str(w.dtype)) for w in want]:
    _warn(f'the kept initial state {path} holds other arrays ({len(got)} against {len(want)}, or other shapes or '
          f'dtypes); initialising the state instead')
    return None
  try:
    os.utime(path)  # read now: the last to be dropped (_drop_old_states)
  except OSError:
    pass
  leaves = jax.device_put([a.view(w.dtype) for a, w in zip(arrays, want)], [w.sharding for w in want])
  return jax.tree.unflatten(jax.tree.structure(abstract_state), leaves)


def flat_step(data: bytes, mesh, batch_sharding=None) -> tuple[Callable, tuple[Any, Any]]:
  """The step ``export`` serialized, jitted as a function of ``(the state's leaves as a tuple, batch)`` with the
  shardings it was exported with (on ``mesh``) and the state's leaves donated, and the abstract arguments it
  takes (shapes, dtypes and shardings). Neither needs the run's state: a warm start compiles the step while the
  main thread traces the initialiser for the state's shapes; ``as_step`` then gives it the state's pytree.

  An input of the batch the program never reads (the key mask of a task without padding) was exported without a
  sharding; it gets ``batch_sharding``, the one the run's batches have, or the first call would compile again."""
  exported = jax.export.deserialize(bytearray(data[:-_DIGEST_BYTES]))
  (state_shardings, batch_shardings), kwargs = jax.tree.unflatten(exported.in_tree, exported.in_shardings_jax(mesh))
  batch_shardings = jax.tree.map(lambda s: batch_sharding if s is None else s, batch_shardings,
                                 is_leaf=lambda s: s is None)
  in_shardings = jax.tree.leaves(((state_shardings, batch_shardings), kwargs), is_leaf=lambda s: s is None)
  args, _ = jax.tree.unflatten(exported.in_tree, [
      jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(exported.in_avals, in_shardings)])
  step = jax.jit(exported.call, in_shardings=(state_shardings, batch_shardings),
                 out_shardings=jax.tree.unflatten(exported.out_tree, exported.out_shardings_jax(mesh)),
                 donate_argnums=0)
  return step, args


def as_step(step: Callable, args: tuple[Any, Any], abstract_state, abstract_batch) -> Callable:
  """``flat_step``'s step and arguments as a function of ``(state, batch) -> (state, metrics)`` for the run's
  state. Raises ValueError if it was exported for other shapes, dtypes or shardings."""
  leaves, batch = args
  have, want = jax.tree.leaves((leaves, batch)), jax.tree.leaves((abstract_state, abstract_batch))
  got = [(tuple(a.shape), a.dtype) for a in have]
  expected = [(tuple(w.shape), w.dtype) for w in want]
  if got != expected or jax.tree.structure(batch) != jax.tree.structure(abstract_batch):
    raise ValueError(f'exported for inputs {got}, not {expected}')
  for a, w in zip(have, want):
    if (a.sharding is not None and w.sharding is not None
        and not a.sharding.is_equivalent_to(w.sharding, len(w.shape))):
      raise ValueError(f'exported for an input of shape {tuple(w.shape)} sharded as {a.sharding}, not {w.sharding}')
  state_tree = jax.tree.structure(abstract_state)

  def run(state, batch):
    new_leaves, metrics = step(tuple(jax.tree.leaves(state)), batch)
    return jax.tree.unflatten(state_tree, new_leaves), metrics

  return run


def prime(step: Callable, args: tuple[Any, Any]) -> bool:
  """Runs ``flat_step``'s compiled ``step`` once on zeros of the shapes ``args`` gives, and drops what it returns;
  whether it did: only for a program on CPU devices whose arguments hold at most MAX_STATE_BYTES and no PRNG key.

  Why: on the CPU, the first run of a program read from the cache readies each of its YNNPACK fusions, most of
  the first step's time at the text recipe (``benchmarks/speed/priming.py``), and a run on other arrays of the
  same shapes finds them ready. The trainer's worker does this while the main thread is still making the state,
  so that the first step is a plain one."""
  leaves = jax.tree.leaves(args)
  if (any(jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended) for a in leaves)
      or sum(a.size * np.dtype(a.dtype).itemsize for a in leaves) > MAX_STATE_BYTES
      or any(d.platform != 'cpu' for a in leaves if a.sharding is not None for d in a.sharding.device_set)):
    return False
  zeros = jax.tree.map(lambda a: jax.device_put(np.zeros(a.shape, a.dtype), a.sharding), args)
  jax.block_until_ready(step(*zeros))
  return True


def compile_kept(data: bytes, mesh, batch_sharding, needed: threading.Event | None = None
                 ) -> tuple[Callable, tuple[Any, Any]]:
  """``flat_step`` of the kept ``data``, lowered and compiled (read from the persistent cache when it is there), and
  primed (``prime``) unless ``needed`` is set by then: what a worker of the trainer or of ``symjax.train.early``
  does before the run's state is made."""
  step, args = flat_step(data, mesh, batch_sharding)
  lower(step, data, *args).compile()
  if needed is not None and not needed.is_set():
    prime(step, args)
  return step, args


_hook_lock = threading.Lock()


def lower(step, data: bytes, *args):
  """``step.lower(*args)`` for a step ``flat_step`` made from ``data``, without SciPy when the program needs none.

  Before it lowers a call of any exported program for a CPU, JAX readies its LAPACK kernels, which imports
  SciPy's LAPACK wrappers: 0.3-0.4 s of Python holding the GIL at every warm start, most of the kept step's
  lowering (the docs' "Performance" page). A program calls those kernels only through custom calls named
  ``lapack_...``, which its serialized bytes hold verbatim (tested), and no training step of symjax has one.
  JAX has no public switch for this, so its hook is set aside for this lowering alone; a JAX without that
  hook (0.8) never imports SciPy there, and a program that names a LAPACK kernel is lowered as JAX does it."""
  from jax._src.export import _export  # JAX's own module: the hook is not public
  with _hook_lock:
    ready = getattr(_export, '_ensure_backends_initialized', None)
    if ready is None or b'lapack_' in data:
      return step.lower(*args)
    _export._ensure_backends_initialized = lambda platforms: None
    try:
      return step.lower(*args)
    finally:
      _export._ensure_backends_initialized = ready
