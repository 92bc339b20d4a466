"""``python -m symjax.tokenize`` (the command's earlier path, in docs and notebooks) forwards to
``python -m symjax.cli.tokenize``."""

if __name__ == '__main__':
  from symjax.cli import tokenize as cli
  cli.run()
