"""Interpretability-guided alignment of a trained run (see ``symjax.proj.align``).

  python -m symjax.cli.align --backbone=WORKDIR --workdir=OUT [--config=configs/align.py[:args]]
"""

from absl import flags
from ml_collections import config_flags

import symjax.configs as configs  # configs/ at the top of the repository, shipped as symjax.configs
from symjax.cli import usage
from symjax.proj import align
from symjax.system import files
from symjax.system.errors import InputError


def main():
  f = flags.FLAGS
  with files.refused_leaves_no_folder(f.workdir):
    usage.check_writable(f.workdir, '--workdir')
    align.align(f.backbone, f.workdir, f.config)


def define_flags() -> None:
  """The CLI's flags (defined when it runs, so importing the module defines none)."""
  config_flags.DEFINE_config_file('config', configs.path('align'), 'Config file of the alignment step (the '
                                  "recipe 'align' or a path, with :arguments).", lock_config=True)
  flags.DEFINE_string('backbone', None, 'Work directory of the trained backbone (induction or reverse).')
  flags.DEFINE_string('workdir', None, 'Folder for alignment.json and the module parameters.')


def run():
  define_flags()
  usage.run(main, required=['backbone', 'workdir'], errors=(InputError, FileNotFoundError), status=2,
            describe=usage.config_error, rewrite=usage.resolve_recipe)


if __name__ == '__main__':
  run()
