"""``python -m symjax.main --config=...``: train and evaluate from a config (see ``symjax.cli.train``)."""

from symjax.cli import train

if __name__ == '__main__':
  train.run()
