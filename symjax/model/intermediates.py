"""The one list of the intermediates the model sows.

Every module writes its reads with ``self.sow('intermediates', NAME, value)`` under the names below, and
every reader (distillation, the interpretability tools) finds them here. Read them with
``model.apply(variables, tokens, mutable=['intermediates'])``; every value is a 1-tuple. Paths are relative
to the model: ``layer_{l}`` is block l (0 = the first block), and the names at the top level are the input
state before block 0.

  name                                   shape                        what
  ``x_t_0``, ``x_e_0``                   [batch, time, d_model]       two-stream models: X_t^0, X_e^0
  ``x_0``                                [batch, time, d_model]       standard model: the input to block 0
  ``layer_{l}/x_t_attn``, ``x_e_attn``   [batch, time, d_model]       the streams after block l's attention
  ``layer_{l}/x_t_ffn``, ``x_e_ffn``     [batch, time, d_model]       the streams after block l's FFN
  ``layer_{l}/x_attn``, ``x_ffn``        [batch, time, d_model]       standard blocks: the residual stream
  ``layer_{l}/attention/weights``        [batch, heads, time, time]   attention weights
  ``layer_{l}/value_projection/mixture`` [batch, time, heads, vocab]  symbolic: α of the values (eq. 27)
  ``layer_{l}/ffn/projection/mixture``   [batch, time, heads, vocab]  symbolic: α of the FFN update (eq. 19)
"""

COLLECTION = 'intermediates'

# The input state (top level of the model).
X_T_0 = 'x_t_0'
X_E_0 = 'x_e_0'
X_0 = 'x_0'
# Two-stream blocks: the streams after the attention and after the FFN.
X_T_ATTN = 'x_t_attn'
X_E_ATTN = 'x_e_attn'
X_T_FFN = 'x_t_ffn'
X_E_FFN = 'x_e_ffn'
# Standard blocks: the residual stream after the attention and after the MLP.
X_ATTN = 'x_attn'
X_FFN = 'x_ffn'
# Inside the attention module and the vocabulary projection.
WEIGHTS = 'weights'
MIXTURE = 'mixture'
# Module names on the paths above.
ATTENTION = 'attention'
VALUE_PROJECTION = 'value_projection'
FFN = 'ffn'
PROJECTION = 'projection'


def layer(l: int) -> str:
  """The module name of block ``l`` (0 = the first block)."""
  return f'layer_{l}'


def _one(value):
  """A sown value is a 1-tuple; a tree that was already unwrapped holds the array itself."""
  return value[0] if isinstance(value, tuple) else value


def streams(kind: str, num_layers: int, inter) -> list[dict]:
  """The state before block 0 and after each block l (index l + 1), as {'x_t', 'x_e', 'x'}
  ``[batch, time, d_model]``, rebuilt from one forward pass's intermediates. Arrays keep their type (JAX
  inside a step, NumPy in the interpretability tools).

  For the two-stream kinds X_t and X_e are the model's own streams. The standard model has one residual
  stream; it is split the same way, X_t = the input plus every attention update and X_e = the sum of the
  FFN updates, so that the kinds can be compared stream by stream."""
  if kind == 'standard':
    x = _one(inter[X_0])
    x_t, x_e, out = x, x - x, []
    out.append({'x_t': x_t, 'x_e': x_e, 'x': x})
    for l in range(num_layers):
      block = inter[layer(l)]
      x_attn, x_ffn = _one(block[X_ATTN]), _one(block[X_FFN])
      x_t, x_e = x_t + (x_attn - x), x_e + (x_ffn - x_attn)
      x = x_ffn
      out.append({'x_t': x_t, 'x_e': x_e, 'x': x})
    return out
  out = [{'x_t': _one(inter[X_T_0]), 'x_e': _one(inter[X_E_0])}]
  out += [{'x_t': _one(inter[layer(l)][X_T_FFN]), 'x_e': _one(inter[layer(l)][X_E_FFN])} for l in range(num_layers)]
  for s in out:
    s['x'] = s['x_t'] + s['x_e']
  return out
