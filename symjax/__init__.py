"""symjax: Token-Factored and Symbolic Transformers ("Symbolic Transformers", Kerce & Fox 2025) in JAX."""

from symjax.model import ModelConfig, Transformer, count_params, param_shapes


def load(workdir: str, which: str | int = 'best'):
  """Model, parameters, config and tokenizer of a trained run; see `symjax.run.workdir.load`."""
  from symjax.run.workdir import load as _load  # the trainer's imports stay out of `import symjax`
  return _load(workdir, which)


__all__ = ['ModelConfig', 'Transformer', 'count_params', 'param_shapes', 'load']
__version__ = '0.1.0'
