"""The RASP suite of "Learning Transformer Programs" (reverse, sort, hist, double_hist, most_freq, dyck1,
dyck2) at the published setting: vocabulary 8, length 8 (Dyck 16), 16,200/1,800/2,000 splits.

  python -m symjax.main --config=configs/rasp.py:task=sort,model=symbolic

task: one of the seven; model: standard | token_factored | symbolic; size: tiny | small | medium.
3 layers of 4 heads × 16, 3000 steps of batch 64: 1-3 minutes each on a 2-core CPU. The test table
includes token accuracy on sequences of length 12 and 16 (splits length_12, length_16; not for Dyck).
Measured results of all 21 combinations: README.md, "RASP suite" (benchmarks/rasp_suite.py).
"""

from symjax import config_lib


def get_config(arg=None):
  return config_lib.rasp_variant(arg)
