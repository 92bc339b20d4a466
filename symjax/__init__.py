"""symjax: Token-Factored and Symbolic Transformers ("Symbolic Transformers", Kerce & Fox 2025) in JAX.

The names below are imported on first use: ``python -m symjax.main`` imports this package before its own code
runs, and that code sets the process up (``symjax.system.host``) before JAX and Flax are imported."""

import importlib

_FROM_MODEL = ('ModelConfig', 'Transformer', 'count_params', 'param_shapes')
_SUBPACKAGES = ('cli', 'interpret', 'model', 'ops', 'proj', 'run', 'system', 'tasks', 'train')


def load(workdir: str, which: str | int = 'best'):
  """Model, parameters, config and tokenizer of a trained run; see `symjax.run.workdir.load`."""
  from symjax.run.workdir import load as _load  # the trainer's imports stay out of `import symjax`
  return _load(workdir, which)


def __getattr__(name: str):
  if name in _FROM_MODEL:
    return getattr(importlib.import_module('symjax.model'), name)
  if name in _SUBPACKAGES:
    return importlib.import_module(f'symjax.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted([*globals(), *_FROM_MODEL, *_SUBPACKAGES])


__all__ = ['ModelConfig', 'Transformer', 'count_params', 'param_shapes', 'load']
__version__ = '0.1.0'
