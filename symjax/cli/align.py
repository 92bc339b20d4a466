"""Interpretability-guided alignment of a trained run (see ``symjax.proj.align``).

  python -m symjax.cli.align --backbone=WORKDIR --workdir=OUT [--config=configs/align.py[:args]]
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from symjax.proj import align
from symjax.system.errors import InputError


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  f = flags.FLAGS
  if not f['verbosity'].present:  # Orbax logs every restore at INFO
    logging.set_verbosity(logging.WARNING)
  try:
    align.align(f.backbone, f.workdir, f.config)
  except (InputError, FileNotFoundError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


def define_flags() -> None:
  """The CLI's flags (defined when it runs, so importing the module defines none)."""
  config_flags.DEFINE_config_file('config', 'configs/align.py', 'Config file of the alignment step.',
                                  lock_config=True)
  flags.DEFINE_string('backbone', None, 'Work directory of the trained backbone (induction or reverse).')
  flags.DEFINE_string('workdir', None, 'Folder for alignment.json and the module parameters.')
  flags.mark_flags_as_required(['backbone', 'workdir'])


def run():
  define_flags()
  app.run(main)


if __name__ == '__main__':
  run()
