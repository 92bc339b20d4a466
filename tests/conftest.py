import os
import sys

import jax

from symjax.system import host
from symjax.train import config as train_config

# Tests import the NumPy transcription of the paper as a plain module.
sys.path.insert(0, os.path.dirname(__file__))
from helpers import OPT_LEVEL_0  # noqa: E402  (tests/ is on the path from here)

# The tests compile thousands of small programs and run most of them a few times, so on a machine whose JAX
# compilation cache is empty (a fresh CI machine) compiling is most of their time. At LLVM's lowest
# optimisation level XLA compiles in about half the time (the tiny symbolic train step: 4.5 s -> 2.2 s) and
# the suite, which checks values and not speed, runs in 23 min against 31
# (benchmarks/results/test_suite_cold_cache.json). Set before the backend starts, and inherited by the
# commands the tests run; a level in the user's own XLA_FLAGS wins.
if OPT_LEVEL_0.split('=')[0] not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {OPT_LEVEL_0}".strip()

# The same XLA:CPU and allocator settings as the trainer (before the first computation starts the backend).
host.prepare()

# The trainer's persistent compilation cache from the first test on, as a run turns it on: many tests compile
# the same program as another test, another worker or a command they start, and each then compiles it once
# (before, a worker turned it on only at its first training run; test_suite_cache_from_the_start.json).
host.use_compilation_cache(train_config.default_config().compilation_cache_dir)

# On GPU and TPU a float32 matrix product runs by default at reduced precision (TF32 / bfloat16 passes),
# about 1e-3 relative: the float32 tolerances of these tests assume true float32 products, as on CPU.
if jax.default_backend() != 'cpu':
  jax.config.update('jax_default_matmul_precision', 'highest')
