"""First-order-logic next-symbol prediction ("Technical Architecture: FOL Symbolic Transformer"): 663 symbols,
20,000 distinct formulas (atomic 20%, compounds 40%, quantified 30%, nested 10%), 16,200/1,800/2,000.

  python -m symjax.main --config=configs/fol.py:model=symbolic
  python -m symjax.main --config=configs/fol.py:model=lstm          # the recurrent baseline
  python -m symjax.main --config=configs/fol.py:model=symbolic,glyphs=true   # numerals from glyphs

model: standard | token_factored | symbolic | lstm; size: tiny | small | medium. Reports perplexity and
top-1/5/10 accuracy; benchmarks/fol.py adds the uniform and n-gram baselines and the syntactic validity of
sampled formulas. Measured results: README.md, "First-order logic".
"""

from symjax import config_lib


def get_config(arg=None):
  return config_lib.fol_variant(arg)
