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
  common.task(config, a.task, text_learning_rate=3e-3, text_tied=True)
  # On induction, the same embedding scale as the two-stream kinds, for equal footing on the task they all
  # solve; on text GPT's, as larger embeddings cost this kind validation loss there.
  config.model.embed_init_std = 0.25 if a.task == 'induction' else 0.02
  return common.finish(config, a)
