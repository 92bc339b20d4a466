"""The RASP suite of "Learning Transformer Programs" (reverse, sort, hist, double_hist, most_freq, dyck1,
dyck2) at the published setting: vocabulary 8, length 8 (Dyck 16), 16,200/1,800/2,000 splits.

  python -m symjax.main --config=configs/rasp.py:task=sort,model=symbolic

task: one of the seven; model: standard | token_factored | symbolic; size: tiny | small | medium;
runlocal=true: the seconds-long version. 3 layers of 4 heads × 16, 3000 steps of batch 64: 1-3 minutes
each on a 2-core CPU. The test table includes token accuracy on sequences of length 12 and 16 (splits
length_12, length_16; not for Dyck). Measured results, 3 seeds per kind: README.md, "RASP suite".
The symbolic model is still learning at 3000 steps (about 12 epochs): at --config.total_steps=12000 it
gains up to 28 points (reverse 71.5 -> 99.7, double_hist 78.0 -> 99.95; README "At four times the
steps"); at 24000 hist reaches 100.00 on every seed and reverse gains nothing more (one seed stalls; README
"At eight times the steps"). The default stays 3000 for every kind, the budget the suite compares them at.
"""

from symjax import config_lib
from symjax.tasks import rasp


def get_config(arg=None):
  a = config_lib.parse_arg(arg, task='reverse', model='symbolic', size='small', runlocal=False)
  if a.task not in rasp.TASKS:
    raise ValueError(f'task must be one of {list(rasp.TASKS)}, got {a.task!r}')
  config = config_lib.default_config(kind=a.model, size='tiny' if a.runlocal else a.size)
  config.model.tie_embeddings = a.model not in config_lib.UNTIED_READOUT  # see config_lib.UNTIED_READOUT
  config.task = a.task
  config.model.num_layers = 3
  config.model.max_len = 16          # room for the length-generalisation splits (12 and 16)
  config.eval_every_steps = 1000
  return config_lib.runlocal(config) if a.runlocal else config
