"""Train and evaluate from a config file.

  python -m symjax.main --config=configs/symbolic.py [--workdir=DIR] [--config.total_steps=500 ...]

Without --workdir a new directory under ./runs/ is made, named after the config and the time. Rerunning
with the same --workdir resumes from its latest checkpoint.
"""

import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file (configs/*.py[:key=value,...]).',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Work directory: checkpoints, metrics, config, vocabulary.')
flags.mark_flags_as_required(['config'])


def default_workdir(config_path: str) -> str:
  name = os.path.splitext(os.path.basename(config_path.split(':')[0]))[0]
  arg = config_path.split(':', 1)[1].replace(',', '_').replace('=', '-') if ':' in config_path else ''
  stamp = time.strftime('%Y%m%d-%H%M%S')
  return os.path.join('runs', '_'.join(p for p in (name, arg, stamp) if p))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  from symjax import train  # after flag parsing: keeps --help fast
  if not flags.FLAGS['verbosity'].present:  # Orbax logs every save at INFO; --verbosity=0 shows it
    logging.set_verbosity(logging.WARNING)
  workdir = _WORKDIR.value or default_workdir(flags.FLAGS['config'].config_filename)
  print(f'workdir: {workdir}')
  try:
    train.train_and_evaluate(_CONFIG.value, workdir)
  except (ValueError, train.TrainingDiverged) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)


if __name__ == '__main__':
  app.run(main)
