"""``python -m symjax.interpret --workdir=... --input=...``: see ``symjax.interpret.cli``."""

from symjax.cli import interpret as cli

if __name__ == '__main__':
  cli.run()
