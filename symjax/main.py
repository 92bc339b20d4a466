"""Train and evaluate a recipe.

  python -m symjax.main --config=symbolic[:task=text,size=medium] [--workdir=DIR] [--config.FIELD=VALUE ...]

--config names a recipe shipped with the package or the path of a config file (configs/NAME.py from a
clone). Rerunning the same command resumes from its latest checkpoint. The implementation is
``symjax.cli.train``.
"""

from symjax.system import host

host.defer_garbage_collection()  # before the imports below: JAX's and Flax's objects are never garbage

from absl import flags  # noqa: E402

from symjax.cli import train  # noqa: E402

flags.adopt_module_key_flags(train)  # --help lists the training flags, not only this module's (none)

if __name__ == '__main__':
  train.run()
