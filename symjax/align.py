"""``python -m symjax.align`` (the command's earlier path, in docs and notebooks) forwards to
``python -m symjax.cli.align``."""

if __name__ == '__main__':
  from symjax.cli import align as cli
  cli.run()
