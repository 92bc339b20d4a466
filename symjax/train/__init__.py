"""Training: the run configuration (``config``), the optimiser (``optim``), metrics (``metrics``), the
trainer (``trainer.train_and_evaluate``), several seeds in one program (``seeds``), grid sweeps
(``sweep``), distillation (``distill``) and the non-neural baselines (``baselines``).

Nothing here is imported by ``import symjax``: ``from symjax.train import trainer`` when you need it.
"""
