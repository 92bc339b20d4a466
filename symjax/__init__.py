"""symjax: Token-Factored and Symbolic Transformers ("Symbolic Transformers", Kerce & Fox 2025) in JAX."""

from symjax.model import ModelConfig, Transformer, count_params, param_shapes

__all__ = ['ModelConfig', 'Transformer', 'count_params', 'param_shapes']
__version__ = '0.1.0'
