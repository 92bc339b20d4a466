"""Symbolic Transformer ("Symbolic Transformers", Kerce & Fox 2025, §5) on the induction task.

  python -m symjax.main --config=configs/symbolic.py
  python -m symjax.main --config=configs/symbolic.py:task=text,size=small --config.text_path=input.txt

Variants (after ':'): task=induction|text, size=tiny|small|medium|paper.
"""

from symjax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, task='induction', size='small')
  config = config_lib.default_config(kind='symbolic', size=a.size)
  config.task = a.task
  return config
