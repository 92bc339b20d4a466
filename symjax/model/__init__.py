"""The model: its typed configuration, the blocks of the three kinds, and the modules they compose.

- ``config``: ``ModelConfig``, every architectural choice, checked once.
- ``attention``: mask predicates, ALiBi with learned slopes, the multi-head ``Attention`` module.
- ``symbolic``: ``KroneckerValue``, ``ChannelLayerNorm``, ``VocabProjection``, ``VocabFFN``.
- ``mixing``: the dual-stream family's head and FFN mixings (independent, Kronecker, dense).
- ``transformer``: the standard and two-stream blocks, ``Transformer`` (and ``Suffix``, its later positions
  given the earlier ones' keys and values), the LSTM baseline, ``build``.
- ``transformer_program``: the Transformer Program kind (``kind='program'``): named categorical variables, each
  module reading the ones it selects, so that it decompiles into code (``symjax.proj.program_code``).
- ``intermediates``: the one list of the names the model sows.

The computations these modules call (attention kernels, vocabulary projections, the readout) live in
``symjax.ops``.
"""

from symjax.model.config import ModelConfig
from symjax.model.transformer import (
                                      LSTM,
                                      FactoredBlock,
                                      StandardBlock,
                                      Suffix,
                                      Transformer,
                                      build,
                                      check_token_ids,
                                      count_params,
                                      for_backend,
                                      param_shapes,
)
from symjax.model.transformer_program import TransformerProgram

__all__ = ['ModelConfig', 'Transformer', 'TransformerProgram', 'StandardBlock', 'FactoredBlock', 'Suffix', 'LSTM',
           'build', 'check_token_ids', 'count_params', 'for_backend', 'param_shapes']
