"""Symbolic Transformer ("Symbolic Transformers", Kerce & Fox 2025, §5, Algorithm 1).

Default: the in-context learning (induction) task, 2 layers, 4 heads of 16, 3000 steps of batch 64.

  python -m symjax.main --config=configs/symbolic.py

Expected: 100% validation and test token accuracy (loss < 1e-3) from step ~1500; 90 s on a 2-core CPU
(measured: test accuracy 1.0000, 87.2 s wall clock including compilation).

Variants after ':' — task=induction|text, size=tiny|small|medium|paper, e.g.

  python -m symjax.main --config=configs/symbolic.py:task=text,size=medium --config.text_path=input.txt
"""

from symjax import config_lib


def get_config(arg=None):
  return config_lib.variant('symbolic', arg)
