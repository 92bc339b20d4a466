"""Process-wide settings of the host's memory allocator, applied first thing by the trainer, the seed
trainer, the tests and the benchmarks.

XLA:CPU allocates the temporary buffers of a compiled step afresh on every call and frees them when the
call ends. With glibc's default malloc, buffers above its mmap threshold (128 KiB, rising with use to at
most 32 MiB) are mapped from the kernel and unmapped when freed, and free memory at the top of the heap is
handed back (trimmed). Either way the next step writes to pages the kernel must map and zero again: at the
text recipe, 10,000-15,000 minor page faults per training step and a quarter or more of the process's CPU
time in the kernel (README, "On this CPU", has the measured steps). ``retain_freed_memory`` asks malloc to keep
freed memory for the next allocation instead (``mallopt``): the heap is never trimmed, allocations below
2 GiB come from the heap rather than their own mappings, and a top pad of 128 MiB keeps the 64 MiB heaps of
the per-thread arenas from being unmapped whenever one falls empty.
It changes no computation, only where buffers live. The cost: the process's resident memory no longer
falls back after a peak, and the heap may hold more than the live data (README gives the measured sizes).
"""

from __future__ import annotations

import ctypes
import os
import platform

KEEP_MALLOC_ENV = 'SYMJAX_KEEP_MALLOC'
# The user's own malloc settings, which are left alone.
MALLOC_ENVS = ('MALLOC_TRIM_THRESHOLD_', 'MALLOC_MMAP_THRESHOLD_', 'MALLOC_TOP_PAD_', 'MALLOC_MMAP_MAX_')
# mallopt's parameters (glibc's <malloc.h>).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
SETTINGS = (
    (M_TRIM_THRESHOLD, -1),        # read by glibc as the largest size_t: the heap is never trimmed
    (M_MMAP_THRESHOLD, 2**31 - 1), # the largest int mallopt takes: allocations below 2 GiB use the heap
    (M_TOP_PAD, 2**27),            # above a thread arena's 64 MiB heap: an empty heap is kept, not unmapped
)

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
  if not all([libc.mallopt(param, value) for param, value in SETTINGS]):
    return False
  _applied = True
  return True
