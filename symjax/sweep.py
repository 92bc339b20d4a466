"""``python -m symjax.sweep`` (the command's earlier path, in docs and notebooks) forwards to
``python -m symjax.cli.sweep``."""

if __name__ == '__main__':
  from symjax.cli import sweep as cli
  cli.run()
