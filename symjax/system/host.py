"""Process-wide settings of the host, applied first thing (``set_defaults``) by the trainer, the seed
trainer, the tests and the CPU benchmarks: XLA:CPU's compiler flags, how JAX dispatches CPU programs, and
glibc malloc's thresholds; and, for the training command alone, when Python's garbage collector runs
(``defer_garbage_collection``).

XLA:CPU allocates the temporary buffers of a compiled step afresh on every call and frees them when the
call ends. With glibc's default malloc, buffers above its mmap threshold (128 KiB, rising with use to at
most 32 MiB) are mapped from the kernel and unmapped when freed, and free memory at the top of the heap is
handed back (trimmed). Either way the next step writes to pages the kernel must map and zero again: at the
text recipe, thousands of minor page faults per training step and a large share of the process's CPU
time in the kernel (the docs' "Performance" page has the measurements). ``retain_freed_memory`` asks malloc to keep
freed memory for the next allocation instead (``mallopt``): the heap is never trimmed, allocations below
2 GiB come from the heap rather than their own mappings, and a top pad of 128 MiB keeps the 64 MiB heaps of
the per-thread arenas from being unmapped whenever one falls empty; since each arena then keeps its own peak,
there is one arena per core the process may run on (``arena_setting``), not glibc's eight per core.
It changes no computation, only where buffers live. The cost: the process's resident memory no longer
falls back after a peak, and the heap may hold more than the live data (measured on the same page).
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform

# XLA:CPU's YNNPACK library fusions (on by default in recent jaxlib) run the symbolic model's small
# per-channel products and their broadcasts slower than XLA's own fusions, and the seed-vmapped step slower
# still; the standard and token-factored steps, whose batched attention products they speed up, run faster
# with them (the docs' "Performance" page has the measurements). They do not touch GPU or TPU compilation.
YNN_FUSION_FLAG = '--xla_cpu_experimental_ynn_fusion_type'
YNN_FASTER_KINDS = ('standard', 'token_factored')
KEEP_XLA_FLAGS_ENV = 'SYMJAX_KEEP_XLA_FLAGS'


def set_cpu_compiler_defaults(kind: str | None = None) -> bool:
  """Turns XLA:CPU's YNNPACK fusions off by appending ``--xla_cpu_experimental_ynn_fusion_type=`` to
  ``XLA_FLAGS``, unless the process trains one model of a kind they were measured to speed up (``kind`` in
  ``YNN_FASTER_KINDS``), the user already sets that flag, or ``SYMJAX_KEEP_XLA_FLAGS=1``. Returns whether it
  changed anything.

  XLA reads ``XLA_FLAGS`` when its first backend starts, so this acts only if called before the first JAX
  computation of the process (``set_defaults`` is called first thing).
  """
  flags = os.environ.get('XLA_FLAGS', '')
  if (kind in YNN_FASTER_KINDS or os.environ.get(KEEP_XLA_FLAGS_ENV, '') not in ('', '0')
      or YNN_FUSION_FLAG in flags):
    return False
  os.environ['XLA_FLAGS'] = f'{flags} {YNN_FUSION_FLAG}='.strip()
  return True


KEEP_MALLOC_ENV = 'SYMJAX_KEEP_MALLOC'
# The user's own malloc settings, which are left alone.
MALLOC_ENVS = ('MALLOC_TRIM_THRESHOLD_', 'MALLOC_MMAP_THRESHOLD_', 'MALLOC_TOP_PAD_', 'MALLOC_MMAP_MAX_',
               'MALLOC_ARENA_MAX')
# mallopt's parameters (glibc's <malloc.h>).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8
SETTINGS = (
    (M_TRIM_THRESHOLD, -1),        # read by glibc as the largest size_t: the heap is never trimmed
    (M_MMAP_THRESHOLD, 2**31 - 1), # the largest int mallopt takes: allocations below 2 GiB use the heap
    (M_TOP_PAD, 2**27),            # above a thread arena's 64 MiB heap: an empty heap is kept, not unmapped
)


def arena_setting() -> tuple[int, int]:
  """(M_ARENA_MAX, the cores this process may run on): one malloc arena per core, chosen from the machine
  at run time. glibc's default is eight per core; since freed memory is kept, every arena keeps its own
  peak, and the many arenas of XLA's and the checkpointer's threads held about a fifth of the trainer's
  resident memory at the text recipe, for no measured speed (the docs' "Performance" page)."""
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    cores = os.cpu_count() or 1
  return M_ARENA_MAX, max(1, cores)


_applied = False


def retain_freed_memory() -> bool:
  """Sets glibc malloc to reuse freed memory rather than return it to the kernel (see the module's
  docstring). Returns whether it changed anything: not on a C library other than glibc, not if the user
  sets glibc's malloc through its environment variables (``MALLOC_TRIM_THRESHOLD_`` and the like, or
  ``GLIBC_TUNABLES``), not with ``SYMJAX_KEEP_MALLOC=1``, and not a second time.
  """
  global _applied
  if (_applied or os.environ.get(KEEP_MALLOC_ENV, '') not in ('', '0') or platform.libc_ver()[0] != 'glibc'
      or any(name in os.environ for name in MALLOC_ENVS) or 'glibc.malloc' in os.environ.get('GLIBC_TUNABLES', '')):
    return False
  libc = ctypes.CDLL(None)
  if not all([libc.mallopt(param, value) for param, value in (*SETTINGS, arena_setting())]):
    return False
  _applied = True
  return True


def release_freed_memory() -> bool:
  """Hands the heap's free memory back to the kernel once (glibc's ``malloc_trim``), where
  ``retain_freed_memory`` applied: compiling a program frees far more than a step ever uses again, and the
  setting would otherwise keep it resident for the whole run. Called after each compilation, not between
  steps: the next step faults its buffers in once and then keeps them. Returns whether it ran."""
  if not _applied:
    return False
  ctypes.CDLL(None).malloc_trim(0)
  return True


KEEP_DISPATCH_ENV = 'SYMJAX_KEEP_DISPATCH'
ASYNC_DISPATCH_OPTION = 'jax_cpu_enable_async_dispatch'


def run_cpu_programs_inline() -> bool:
  """Turns off JAX's asynchronous dispatch of CPU programs (``jax_cpu_enable_async_dispatch``): a program
  then runs on the thread that calls it, which waits for it. Returns whether it changed the option: not with
  ``SYMJAX_KEEP_DISPATCH=1``, and not if the option is off already.

  Why: with asynchronous dispatch a step's temporary buffer (one block per step, 40-60 MiB at the text recipe)
  is allocated sometimes by the calling thread and sometimes by the runtime's, so it lands in both threads'
  malloc arenas; ``retain_freed_memory`` keeps each arena's peak, and the training process's peak was about
  200 MiB higher for the symbolic model (the docs' "Performance" page). The host's own work per step (the
  next batch) then no longer overlaps the step, so the trainer makes it on another thread
  (``symjax.train.trainer.prefetched``). The option applies to programs on one CPU device; JAX reads it when
  the CPU backend starts, so this acts only if called before the process's first JAX computation.
  """
  if os.environ.get(KEEP_DISPATCH_ENV, '') not in ('', '0'):
    return False
  import jax  # here, not at the top: the allocator's tests load this file without JAX
  if not jax.config.values[ASYNC_DISPATCH_OPTION]:
    return False
  jax.config.update(ASYNC_DISPATCH_OPTION, False)
  return True


KEEP_GC_ENV = 'SYMJAX_KEEP_GC'
_gc_deferred = False


def defer_garbage_collection() -> bool:
  """Turns Python's cyclic garbage collector off until ``collect_start_up_garbage``: called first thing by the
  training command (``symjax.main``), before JAX and Flax are imported. Returns whether it changed anything:
  not with ``SYMJAX_KEEP_GC=1``, and not if the collector is off already.

  Why: the imports and the first trace leave over a hundred thousand objects that live as long as the process.
  The collector walked them again and again on the way to the first step, and each of its full passes over them
  during training held the loop up for a fifth of a second (the docs' "Performance" page).
  """
  global _gc_deferred
  if os.environ.get(KEEP_GC_ENV, '') not in ('', '0') or not gc.isenabled():
    return False
  gc.disable()
  _gc_deferred = True
  return True


def collect_start_up_garbage() -> bool:
  """Where ``defer_garbage_collection`` turned the collector off: collects the start-up's garbage once, moves
  every object that survives it into the permanent generation (``gc.freeze``: the collector's passes skip
  those from then on) and turns the collector back on. Called by the trainer after the first step. Returns
  whether it ran."""
  global _gc_deferred
  if not _gc_deferred:
    return False
  _gc_deferred = False
  gc.collect()
  gc.freeze()
  gc.enable()
  return True


def set_defaults(kind: str | None = None) -> None:
  """The three settings: the compiler flags and the dispatch (before the process's first JAX computation;
  ``kind``: the one model kind the process trains, if it trains one) and the allocator."""
  set_cpu_compiler_defaults(kind)
  run_cpu_programs_inline()
  retain_freed_memory()
