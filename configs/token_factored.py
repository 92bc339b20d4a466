"""Token-Factored Transformer ("Symbolic Transformers", Kerce & Fox 2025, §4, eqs. 6-15): two streams,
attention writes X_t from values of X_t alone, the FFN writes X_e.

  python -m symjax.main --config=token_factored                    # or configs/token_factored.py
  python -m symjax.main --config=token_factored:task=text,size=medium --config.text_path=input.txt

Arguments after ':': task=induction|text, size=tiny|small|medium|paper, runlocal=true (20 steps, tiny).
Run time and results: the docs' "Results" pages.
"""

from symjax.configs import common

KIND = 'token_factored'


def get_config(arg=None):
  config, a = common.base(KIND, arg)
  # X_t starts as the embedding itself, so its scale is the scale of every value the heads move.
  config.model.embed_init_std = 0.25
  common.task(config, a.task, text_learning_rate=3e-3, text_tied=False)
  return common.finish(config, a)
