"""The training command's kept step, compiled from its config alone while the trainer is still being imported.

A warm start finds its kept step (``symjax.train.exported``) only once it has the step's key, and the key holds
the task's and the model's shapes: the task and the model must be built, so Flax, Optax and the trainer imported,
first, all of it before the step's program could be read from the cache (the docs' "Performance" page has the
timeline). The command knows its config before any of it.

So each start notes, under a digest of what the command alone fixes (``config_key``: the config, symjax's
source, the library versions, ``XLA_FLAGS``), the key of the step it trained (``note``). The training command
calls ``start`` before it imports the trainer: it reads that note and compiles the step named there on a worker
thread. The trainer uses that step only if the key it then makes from the task and model is the one noted
(``EarlyStep.future_for``); otherwise it compiles its own, as without a note. The note is a guess, never trusted:
a corpus changed under the same config names another step, and that check finds it.

Only a single-process run with a local compilation cache is started early (``start`` returns None for any
other, and for a run that distils from a teacher or begins with a soft phase, whose steps are keyed otherwise).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import sys
import threading
from typing import Any

import ml_collections

from symjax.system import files, host

NOTE_SUFFIX = '.note'
_refused: set[str] = set()  # cache folders already found unwritable: one warning per process


def use_compilation_cache(config: ml_collections.ConfigDict) -> None:
  """Keeps compiled steps on disk (``config.compilation_cache_dir``), so a rerun or resume of the same
  config skips compilation. A directory already chosen through JAX (JAX_COMPILATION_CACHE_DIR) wins. Every
  program is kept, not only those JAX finds slow to compile (over 1 s): the evaluation step compiles in less,
  and recompiling it stalled every rerun's first evaluation (the docs' "Performance" page); the user's own
  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS wins. A folder that cannot be made or written turns the cache
  off with one warning line (the run does not need it), instead of JAX's warning at every compilation."""
  import jax
  if config.get('compilation_cache_dir') and not jax.config.jax_compilation_cache_dir:
    folder = os.path.expanduser(config.compilation_cache_dir)
    try:
      files.make_writable_folder(folder)
    except OSError as e:
      if folder not in _refused and jax.process_index() == 0:
        print(f'WARNING: config.compilation_cache_dir {config.compilation_cache_dir!r} cannot be created or '
              f"written ({e.strerror or e}); compiling without the persistent cache (set it to a writable "
              f"folder, or '' to turn it off)", file=sys.stderr)
      _refused.add(folder)
      return
    jax.config.update('jax_compilation_cache_dir', folder)
    if 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS' not in os.environ:
      jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)


def config_key(config: ml_collections.ConfigDict) -> str:
  """A digest of what the training command fixes before it builds the task and the model: the config, symjax's
  source, the versions of Python and the libraries, and ``XLA_FLAGS``. Under it ``note`` keeps the key of the
  step the command trained."""
  from symjax.train import exported
  parts = {
      'config': config.to_json_best_effort(sort_keys=True),
      'source': exported.source_digest(),
      'versions': list(exported.versions()),
      'xla_flags': os.environ.get('XLA_FLAGS', ''),
  }
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def note(config: ml_collections.ConfigDict, step_key: str) -> None:
  """Notes that the command of ``config`` trains the step of ``step_key`` (``exported.step_key``), for the next
  start's ``start``; nothing where no step is kept (``exported.path_for``), or if the note is already there or
  cannot be written (the step itself warns about an unwritable folder)."""
  from symjax.train import exported
  path = exported.path_for(config_key(config), NOTE_SUFFIX)
  if path is None:
    return
  try:
    with open(path) as f:
      if f.read() == step_key:
        return
  except OSError:
    pass
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    files.write_atomically(path, step_key.encode())
  except OSError:
    pass


@dataclasses.dataclass
class EarlyStep:
  """A step compiled by ``start``: its key, the mesh it was compiled for, and the future of ``(the flat step, its
  arguments)`` (``exported.flat_step``), or of None if it could not be read, compiled or primed. The worker primes
  the step (``exported.prime``) only if it is compiled before the trainer sets ``needed``
  (``symjax.train.trainer.compile_ahead``)."""

  key: str
  mesh: Any
  future: concurrent.futures.Future
  needed: threading.Event

  def future_for(self, key: str, mesh) -> concurrent.futures.Future | None:
    """The future of this step if it is the step of ``key`` on ``mesh``, else None."""
    return self.future if key == self.key and mesh == self.mesh else None


def single_process(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config`` asks for one process and nothing the backend must know before it starts (no coordinator,
  no CPU collectives): ``start`` must not start it before ``mesh.maybe_initialize_distributed`` would run."""
  d = config.get('distributed')
  if d is None:
    return not os.environ.get('JAX_COORDINATOR_ADDRESS')
  return not (d.get('coordinator_address') or d.get('num_processes', 1) > 1 or d.get('cpu_collectives')
              or os.environ.get('JAX_COORDINATOR_ADDRESS'))


def start(config: ml_collections.ConfigDict) -> EarlyStep | None:
  """Starts compiling, on a worker thread, the step an earlier start of the same command noted (``note``), with
  the trainer's host settings and compilation cache applied first; None if there is no note, or the run is not
  one ``start`` serves (the module docstring). Called by the training command before it imports the trainer;
  ``symjax.train.trainer.train_and_evaluate`` takes the result. Nothing here raises: any failure returns None (or
  a future of None), and the trainer then does and reports what it would have done. The one line it may print is
  ``use_compilation_cache``'s, for a cache folder that cannot be written, which the trainer does not repeat."""
  try:
    if not single_process(config) or config.get('soft_steps', 0) or (config.get('distill') or {}).get('teacher'):
      return None
    host.set_defaults(config.get('model', {}).get('kind'))
    import jax

    from symjax.system import mesh as mesh_lib
    from symjax.train import exported
    folder = jax.config.jax_compilation_cache_dir or (
        os.path.expanduser(config.compilation_cache_dir) if config.get('compilation_cache_dir') else '')
    if not folder or '://' in folder:
      return None
    note_file = os.path.join(folder, exported.FOLDER, config_key(config) + NOTE_SUFFIX)
    try:
      with open(note_file) as f:
        key = f.read()
    except OSError:
      return None
    use_compilation_cache(config)
    path = exported.path_for(key)
    if path is None or not jax.config.jax_compilation_cache_dir:
      return None
    mesh = mesh_lib.make_mesh(config.mesh.data, config.mesh.vocab, config.batch_size)
  except Exception:  # pylint: disable=broad-except
    return None
  needed = threading.Event()

  def compile_():
    try:
      data = exported.read(path, quiet=True)
      if data is None:
        return None
      with jax.set_mesh(mesh):
        return exported.compile_kept(data, mesh, mesh_lib.batch_sharding(mesh), needed)
    except Exception:  # pylint: disable=broad-except
      return None

  pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='symjax-early')
  try:
    return EarlyStep(key, mesh, pool.submit(compile_), needed)
  finally:
    pool.shutdown(wait=False)
