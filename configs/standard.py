"""Standard pre-LayerNorm transformer with ALiBi: the baseline, trained exactly like the other two.

Default: the in-context learning (induction) task, 2 layers, 4 heads of 16, 3000 steps of batch 64.

  python -m symjax.main --config=configs/standard.py

Expected: 100% validation and test token accuracy from step ~1000; 65 s on a 2-core CPU (measured: test
accuracy 1.0000, 63.1 s wall clock including compilation).

Variants after ':' — task=induction|text, size=tiny|small|medium|paper; learned positions with
--config.model.positions=learned.

task=text: peak learning rate 3e-3, embedding std 0.02 — 3e-3 won this kind's 3-seed sweep over
{3e-3, 1e-2} on validation (1.672 ± 0.018 nats; config_lib.TEXT_LEARNING_RATES).
"""

from symjax import config_lib


def get_config(arg=None):
  return config_lib.variant('standard', arg)
