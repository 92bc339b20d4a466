"""``python -m symjax.sample`` (the command's earlier path, in docs and notebooks) forwards to
``python -m symjax.cli.sample``."""

if __name__ == '__main__':
  from symjax.cli import sample as cli
  cli.run()
