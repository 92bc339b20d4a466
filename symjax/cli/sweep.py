"""Seeds × grid sweeps from the command line (see ``symjax.train.sweep``).

  python -m symjax.cli.sweep --config=configs/symbolic.py:task=text,size=medium --config.text_path=input.txt \\
      --seeds=3 --grid learning_rate=3e-3,1e-2 --workdir=runs/sweep
"""

import shlex
import sys

from absl import flags
from ml_collections import config_flags

from symjax.cli import usage
from symjax.system import files
from symjax.system.errors import InputError
from symjax.train import sweep


def main():
  f = flags.FLAGS
  with files.refused_leaves_no_folder(f.workdir):
    usage.check_writable(f.workdir, '--workdir')
    sweep.run(f.config, f.grid, f.seeds, f.workdir, f.select, seed_step=f.seed_step,
              command='python -m symjax.cli.sweep ' + ' '.join(shlex.quote(a) for a in sys.argv[1:]))


def define_flags() -> None:
  """The CLI's flags (defined when it runs, so importing the module defines none)."""
  config_flags.DEFINE_config_file('config', None, 'Config file, optionally with :arguments.', lock_config=True)
  flags.DEFINE_integer('seeds', 3, 'Seeds 0..N-1 of every grid point, trained together.')
  flags.DEFINE_multi_string('grid', [], 'field=value1,value2,... (nested fields as model.tau_init); repeat '
                            'for a product grid.')
  flags.DEFINE_string('workdir', None, 'Folder of the sweep; one subfolder per grid point and seed.')
  flags.DEFINE_string('select', 'loss', 'Validation metric that chooses the grid point.')
  flags.DEFINE_enum('seed_step', 'auto', ['auto', 'vmap', 'unroll'],
                    'How the seeds share one compiled step (symjax.train.seeds.combined_step); auto: unroll on CPU.')


def run():
  define_flags()
  usage.run(main, required=['config', 'workdir'], errors=(InputError,), status=2,
            describe=usage.config_error, rewrite=usage.resolve_recipe)


if __name__ == '__main__':
  run()
