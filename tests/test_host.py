"""symjax.system.host: the compiler flags, which leave the user's own settings alone, and the persistent
compilation cache."""

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
