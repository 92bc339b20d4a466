"""Train and evaluate from a recipe.

  python -m symjax.main --config=symbolic[:task=text,size=medium] [--workdir=DIR] [--config.total_steps=500 ...]

``--config`` names a recipe shipped with the package (``symbolic``, ``rasp:task=sort``; the list is in
``--help``) or the path of a config file (``configs/symbolic.py`` from a clone is the same recipe).

Without --workdir the run goes to runs/<config>[_<arguments>][_<hash of the --config.* overrides>], so
rerunning the same command resumes from its latest checkpoint (as does any command given that --workdir).
"""

import hashlib
import os
import sys

from absl import flags
from ml_collections import config_flags

import symjax.configs as configs  # configs/ at the top of the repository, shipped as symjax.configs
from symjax.cli import usage
from symjax.system.errors import InputError, TrainingDiverged

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, f'A recipe, NAME[:key=value,...] with NAME one of {", ".join(configs.names())} (e.g. '
    'symbolic:task=text,size=medium), or the path of a config file (configs/NAME.py in a clone). Sizes: '
    f'{configs.describe_sizes()}.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Work directory: checkpoints, metrics, config, vocabulary.')
flags.mark_flags_as_required(['config'])


def default_workdir(config_arg: str, argv: list[str]) -> str:
  """``runs/<config file>[_<its arguments>][_<hash of the --config.* overrides>]``: the same command
  names the same folder, so rerunning it resumes (or re-evaluates a finished run)."""
  path, _, arg = config_arg.partition(':')
  name = os.path.splitext(os.path.basename(path))[0]
  arg = arg.replace(',', '_').replace('=', '-')
  overrides = sorted(a for a in argv if a.startswith('--config.'))
  digest = hashlib.sha256('\0'.join(overrides).encode()).hexdigest()[:8] if overrides else ''
  return os.path.join('runs', '_'.join(p for p in (name, arg, digest) if p))


def check_workdir(workdir: str) -> None:
  """A work directory that can be created and written, or a one-line InputError saying why not."""
  from symjax.system import files
  try:
    files.make_writable_folder(workdir)
  except OSError as e:
    raise InputError(f'work directory {workdir!r} cannot be created or written ({e.strerror or e}); '
                     f'give --workdir a folder you can write') from None


def main():
  config = _CONFIG.value
  try:
    config.get('task')  # a config file that failed to load raises on first access
  except OSError as e:
    usage.fail(usage.config_error(e, sys.argv))
  workdir = _WORKDIR.value or default_workdir(flags.FLAGS['config'].config_filename, sys.argv)
  from symjax.system import files
  with files.refused_leaves_no_folder(workdir):
    check_workdir(workdir)
    from symjax.train import trainer as train  # after flag parsing: keeps --help fast
    train.train_and_evaluate(config, workdir)


def run():
  # Anything but these is a fault of the code: its traceback shows.
  usage.run(main, errors=(InputError, TrainingDiverged), describe=usage.config_error,
            rewrite=usage.resolve_recipe)


if __name__ == '__main__':
  run()
