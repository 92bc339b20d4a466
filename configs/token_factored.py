"""Token-Factored Transformer ("Symbolic Transformers", Kerce & Fox 2025, §4, eqs. 6-15).

Default: the in-context learning (induction) task, 2 layers, 4 heads of 16, 3000 steps of batch 64.

  python -m symjax.main --config=configs/token_factored.py

Expected: 100% validation and test token accuracy from step ~1500; 60 s on a 2-core CPU (measured: test
accuracy 1.0000, 56.4 s wall clock including compilation).

Variants after ':' — task=induction|text, size=tiny|small|medium|paper.

task=text: peak learning rate 3e-3 and a readout table of its own — the point that won this kind's 3-seed
sweep over {3e-3, 1e-2} × {tied, untied readout} on validation (1.686 ± 0.011 nats; tied at 1e-2:
1.744 ± 0.029; config_lib.TEXT_LEARNING_RATES and TEXT_UNTIED_READOUT).
"""

from symjax import config_lib


def get_config(arg=None):
  return config_lib.variant('token_factored', arg)
