"""Symbolic Transformer ("Symbolic Transformers", Kerce & Fox 2025, §5, Algorithm 1).

Default: the in-context learning (induction) task, 2 layers, 4 heads of 16, 3000 steps of batch 64.

  python -m symjax.main --config=configs/symbolic.py

Expected: 100% validation and test token accuracy (loss < 1e-3) from step ~1500; 90 s on a 2-core CPU
(measured: test accuracy 1.0000, 87.2 s wall clock including compilation).

Variants after ':' — task=induction|text, size=tiny|small|medium|paper, e.g.

  python -m symjax.main --config=configs/symbolic.py:task=text,size=medium --config.text_path=input.txt

task=text: peak learning rate 1e-2 and a readout table of its own (model.tie_embeddings=False), the point
chosen by the 3-seed sweep over {3e-3, 1e-2} × {tied, untied readout} on validation (1.860 ± 0.020 nats;
tied: 2.234 ± 0.301; config_lib.TEXT_LEARNING_RATES, TEXT_UNTIED_READOUT). The untied readout changes no
stream: every update is still a convex mixture of the input embedding table's rows. This is the paper's
model (both sites projected, no gain, channel-wise FFN); the opt-in variants
--config.model.symbolic_sites=values|ffn and --config.model.projection_gain=true trade readability for
accuracy, while --config.model.vocab_ffn=dense (each channel's FFN reads the whole state) and
--config.model.qk_positions=true (learned positions in the queries and keys; no length extrapolation)
keep it, as measured in README.md ("Variants that keep every stream a token mixture", "Opt-in variants",
"Against the targets"); --config.model.ffn_mixture=nonnegative weighs the FFN's token embeddings by
non-negative weights of free mass instead of a convex mixture (a weaker, still exact token reading;
"Against the targets"). None is the default.
"""

from symjax import config_lib


def get_config(arg=None):
  return config_lib.variant('symbolic', arg)
