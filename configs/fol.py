"""First-order-logic next-symbol prediction ("Technical Architecture: FOL Symbolic Transformer"): 663 symbols,
20,000 distinct formulas (atomic 20%, compounds 40%, quantified 30%, nested 10%), 16,200/1,800/2,000.

  python -m symjax.main --config=configs/fol.py:model=symbolic
  python -m symjax.main --config=configs/fol.py:model=lstm          # the recurrent baseline
  python -m symjax.main --config=configs/fol.py:model=symbolic,glyphs=true   # numerals from glyphs

model: standard | token_factored | symbolic | lstm; size: tiny | small | medium; runlocal=true: the
seconds-long version. Reports perplexity and top-1/5/10 accuracy; benchmarks/fol.py adds the uniform and
n-gram baselines and the syntactic validity of sampled formulas. Measured results: README.md,
"First-order logic".
"""

from symjax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, model='symbolic', size='small', glyphs=False, runlocal=False)
  config = config_lib.default_config(kind=a.model, size='tiny' if a.runlocal else a.size)
  config.model.tie_embeddings = a.model not in config_lib.UNTIED_READOUT  # see config_lib.UNTIED_READOUT
  config.task = 'fol'
  config.model.max_len = 48          # the task's sequences of 48 tokens
  config.top_ks = (5, 10)
  config.best_metric = 'loss'        # perplexity is the task's measure
  config.numeral_glyph_init = a.glyphs
  return config_lib.runlocal(config) if a.runlocal else config
