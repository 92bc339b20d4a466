"""``python -m symjax.interpret --workdir=... --input=...``: see ``symjax.interpret.cli``."""

from symjax.interpret import cli

if __name__ == '__main__':
  cli.run()
