"""Every command's usage errors in one style: one ``error:`` line naming the flag or argument, a non-zero
exit, nothing created; ``--help`` lists the command's own flags; old module paths forward."""

import errno
import os
import re
import subprocess
import sys

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow  # runs commands

# Each command, the flags it requires (with values that pass the flag parser) and one flag it defines.
COMMANDS = {
    'symjax.main': (['--config=symbolic:size=tiny', '--workdir={tmp}/w'], '--workdir'),
    'symjax.cli.sample': (['--workdir={tmp}/w'], '--num_tokens'),
    'symjax.sample': (['--workdir={tmp}/w'], '--num_tokens'),
    'symjax.cli.sweep': (['--config=symbolic:size=tiny', '--workdir={tmp}/w'], '--seeds'),
    'symjax.sweep': (['--config=symbolic:size=tiny', '--workdir={tmp}/w'], '--seeds'),
    'symjax.cli.tokenize': (['--text_path={tmp}/t.txt', '--out={tmp}/w'], '--bpe_vocab_size'),
    'symjax.tokenize': (['--text_path={tmp}/t.txt', '--out={tmp}/w'], '--bpe_vocab_size'),
    'symjax.cli.align': (['--backbone={tmp}/b', '--workdir={tmp}/w'], '--backbone'),
    'symjax.align': (['--backbone={tmp}/b', '--workdir={tmp}/w'], '--backbone'),
    'symjax.report': (['--workdir={tmp}/w'], '--ig_steps'),
    'symjax.decompile': (['--workdir={tmp}/w'], '--split'),
}


def run(module, args, cwd):
  env = {**os.environ, 'PYTHONPATH': REPO}
  return subprocess.run([sys.executable, '-m', module, *args], cwd=cwd, capture_output=True, text=True, env=env)


@pytest.mark.parametrize('module', sorted(COMMANDS))
def test_usage_mistakes_are_one_line_each_and_create_nothing(module, tmp_path):
  required, own = COMMANDS[module]
  required = [a.format(tmp=tmp_path) for a in required]
  cases = {
      'stray argument': (required + ['extra_arg'], r"unexpected argument 'extra_arg': python -m "),
      'missing required flag': (required[1:], rf'{required[0].split("=")[0]} is required'),
      'unknown flag': (required + ['--no_such_flag=1'], r'unknown flag --no_such_flag; flags of python -m '),
  }
  for case, (args, message) in cases.items():
    proc = run(module, args, tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (case, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith('error: '), (case, proc.stderr[-2000:])
    assert re.search(message, lines[0]), (case, lines[0])
    if case != 'missing required flag':
      assert own in lines[0], (case, lines[0])  # the command's own flags are named
    assert os.listdir(tmp_path) == [], (case, os.listdir(tmp_path))


@pytest.mark.parametrize('module', sorted(COMMANDS))
def test_help_lists_the_commands_own_flags(module, tmp_path):
  proc = run(module, ['--help'], tmp_path)
  _, own = COMMANDS[module]
  assert f'  {own}:' in proc.stdout, proc.stdout[-2000:]
  assert proc.returncode == 0  # help asked for and given is a success


def test_the_training_help_names_every_config_field_and_the_fields_page(tmp_path):
  from symjax.train import config as config_lib
  out = run('symjax.main', ['--help'], tmp_path).stdout
  assert 'docs/configs.md' in out
  missing = [k for k in config_lib.default_config() if k not in out]
  assert not missing, missing


def test_a_refused_training_start_leaves_no_work_directory(tmp_path):
  proc = run('symjax.main', ['--config=symbolic:size=tiny', f'--workdir={tmp_path}/a/b',
                             '--config.total_steps=-3'], tmp_path)
  assert proc.returncode == 1 and proc.stderr.strip() == 'error: config.total_steps must be > 0, got -3'
  assert os.listdir(tmp_path) == []


def test_a_report_that_cannot_be_written_names_the_path_and_the_flag(tmp_path, monkeypatch):
  """A read-only mount cannot be made here without privileges; the error it raises (EROFS) can."""
  from symjax.cli import interpret
  from symjax.system import files

  def read_only(folder):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), folder)

  monkeypatch.setattr(files, 'make_writable_folder', read_only)
  path = str(tmp_path / 'r' / 'report.html')
  with pytest.raises(ValueError, match=rf"cannot write '{path}' \(Read-only file system\); choose another place "
                                       r'with --output'):
    interpret.check_writable(path)
