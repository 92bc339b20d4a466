"""Train and evaluate a recipe.

  python -m symjax.main --config=symbolic[:task=text,size=medium] [--workdir=DIR] [--config.FIELD=VALUE ...]

--config names a recipe shipped with the package or the path of a config file (configs/NAME.py from a
clone). Rerunning the same command resumes from its latest checkpoint. The implementation is
``symjax.cli.train``.
"""

from absl import flags

from symjax.cli import train

flags.adopt_module_key_flags(train)  # --help lists the training flags, not only this module's (none)

if __name__ == '__main__':
  train.run()
