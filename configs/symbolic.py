"""Symbolic Transformer ("Symbolic Transformers", Kerce & Fox 2025, §5, Algorithm 1).

Default: the in-context learning (induction) task, 2 layers, 4 heads of 16, 3000 steps of batch 64.

  python -m symjax.main --config=configs/symbolic.py

Expected: 100% validation and test token accuracy (loss < 1e-3) from step ~1500; 90 s on a 2-core CPU
(measured: test accuracy 1.0000, 87.2 s wall clock including compilation).

Variants after ':' — task=induction|text, size=tiny|small|medium|paper, e.g.

  python -m symjax.main --config=configs/symbolic.py:task=text,size=medium --config.text_path=input.txt

task=text: peak learning rate 1e-2, chosen by the 3-seed sweep over {3e-3, 1e-2} on validation (on CPU and
on GPU; config_lib.TEXT_LEARNING_RATES). This is the paper's model (both sites projected, no gain); the
opt-in variants --config.model.symbolic_sites=values|ffn and --config.model.projection_gain=true trade
readability for accuracy as measured in README.md ("Opt-in variants"), so they are not the default.
"""

from symjax import config_lib


def get_config(arg=None):
  return config_lib.variant('symbolic', arg)
