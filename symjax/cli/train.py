"""Train and evaluate from a recipe.

  python -m symjax.main --config=symbolic[:task=text,size=medium] [--workdir=DIR] [--config.total_steps=500 ...]

``--config`` names a recipe shipped with the package (``symbolic``, ``rasp:task=sort``; the list is in
``--help``) or the path of a config file (``configs/symbolic.py`` from a clone is the same recipe).

Without --workdir the run goes to runs/<config>[_<arguments>][_<hash of the --config.* overrides>], so
rerunning the same command resumes from its latest checkpoint (as does any command given that --workdir).
"""

import hashlib
import os
import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags

import symjax.configs as configs  # configs/ at the top of the repository, shipped as symjax.configs
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


def _innermost(e: BaseException) -> BaseException:
  while (e.__cause__ or e.__context__) is not None:
    e = e.__cause__ or e.__context__
  return e


def config_error(e: BaseException, argv: list[str]) -> str:
  """One line saying what is wrong with the command's config arguments, and what is allowed."""
  config_arg = next((a.split('=', 1)[1] for a in argv if a.startswith('--config=')), '')
  path = config_arg.split(':')[0]
  inner = _innermost(e)
  if not config_arg and isinstance(e, flags.IllegalFlagValueError) and '--config' in str(e):
    return ('--config is required: a recipe name or the path of a config file, e.g. --config=symbolic or '
            '--config=configs/symbolic.py')
  if isinstance(e, SyntaxError) or isinstance(inner, SyntaxError):
    err = e if isinstance(e, SyntaxError) else inner
    return f'config file {path!r} has a syntax error at line {err.lineno}: {err.msg}'
  if isinstance(e, OSError) and not os.path.isfile(path):
    return (f'config {path!r} is neither a file nor a recipe; recipes: {configs.names()} (or the path of a Python '
            f'file with get_config())')
  if isinstance(e, (AttributeError, KeyError)):
    name = str(inner).strip('"\'')
    override = next((a.split('=', 1)[0] for a in argv if a.startswith('--config.')
                     and a.split('=', 1)[0].split('.')[-1] == name), f'--config.{name}')
    return f'{override}: the config has no field {name!r}; {known_fields(config_arg, override)}'
  if isinstance(e, flags.Error):
    prefix = re.match(r'flag (--[^=]+=)', str(e))
    flag = next((a for a in argv if prefix and a.startswith(prefix.group(1))), str(e).split(': ', 1)[0])
    return f'{flag}: {" ".join(str(inner).split())}'
  return f'{type(e).__name__}: {" ".join(str(e).split())}'


def known_fields(config_arg: str, override: str) -> str:
  """'fields of ...: [...]' for the config node an unknown ``--config.a.b`` override points into."""
  from symjax.train import config as config_lib  # only on this error path: keeps --help fast
  try:
    node = config_lib.from_file(config_arg)
    parents = override[len('--config.'):].split('.')[:-1]
    for name in parents:
      node = node[name]
    where = 'config.' + '.'.join(parents) if parents else 'the config'
    return f'fields of {where}: {sorted(node.keys())}'
  except Exception:  # pylint: disable=broad-except
    return 'see symjax/train/config.py for every field'


def resolve_recipe(argv: list[str]) -> list[str]:
  """argv with ``--config=NAME[:args]`` of a shipped recipe replaced by that recipe's file, so that a name
  works from any folder; anything else is left for the flag parser (and its error)."""
  out = []
  for a in argv:
    if a.startswith('--config='):
      spec, colon, arg = a[len('--config='):].partition(':')
      try:
        a = f'--config={configs.path(spec)}{colon}{arg}'
      except FileNotFoundError:
        pass
    out.append(a)
  return out


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with each config problem (a missing or broken config file, an unknown field
  or argument, a value of the wrong type) as one ``error:`` line and exit status 2."""
  try:
    return flags.FLAGS(resolve_recipe(argv))
  except Exception as e:  # pylint: disable=broad-except
    print(f'error: {config_error(e, argv)}', file=sys.stderr)
    sys.exit(2)


def check_workdir(workdir: str) -> None:
  """A work directory that can be created and written, or a one-line ValueError saying why not."""
  from symjax.system import files
  try:
    files.make_writable_folder(workdir)
  except OSError as e:
    raise InputError(f'work directory {workdir!r} cannot be created or written ({e.strerror or e}); '
                     f'give --workdir a folder you can write') from None


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not flags.FLAGS['verbosity'].present:  # Orbax logs every save at INFO; --verbosity=0 shows it
    logging.set_verbosity(logging.WARNING)
  try:
    config = _CONFIG.value
    config.get('task')  # a config file that failed to load raises on first access
  except OSError as e:
    print(f'error: {config_error(e, sys.argv)}', file=sys.stderr)
    sys.exit(2)
  workdir = _WORKDIR.value or default_workdir(flags.FLAGS['config'].config_filename, sys.argv)
  from symjax.train import early  # after flag parsing: keeps --help fast
  try:
    check_workdir(workdir)
    # The step an earlier start of this command trained, compiled while the trainer is imported (early's docstring).
    ahead = early.start(config)
    from symjax.train import trainer as train
    train.train_and_evaluate(config, workdir, early=ahead)
  except (InputError, TrainingDiverged) as e:  # anything else is a fault of the code: its traceback shows
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)


def run():
  app.run(main, flags_parser=parse_flags)


if __name__ == '__main__':
  run()
