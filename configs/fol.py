"""First-order-logic next-symbol prediction ("Technical Architecture: FOL Symbolic Transformer"): 663 symbols,
20,000 distinct formulas (atomic 20%, compounds 40%, quantified 30%, nested 10%), 16,200/1,800/2,000.

  python -m symjax.main --config=fol:model=symbolic                # or configs/fol.py:... from a clone
  python -m symjax.main --config=fol:model=lstm                    # the recurrent baseline
  python -m symjax.main --config=fol:model=symbolic,glyphs=true    # numerals from glyphs

Arguments after ':': model=standard|token_factored|symbolic|lstm, size=tiny|small|medium, glyphs=true,
runlocal=true (20 steps, tiny). Reports perplexity and top-1/5/10 accuracy; ``benchmarks/suites/fol.py``
adds the uniform and n-gram baselines and the syntactic validity of sampled formulas.
"""

import symjax.configs as configs
from symjax.train import config as config_lib

# Kinds whose readout has a table of its own: chosen on validation loss, for every kind, from the same
# grid (learning rate × tied or untied readout, 3 seeds).
UNTIED_READOUT = ('symbolic',)


def get_config(arg=None):
  a = config_lib.parse_arg(arg, model='symbolic', size='small', glyphs=False, runlocal=False)
  config = config_lib.default_config(kind=a.model, shape=configs.shape('tiny' if a.runlocal else a.size))
  config.task = 'fol'
  config.model.max_len = 48            # the task's sequences of 48 tokens
  config.model.embed_init_std = 0.25   # one scale for every kind (the symbolic projections need it)
  config.model.tie_embeddings = a.model not in UNTIED_READOUT
  config.batch_size = 64
  config.total_steps = 3000
  config.learning_rate = 3e-3
  config.top_ks = (5, 10)              # the measures the FOL design note reports
  config.best_metric = 'loss'          # perplexity is the task's measure
  config.numeral_glyph_init = a.glyphs
  return config_lib.runlocal(config) if a.runlocal else config
