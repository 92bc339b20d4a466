"""symjax.system.host: the compiler flags, the dispatch of CPU programs, and the allocator setting, which keeps
freed memory for the next allocation. Each leaves the user's own settings alone. The dispatch and allocator
cases run in fresh processes, since the settings are process-wide."""

import json
import os
import platform
import subprocess
import sys

import pytest

from symjax.system import host

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != 'glibc', reason='mallopt is glibc\'s')

# Loads symjax/system/host.py by path (no JAX import), optionally applies the setting, then counts the minor page
# faults of writing a 64 MiB buffer four times, each freed before the next: above glibc's largest dynamic
# mmap threshold (32 MiB), so by default every buffer is a fresh mapping the kernel must fault in.
_SCRIPT = """
import importlib.util, json, resource, sys
spec = importlib.util.spec_from_file_location('host', sys.argv[1])
host = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host)
applied = [host.retain_freed_memory() for _ in range(int(sys.argv[2]))]
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def write_and_free():
  b = bytearray(64 << 20)       # zero-filled: every page written
  del b
write_and_free()
start = faults()
for _ in range(4):
  write_and_free()
print(json.dumps([applied, faults() - start]))
"""


def clean_env() -> dict[str, str]:
  """This process's environment without any of the user's malloc settings."""
  return {k: v for k, v in os.environ.items() if k != host.KEEP_MALLOC_ENV
          and k not in host.MALLOC_ENVS and k != 'GLIBC_TUNABLES'}


def run(calls: int, **env) -> tuple[list[bool], int]:
  out = subprocess.run([sys.executable, '-c', _SCRIPT, host.__file__, str(calls)], env={**clean_env(), **env},
                       capture_output=True, text=True, check=True).stdout
  applied, faults = json.loads(out)
  return applied, faults


@pytest.fixture(scope='module')
def default_faults() -> int:
  applied, faults = run(0)
  assert applied == []
  return faults


@glibc_only
def test_default_malloc_faults_in_every_buffer(default_faults):
  # Four fresh 64 MiB mappings: at least one fault per 2 MiB page (transparent huge pages), 4 KiB otherwise.
  assert default_faults >= 4 * 32


@glibc_only
def test_setting_reuses_freed_memory_and_applies_once(default_faults):
  applied, faults = run(2)
  assert applied == [True, False]           # changed settings once; the second call changes nothing
  assert faults * 20 < default_faults, (faults, default_faults)


@glibc_only
@pytest.mark.parametrize('env', [{host.KEEP_MALLOC_ENV: '1'}, {'MALLOC_TRIM_THRESHOLD_': '131072'},
                                 {'MALLOC_ARENA_MAX': '4'}, {'GLIBC_TUNABLES': 'glibc.malloc.trim_threshold=131072'}])
def test_user_settings_are_left_alone(env, default_faults):
  applied, faults = run(1, **env)
  assert applied == [False]
  assert faults * 2 > default_faults, (faults, default_faults)


@pytest.mark.skipif(not hasattr(os, 'sched_setaffinity'), reason='CPU affinity is a Linux call')
def test_one_malloc_arena_per_core_the_process_may_run_on():
  code = ('import os, sys; sys.path.insert(0, os.path.dirname(sys.argv[1])); import host; '
          'os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); print(host.arena_setting())')
  pinned = subprocess.run([sys.executable, '-c', code, host.__file__], capture_output=True, text=True, check=True)
  assert pinned.stdout.strip() == f'({host.M_ARENA_MAX}, 1)'
  assert host.arena_setting() == (host.M_ARENA_MAX, len(os.sched_getaffinity(0)))


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


# Applies the setting (unless told not to), writes and frees a 64 MiB buffer, then asks for the freed memory
# to be released; prints the resident growth (MiB) after the free and after the release.
_RELEASE_SCRIPT = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location('host', sys.argv[1])
host = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host)
applied = host.retain_freed_memory() if sys.argv[2] == '1' else False
resident = lambda: int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20
start = resident()
b = bytearray(b'\\x01') * (64 << 20)  # every page written
del b
freed = resident() - start
released = host.release_freed_memory()
print(json.dumps([applied, released, freed, resident() - start]))
"""


@glibc_only
@pytest.mark.parametrize('apply', [True, False])
def test_release_hands_back_what_the_setting_kept(apply):
  out = subprocess.run([sys.executable, '-c', _RELEASE_SCRIPT, host.__file__, str(int(apply))], env=clean_env(),
                       capture_output=True, text=True, check=True).stdout
  applied, released, freed, after = json.loads(out)
  assert applied == released == apply
  if apply:
    assert freed > 48 and after < 16, (freed, after)   # kept after the free, handed back by the release
  else:
    assert freed < 16 and after < 16, (freed, after)   # glibc's defaults unmap it at once; nothing to do


# Applies the dispatch setting twice in a fresh process (this one's was set by conftest), then calls a program
# of about 13 GFLOP and asks whether its result is ready the moment the call returns: it is when the program ran
# on the calling thread, and not when the call only queued it.
_DISPATCH_SCRIPT = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location('host', sys.argv[1])
host = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host)
applied = [host.run_cpu_programs_inline(), host.run_cpu_programs_inline()]
import jax, jax.numpy as jnp
f = jax.jit(lambda x: (x @ x @ x).sum())
x = jnp.ones((1500, 1500))
f(x).block_until_ready()
y = f(x)
print(json.dumps([applied, jax.config.values[host.ASYNC_DISPATCH_OPTION], y.is_ready()]))
"""


@pytest.mark.parametrize('keep', ['', '1'])
def test_cpu_programs_run_inline_unless_the_user_keeps_asynchronous_dispatch(keep):
  env = {k: v for k, v in os.environ.items() if k != host.KEEP_DISPATCH_ENV}
  if keep:
    env[host.KEEP_DISPATCH_ENV] = keep
  out = subprocess.run([sys.executable, '-c', _DISPATCH_SCRIPT, host.__file__], env={**env, 'JAX_PLATFORMS': 'cpu'},
                       capture_output=True, text=True, check=True).stdout
  applied, asynchronous, ready_on_return = json.loads(out)
  if keep:
    assert (applied, asynchronous, ready_on_return) == ([False, False], True, False)
  else:  # changed once; the program's result exists when the call returns
    assert (applied, asynchronous, ready_on_return) == ([True, False], False, True)


# Defers the collector twice in a fresh process, then makes a reference cycle and, while it is unreachable, far
# more new container objects than the collector's first threshold (700): with the collector on, it would have
# freed the cycle. Then ends the start-up twice.
_GC_SCRIPT = """
import gc, importlib.util, json, sys, weakref
spec = importlib.util.spec_from_file_location('host', sys.argv[1])
host = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host)
deferred = [host.defer_garbage_collection(), host.defer_garbage_collection()]
on_during = gc.isenabled()
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
cycle = weakref.ref(a)
del a, b
kept = [[] for _ in range(20000)]
cycle_outlived_start_up = cycle() is not None
ended = [host.collect_start_up_garbage(), host.collect_start_up_garbage()]
print(json.dumps([deferred, on_during, cycle_outlived_start_up, ended, cycle() is None, gc.isenabled(),
                  gc.get_freeze_count() >= len(kept)]))
"""


@pytest.mark.parametrize('keep', ['', '1'])
def test_garbage_collection_waits_for_the_end_of_start_up_unless_the_user_keeps_it(keep):
  env = {k: v for k, v in os.environ.items() if k != host.KEEP_GC_ENV}
  if keep:
    env[host.KEEP_GC_ENV] = keep
  out = subprocess.run([sys.executable, '-c', _GC_SCRIPT, host.__file__], env=env, capture_output=True, text=True,
                       check=True).stdout
  deferred, on_during, outlived, ended, freed, on_after, frozen = json.loads(out)
  if keep:  # nothing changed: the collector freed the cycle as usual, nothing is frozen
    assert (deferred, on_during, outlived, ended, freed, on_after, frozen) == (
        [False, False], True, False, [False, False], True, True, False)
  else:  # off once, then one collection frees the cycle, the survivors are frozen and the collector is back on
    assert (deferred, on_during, outlived, ended, freed, on_after, frozen) == (
        [True, False], False, True, [True, False], True, True, True)

