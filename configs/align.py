"""Interpretability-guided alignment of a trained backbone (``symjax.proj.align``): a module on the frozen block
outputs, trained with CE + MSE(activations, annotations) + MSE(weights, annotations) on half the training
set's annotations ("Towards by-design interpretable transformers via modular interpretability-guided
alignment", eqs. 7-8).

  python -m symjax.main --config=rasp:task=reverse,model=symbolic --workdir=runs/reverse
  python -m symjax.cli.align --backbone=runs/reverse --workdir=runs/reverse_align

align=false: the same module trained with CE alone (the "without alignment" control). runlocal=true: 50
steps. Results for the three kinds: the docs' "Results" pages.
"""

from symjax.proj import align
from symjax.train import config as config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, align=True, runlocal=False)
  config = align.defaults()
  if not a.align:
    config.activation_weight = 0.0
    config.weights_weight = 0.0
  if a.runlocal:
    config.steps = 50
  return config
