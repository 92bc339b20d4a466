"""Process-wide settings, in one place: ``prepare`` is called first thing by the trainer, the seed trainer,
``symjax.load`` (the interpretability engine's entry), the tests and the CPU benchmarks. It sets XLA:CPU's
compiler flags (before the process's first JAX computation) and glibc malloc's thresholds; JAX's persistent
compilation cache (``use_compilation_cache``), which is what makes a rerun or a resume start without
compiling, is turned on by the same callers once they know the run's folder.

Why the allocator: XLA:CPU allocates a compiled step's temporary buffers afresh on every call and frees them
when it ends. With glibc's default malloc, buffers above its mmap threshold (128 KiB, rising with use to at
most 32 MiB) are mapped from the kernel and unmapped when freed, and free memory at the top of the heap is
trimmed, so every step writes to pages the kernel must map and zero again: thousands of minor page faults a
step. ``retain_freed_memory`` keeps freed memory for the next allocation instead (measured with and without
in ``benchmarks/speed/train_step.py --allocator``). It changes no computation, only where buffers live; the
cost is that resident memory no longer falls back after a peak.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

# XLA:CPU's YNNPACK library fusions (on by default in recent jaxlib) run the symbolic model's small
# per-channel products and their broadcasts slower than XLA's own fusions, and the seed-vmapped step slower
# still; the standard and token-factored steps, whose batched attention products they speed up, run faster
# with them (measured in benchmarks/results/ynn_by_kind.json). They do not touch GPU or TPU compilation.
YNN_FUSION_FLAG = '--xla_cpu_experimental_ynn_fusion_type'
YNN_FASTER_KINDS = ('standard', 'token_factored')
KEEP_XLA_FLAGS_ENV = 'SYMJAX_KEEP_XLA_FLAGS'


def set_cpu_compiler_defaults(kind: str | None = None) -> bool:
  """Turns XLA:CPU's YNNPACK fusions off by appending ``--xla_cpu_experimental_ynn_fusion_type=`` to
  ``XLA_FLAGS``, unless the process trains one model of a kind they were measured to speed up (``kind`` in
  ``YNN_FASTER_KINDS``), the user already sets that flag, or ``SYMJAX_KEEP_XLA_FLAGS=1``. Returns whether it
  changed anything.

  XLA reads ``XLA_FLAGS`` when its first backend starts, so this acts only if called before the first JAX
  computation of the process (the trainers call it first thing).
  """
  flags = os.environ.get('XLA_FLAGS', '')
  if (kind in YNN_FASTER_KINDS or os.environ.get(KEEP_XLA_FLAGS_ENV, '') not in ('', '0')
      or YNN_FUSION_FLAG in flags):
    return False
  os.environ['XLA_FLAGS'] = f'{flags} {YNN_FUSION_FLAG}='.strip()
  return True


KEEP_MALLOC_ENV = 'SYMJAX_KEEP_MALLOC'
# glibc's own malloc settings: a user who sets any of them keeps them, and symjax sets none.
MALLOC_ENVS = ('MALLOC_TRIM_THRESHOLD_', 'MALLOC_MMAP_THRESHOLD_', 'MALLOC_TOP_PAD_', 'MALLOC_MMAP_MAX_',
               'MALLOC_ARENA_MAX')
# mallopt's parameters (glibc's <malloc.h>) and the values symjax gives them.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8
MALLOC_SETTINGS = (
    (M_TRIM_THRESHOLD, -1),         # read by glibc as the largest size_t: the heap is never trimmed
    (M_MMAP_THRESHOLD, 2**31 - 1),  # the largest value mallopt takes: allocations below 2 GiB use the heap
    (M_TOP_PAD, 2**27),             # above a thread arena's 64 MiB heap: an emptied heap is kept, not unmapped
)
_malloc_applied = False


def retain_freed_memory() -> bool:
  """Sets glibc malloc to reuse freed memory rather than hand it back to the kernel (the module docstring
  says why), with one arena per core this process may run on (each arena keeps its own peak; glibc's default
  is eight per core). Returns whether it changed anything: not on a C library other than glibc, not when the
  user sets malloc through its environment (``MALLOC_*_`` or ``GLIBC_TUNABLES``), not with
  ``SYMJAX_KEEP_MALLOC=1``, and not a second time."""
  global _malloc_applied
  if (_malloc_applied or os.environ.get(KEEP_MALLOC_ENV, '') not in ('', '0') or platform.libc_ver()[0] != 'glibc'
      or any(name in os.environ for name in MALLOC_ENVS) or 'glibc.malloc' in os.environ.get('GLIBC_TUNABLES', '')):
    return False
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:
    cores = os.cpu_count() or 1
  libc = ctypes.CDLL(None)
  if not all([libc.mallopt(param, value) for param, value in (*MALLOC_SETTINGS, (M_ARENA_MAX, max(1, cores)))]):
    return False
  _malloc_applied = True
  return True


def prepare(kind: str | None = None) -> None:
  """The process's settings, before its first JAX computation: XLA:CPU's compiler flags for ``kind``
  (``set_cpu_compiler_defaults``) and the allocator (``retain_freed_memory``)."""
  set_cpu_compiler_defaults(kind)
  retain_freed_memory()


_refused: set[str] = set()  # cache folders already found unwritable: one warning per process


def use_compilation_cache(folder: str) -> None:
  """Keeps compiled programs in ``folder`` (``config.compilation_cache_dir``; '' turns it off), so a rerun or
  resume of the same config skips compilation. A directory already chosen through JAX
  (JAX_COMPILATION_CACHE_DIR) wins. Every program is kept, not only those JAX finds slow to compile (over
  1 s): the evaluation step compiles in less, and recompiling it stalled every rerun's first evaluation; the
  user's own JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS wins. A folder that cannot be made or written turns
  the cache off with one warning line (the run does not need it), instead of JAX's warning at every
  compilation."""
  import jax

  from symjax.system import files
  if not folder or jax.config.jax_compilation_cache_dir:
    return
  folder = os.path.expanduser(folder)
  try:
    files.make_writable_folder(folder)
  except OSError as e:
    if folder not in _refused and jax.process_index() == 0:
      print(f'WARNING: config.compilation_cache_dir {folder!r} cannot be created or written '
            f"({e.strerror or e}); compiling without the persistent cache (set it to a writable folder, or '' "
            f'to turn it off)', file=sys.stderr)
    _refused.add(folder)
    return
  jax.config.update('jax_compilation_cache_dir', folder)
  if 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS' not in os.environ:
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
