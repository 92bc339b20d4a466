"""What the collect_*.py scripts share: their command line and how a mean ± interval is printed."""

import sys

from symjax.tasks import rasp

RASP = rasp.TASKS
# Test token accuracy (%) of Transformer Programs, "Learning Transformer Programs" Table 1.
TRANSFORMER_PROGRAMS = rasp.PUBLISHED


def root_and_json(argv, root: str, json_path: str) -> tuple[str, str]:
  """``script.py [ROOT] [--json=PATH]`` -> (ROOT, PATH), with the script's defaults; ``--help`` prints the
  script's docstring and exits."""
  if '--help' in argv[1:] or '-h' in argv[1:]:
    print((sys.modules['__main__'].__doc__ or '').strip())
    print(f'\nwrites {json_path} (--json=PATH to change); ROOT defaults to {root}')
    sys.exit(0)
  args = [a for a in argv[1:] if not a.startswith('--json=')]
  if len(args) > 1:
    sys.exit(f'usage: {argv[0]} [ROOT={root}] [--json={json_path}]')
  out = next((a.split('=', 1)[1] for a in argv[1:] if a.startswith('--json=')), json_path)
  return (args[0] if args else root), out


def cell(stat: dict | None, scale: float = 1.0, digits: int = 4) -> str:
  """``mean ± ci95`` of a ``symjax.train.sweep.stat`` record, times ``scale``; 'not run' for None."""
  if stat is None:
    return 'not run'
  return f"{scale * stat['mean']:.{digits}f} ± {scale * stat['ci95']:.{digits}f}"
