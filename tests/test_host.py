"""symjax.system.host: the compiler flags and the allocator, which leave the user's own settings alone, and
the persistent compilation cache."""

import os

from symjax.system import host


def test_cpu_compiler_defaults_turn_ynn_fusions_off_unless_the_user_chose(monkeypatch):
  flag = host.YNN_FUSION_FLAG
  monkeypatch.delenv(host.KEEP_XLA_FLAGS_ENV, raising=False)
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
  assert host.set_cpu_compiler_defaults()
  assert os.environ['XLA_FLAGS'] == f'--xla_force_host_platform_device_count=8 {flag}='
  assert not host.set_cpu_compiler_defaults()            # already there: added once
  assert os.environ['XLA_FLAGS'].count(flag) == 1
  monkeypatch.setenv('XLA_FLAGS', f'{flag}=reduce')            # the user's own choice wins
  assert not host.set_cpu_compiler_defaults()
  assert os.environ['XLA_FLAGS'] == f'{flag}=reduce'
  monkeypatch.delenv('XLA_FLAGS')
  for kind in host.YNN_FASTER_KINDS:                          # a kind they speed up keeps them
    assert not host.set_cpu_compiler_defaults(kind)
    assert 'XLA_FLAGS' not in os.environ
  assert host.set_cpu_compiler_defaults('symbolic')
  assert os.environ['XLA_FLAGS'] == f'{flag}='
  monkeypatch.delenv('XLA_FLAGS')
  monkeypatch.setenv(host.KEEP_XLA_FLAGS_ENV, '1')          # opt-out keeps XLA's defaults
  assert not host.set_cpu_compiler_defaults()
  assert 'XLA_FLAGS' not in os.environ


_MALLOC_PROBE = '''
import ctypes, json, sys
from symjax.system import host
class Info(ctypes.Structure):  # glibc's struct mallinfo2
  _fields_ = [(n, ctypes.c_size_t) for n in ('arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks',
                                             'fsmblks', 'uordblks', 'fordblks', 'keepcost')]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype, libc.malloc.restype = Info, ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
applied = host.prepare() or host._malloc_applied
mapped = libc.mallinfo2().hblks
block = libc.malloc(64 << 20)          # a step-sized temporary: mapped from the kernel under glibc's defaults
mapped_after = libc.mallinfo2().hblks
libc.free(block)
heap = libc.mallinfo2().arena           # what the heap keeps after the free (trimmed under the defaults)
print(json.dumps({'applied': applied, 'mapped': mapped_after - mapped, 'heap_mib': heap >> 20}))
'''


def _malloc_probe(**env) -> dict:
  import json
  import subprocess
  import sys
  clean = {k: v for k, v in os.environ.items() if k not in host.MALLOC_ENVS and k != host.KEEP_MALLOC_ENV}
  out = subprocess.run([sys.executable, '-c', _MALLOC_PROBE], env={**clean, **env}, capture_output=True, text=True,
                       check=True)
  return json.loads(out.stdout)


def test_the_allocator_setting_is_in_force_after_prepare():
  """``prepare`` keeps a step's large temporaries in the heap: a 64 MiB block is not mapped from the kernel,
  and the heap still holds it after it is freed. With glibc's defaults (``SYMJAX_KEEP_MALLOC=1``) the same
  block is mapped, and the heap keeps nothing of it; a user's own ``MALLOC_*_`` setting is left alone."""
  kept = _malloc_probe()
  assert kept['applied'] and kept['mapped'] == 0 and kept['heap_mib'] >= 64, kept
  default = _malloc_probe(**{host.KEEP_MALLOC_ENV: '1'})
  assert not default['applied'] and default['mapped'] == 1 and default['heap_mib'] < 64, default
  users = _malloc_probe(MALLOC_ARENA_MAX='2')
  assert not users['applied'] and users['mapped'] == 1, users
