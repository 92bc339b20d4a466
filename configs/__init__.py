"""The recipes, one file each, shipped with the package as ``symjax.configs``, and the model sizes they name.

``--config=NAME[:key=value,...]`` names one from any folder (``--config=symbolic:task=text``); from a clone,
``--config=configs/NAME.py[:...]`` is the same file. Every field a recipe sets is written in its file with
the reason; ``symjax/train/config.py`` defines and comments every field and its default. This folder builds
on that file and that file never reads this one: each has one owner, and imports go one way.
"""

import importlib.util
import os

# Model shapes by name (``--config=symbolic:size=...``), for every kind; README and ``--help`` list them.
# --8<-- [start:sizes]
SIZES = {
    'tiny': dict(num_layers=2, num_heads=2, head_dim=8, ff_dim=32, ff_dim_per_head=16),
    'small': dict(num_layers=2, num_heads=4, head_dim=16, ff_dim=256, ff_dim_per_head=64),
    'medium': dict(num_layers=4, num_heads=4, head_dim=32, ff_dim=512, ff_dim_per_head=128),
    'paper': dict(num_layers=12, num_heads=12, head_dim=64, ff_dim=3072, ff_dim_per_head=256),
}
# --8<-- [end:sizes]


def shape(size: str) -> dict:
  """The model fields of a named size; ValueError naming the sizes for another name."""
  if size not in SIZES:
    raise ValueError(f'size must be one of {list(SIZES)}, got {size!r}')
  return dict(SIZES[size])


def describe_sizes() -> str:
  """'tiny (2 layers × 2 heads × 8), ...' for help texts."""
  return ', '.join(f"{name} ({s['num_layers']} layers × {s['num_heads']} heads × {s['head_dim']})"
                   for name, s in SIZES.items())


_FOLDER = os.path.dirname(os.path.abspath(__file__))


def names() -> list[str]:
  """The recipes shipped with the package."""
  return sorted(f[:-3] for f in os.listdir(_FOLDER) if f.endswith('.py') and f not in ('__init__.py', 'common.py'))


def path(spec: str) -> str:
  """The file a ``--config`` value names: an existing file as it is; a recipe name (``symbolic``) or
  ``configs/NAME.py`` the file shipped with the package, so both work from any folder; otherwise
  FileNotFoundError naming the recipes."""
  if os.path.isfile(spec):
    return spec
  name = spec[:-3] if spec.endswith('.py') else spec
  name = name[len('configs/'):] if name.startswith('configs/') else name
  if name in names():
    return os.path.join(_FOLDER, name + '.py')
  raise FileNotFoundError(f'config {spec!r} is neither a file nor a recipe; recipes: {names()} (or the path of '
                          f'a Python file with get_config())')


def from_file(spec: str):
  """The config ``python -m symjax.main --config=SPEC`` would use: ``NAME[:arguments]`` for a shipped recipe
  (``symbolic:task=text,size=medium``) or ``path/to/config.py[:arguments]``."""
  file, _, arg = spec.partition(':')
  file = path(file)
  module_spec = importlib.util.spec_from_file_location(f'_config_{os.path.basename(file)[:-3]}', file)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)
