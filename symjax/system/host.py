"""Process-wide settings, applied first thing by the trainer and the seed trainer: XLA:CPU's compiler flags
(before the process's first JAX computation) and JAX's persistent compilation cache, which is what makes a
rerun or a resume start without compiling (``symjax.load`` turns the cache on too, for a run's analysis).
"""

from __future__ import annotations

import os
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
