"""Standard pre-LayerNorm transformer with ALiBi: the baseline, trained exactly like the other two kinds.

  python -m symjax.main --config=standard                          # or configs/standard.py from a clone
  python -m symjax.main --config=standard:task=text,size=medium --config.text_path=input.txt

Arguments after ':': task=induction|text, size=tiny|small|medium|paper, runlocal=true (20 steps, tiny).
Learned positions instead of ALiBi: --config.model.positions=learned. Run time and results: the docs'
"Results" pages.
"""

from symjax.configs import common

KIND = 'standard'


def get_config(arg=None):
  config, a = common.base(KIND, arg)
  if a.task == 'induction':
    common.induction(config)
    # The same embedding scale as the two-stream kinds, for equal footing on the task they all solve.
    config.model.embed_init_std = 0.25
    config.model.tie_embeddings = True
  else:
    common.text(config)
    config.learning_rate = 3e-3       # chosen on validation loss by the 3-seed sweep of the kinds' grid
    config.model.embed_init_std = 0.02  # GPT's: larger embeddings cost this kind validation loss here
    config.model.tie_embeddings = True  # chosen on validation by the same sweep
  return common.finish(config, a)
