import os
import sys

import jax

from symjax.system import host

# Tests import the NumPy transcription of the paper as a plain module.
sys.path.insert(0, os.path.dirname(__file__))

# The same XLA:CPU and allocator settings as the trainer (before the first computation starts the backend).
host.prepare()

# On GPU and TPU a float32 matrix product runs by default at reduced precision (TF32 / bfloat16 passes),
# about 1e-3 relative: the float32 tolerances of these tests assume true float32 products, as on CPU.
if jax.default_backend() != 'cpu':
  jax.config.update('jax_default_matmul_precision', 'highest')
