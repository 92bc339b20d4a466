"""One style of error for every command: a usage mistake (an unknown flag, a stray argument, a missing
required flag, a value of the wrong type) and a refused input are each one line, ``error: ...``, naming the
flag or argument and what is allowed, with exit status 2 for usage mistakes. ``--help`` lists the command's
own flags, also when it is reached through a forwarding module (``python -m symjax.report``).
"""

from __future__ import annotations

import os
import re
import sys
from typing import Callable, NoReturn, Sequence

from absl import app, flags, logging

import symjax.configs as configs  # configs/ at the top of the repository, shipped as symjax.configs
from symjax.system.errors import InputError, PeerLost

USAGE_STATUS = 2


def fail(message: str, status: int = USAGE_STATUS) -> NoReturn:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(status)


def fail_now(message: str, status: int = 1) -> NoReturn:
  """``fail`` without Python's exit handlers: after a multi-process run lost a process, JAX's own handler
  would wait at the coordination service's shutdown barrier for it, and abort the process when it times out
  (a C++ stack trace instead of this one line)."""
  print(f'error: {message}', file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)


def command_name() -> str:
  """How the user ran this command: ``python -m symjax.cli.sample`` (or the script path)."""
  main = sys.modules.get('__main__')
  spec = getattr(main, '__spec__', None)
  name = spec.name.removesuffix('.__main__') if spec is not None else sys.argv[0]
  return f'python -m {name}' if spec is not None else name


def own_flags(module: str) -> list[str]:
  """The names of the flags that ``module`` (the command's) defines, not absl's own, in definition order."""
  key = sys.argv[0] if module == '__main__' else module  # absl's name for the module run as a program
  names = []
  for flag in flags.FLAGS.flags_by_module_dict().get(key, []):
    if flag.name not in names:
      names.append(flag.name)
  return names


def flag_error(e: flags.Error, known: Sequence[str]) -> str:
  """One line for a flag absl did not accept."""
  text = ' '.join(str(e).split())
  if isinstance(e, flags.UnrecognizedFlagError):
    return (f'unknown flag --{e.flagname}; flags of {command_name()}: '
            f'{", ".join("--" + n for n in known)} (--help describes them)')
  return text.removeprefix('flag ')


HELP_FLAGS = ('help', 'helpshort', 'helpfull', 'h', '?')


def parser(module: str, required: Sequence[str] = (),
           describe: Callable[[Exception, list[str]], str | None] | None = None,
           rewrite: Callable[[list[str]], list[str]] | None = None) -> Callable[[list[str]], list[str]]:
  """A ``flags_parser`` for ``app.run``: absl's parsing, then the checks absl leaves to the command, each
  failure as one ``error:`` line and exit status 2. ``describe(e, argv)``, when given, words the failures
  it knows (the training command's config errors) before the generic wording; ``rewrite(argv)`` is what
  absl parses (the training command's recipe names made paths)."""

  def parse(argv: list[str]) -> list[str]:
    known = own_flags(module)
    for name in known:  # --help shows the module that absl calls main's: make these its key flags
      flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
    try:
      rest = flags.FLAGS(rewrite(argv) if rewrite else argv)
    except SystemExit as e:  # absl exits 1 after printing the help that was asked for: a success
      if e.code == 1 and any(a.split('=')[0].lstrip('-') in HELP_FLAGS for a in argv[1:]):
        sys.exit(0)
      raise
    except Exception as e:  # pylint: disable=broad-except
      if describe is not None and (message := describe(e, argv)):
        fail(message)
      if isinstance(e, flags.Error):
        fail(flag_error(e, known))
      raise
    if len(rest) > 1:
      fail(f'unexpected argument {rest[1]!r}: {command_name()} takes flags only '
           f'({", ".join("--" + n for n in known)}; --help describes them)')
    for name in required:
      if flags.FLAGS[name].value in (None, ''):
        fail(f'--{name} is required: {flags.FLAGS[name].help}')
    return rest
  return parse


def run(main: Callable[[], None], required: Sequence[str] = (),
        errors: tuple[type[BaseException], ...] = (InputError, FileNotFoundError), status: int = 1,
        describe: Callable[[Exception, list[str]], str | None] | None = None,
        rewrite: Callable[[list[str]], list[str]] | None = None, verbosity: int = logging.WARNING) -> None:
  """Runs ``main()`` as a command: flags parsed by ``parser``; absl's log quieter than INFO (Orbax logs
  every save and restore there) unless ``--verbosity`` is given; ``errors`` raised by ``main`` printed as
  one ``error:`` line with exit status ``status``."""

  def absl_main(argv):
    del argv  # parse() refused any argument that is not a flag
    if not flags.FLAGS['verbosity'].present:
      logging.set_verbosity(verbosity)
    try:
      main()
    except PeerLost as e:
      fail_now(' '.join(str(e).split()))
    except errors as e:
      fail(' '.join(str(e).split()), status)

  app.run(absl_main, flags_parser=parser(main.__module__, required, describe, rewrite))


# The commands that take --config (training, sweeps): recipe names, and their errors in one line.
def _innermost(e: BaseException) -> BaseException:
  while (e.__cause__ or e.__context__) is not None:
    e = e.__cause__ or e.__context__
  return e


def config_error(e: BaseException, argv: list[str]) -> str | None:
  """One line saying what is wrong with the command's config arguments, and what is allowed; None for an
  error that is not about the config (``usage`` words those)."""
  if isinstance(e, flags.UnrecognizedFlagError) and not e.flagname.startswith('config'):
    return None
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
  try:
    node = configs.from_file(config_arg)
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


def output_error(path: str, flag: str, e: OSError) -> InputError:
  """A file-system error on ``path`` as one line naming the flag that chooses it."""
  return InputError(f'cannot write {path!r} ({e.strerror or e}); choose another place with {flag}')


def check_writable(folder: str, flag: str, path: str | None = None) -> None:
  """Makes ``folder`` and probes it, so that a place that cannot take a command's output fails before the
  work, as one line naming ``path`` (default: the folder) and ``flag``."""
  from symjax.system import files
  try:
    files.make_writable_folder(folder)
  except OSError as e:
    raise output_error(path or folder, flag, e) from None
