"""Interpretability-guided alignment of a trained backbone (symjax.align): a module on the frozen block
outputs, trained with CE + MSE(activations, annotations) + MSE(weights, annotations) on half the training
set's annotations ("Towards by-design interpretable transformers via modular interpretability-guided
alignment", eqs. 7-8).

  python -m symjax.main --config=configs/rasp.py:task=reverse,model=symbolic --workdir=runs/reverse
  python -m symjax.align --backbone=runs/reverse --workdir=runs/reverse_align

align=false: the same module trained with CE alone (the "without alignment" control). runlocal=true: 50
steps. 2000 steps of batch 64 take about half a minute on a 2-core CPU after the backbone's features are
computed. Measured results for the three kinds: README.md, "Interpretability-guided alignment".
"""

from symjax import align, config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, align=True, runlocal=False)
  config = align.defaults()
  if not a.align:
    config.activation_weight = 0.0
    config.weights_weight = 0.0
  if a.runlocal:
    config.steps = 50
  return config
