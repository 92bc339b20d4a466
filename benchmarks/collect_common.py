"""What the collect_*.py scripts share: their command line and how a mean ± interval is printed."""

import sys

RASP = ('reverse', 'sort', 'hist', 'double_hist', 'most_freq', 'dyck1', 'dyck2')
# Test token accuracy (%) of Transformer Programs, "Learning Transformer Programs" Table 1.
TRANSFORMER_PROGRAMS = {'reverse': 99.79, 'sort': 99.83, 'hist': 100.0, 'double_hist': 98.40,
                        'most_freq': 75.69, 'dyck1': 99.30, 'dyck2': 99.09}


def root_and_json(argv, root: str, json_path: str) -> tuple[str, str]:
  """``script.py [ROOT] [--json=PATH]`` -> (ROOT, PATH), with the script's defaults."""
  args = [a for a in argv[1:] if not a.startswith('--json=')]
  if len(args) > 1:
    sys.exit(f'usage: {argv[0]} [ROOT={root}] [--json={json_path}]')
  out = next((a.split('=', 1)[1] for a in argv[1:] if a.startswith('--json=')), json_path)
  return (args[0] if args else root), out


def cell(stat: dict | None, scale: float = 1.0, digits: int = 4) -> str:
  """``mean ± ci95`` of a ``symjax.sweep.stat`` record, times ``scale``; 'not run' for None."""
  if stat is None:
    return 'not run'
  return f"{scale * stat['mean']:.{digits}f} ± {scale * stat['ci95']:.{digits}f}"
