"""What several test files share: paths, the tiny config, random parameters, small model shapes and exact
comparisons. Test files import from here (never from each other); fixtures live in ``conftest.py``."""

import contextlib
import glob
import itertools
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import symjax.configs as configs
from symjax.model import ModelConfig


@contextlib.contextmanager
def compilations():
  """Counts XLA compilations inside the block: ``with compilations() as count: ...; count()`` (JAX's
  monitoring event for a backend compilation)."""
  from jax._src import monitoring
  seen = []

  def listener(event, duration, **kw):
    if event == '/jax/core/compile/backend_compile_duration':
      seen.append(duration)
  monitoring.register_event_duration_secs_listener(listener)
  try:
    yield lambda: len(seen)
  finally:
    monitoring.unregister_event_duration_listener(listener)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPT_LEVEL_0 = '--xla_backend_optimization_level=0'  # the suite's compile level (conftest.py says why)
SHAKESPEARE = os.path.join(REPO, '..', 'shared', 'data', 'tinyshakespeare.txt')
TOTAL_STEPS = 40
EPS = 1e-5
KINDS = ('standard', 'token_factored', 'symbolic')
# A small symbolic model with a vocabulary small enough to run every input (decompilation, program training).
PROGRAM_TOKENS = ['<pad>', '<s>', 'a', 'b', 'c', 'd']
PROGRAM = ModelConfig.of(kind='symbolic', vocab_size=len(PROGRAM_TOKENS), num_layers=2, num_heads=3, head_dim=4,
                      ff_dim_per_head=8, max_len=8, tie_embeddings=False)


def every_sequence(n):
  """Every sequence of n tokens out of PROGRAM_TOKENS (the padding token excluded) as ids ``[count, n]``."""
  return np.asarray(list(itertools.product(range(1, len(PROGRAM_TOKENS)), repeat=n)), np.int32)


SMALL = ModelConfig.of(vocab_size=13, num_layers=2, num_heads=3, head_dim=4, ff_dim=10, ff_dim_per_head=5,
                    max_len=16, layer_norm_epsilon=EPS)


def predict_with_numpy_alone(program_path: str, tokens: list[str], cwd: str) -> list[str]:
  """A written program's ``predict(tokens)`` in a fresh interpreter, which fails if the program imported JAX,
  Flax or symjax: the tags it printed."""
  import subprocess
  import sys
  script = ('import sys, importlib.util\n'
            f'spec = importlib.util.spec_from_file_location("p", {program_path!r})\n'
            'm = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n'
            f"print(' '.join(m.predict({tokens!r})))\n"
            "assert not [n for n in sys.modules if n.split('.')[0] in ('jax', 'symjax', 'flax')]\n")
  proc = subprocess.run([sys.executable, '-c', script], cwd=cwd, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return proc.stdout.split()


def small(**kw) -> ModelConfig:
  return SMALL.replace(**kw)


def tiny_config(kind='symbolic', **overrides):
  """The recipes' runlocal version (tiny model, evaluation every 10 steps), run for 40 steps with the last
  two checkpoints kept, so that resumes can start in the middle. ``lstm`` (no recipe of its own) is the
  standard recipe with the recurrent model."""
  config = configs.from_file(f"{'standard' if kind == 'lstm' else kind}:runlocal=true")
  config.model.kind = kind
  config.total_steps = TOTAL_STEPS
  config.warmup_steps = 5
  config.batch_size = 16
  config.keep_checkpoints = 2
  config.progress_bar = False
  for k, v in overrides.items():
    config[k] = v
  return config


def dual_stream_tiny(variant: str):
  """``configs/dual_stream.py``'s runlocal run of ``variant`` (tiny induction), 40 steps, the last two
  checkpoints kept, as ``tiny_config``."""
  config = configs.from_file(f'dual_stream:variant={variant},runlocal=true')
  config.total_steps, config.warmup_steps, config.batch_size, config.keep_checkpoints = TOTAL_STEPS, 5, 16, 2
  config.progress_bar = False
  return config


def shapes_of(module, *inputs, **kwargs):
  """The variables ``module.init`` would make, as shapes and dtypes, without running or compiling init
  (``randomize`` replaces every value anyway; an eager init of a small model takes seconds)."""
  return jax.eval_shape(module.init, jax.random.key(0), *inputs, **kwargs)


def randomize(params, seed, scale=0.5):
  """Replaces every parameter by a random one of its shape, so no parameter sits at its init value.

  Logical-partitioning boxes are dropped: tests read plain arrays. NumPy draws them: JAX's sampler compiles
  once per shape, seconds for a small model."""
  leaves, treedef = jax.tree.flatten(nn.meta.unbox(params))
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(treedef, [jnp.asarray(scale * rng.standard_normal(x.shape), x.dtype) for x in leaves])


def f64(x):
  return np.asarray(x, np.float64)


def params_of(workdir, which='latest'):
  import symjax
  return symjax.load(workdir, which).params


def assert_trees_equal(a, b):
  """Bit-identical on CPU. On GPU, XLA's reductions (the embedding gradient's scatter-add among them) may
  sum in a different order from one run to the next even with --xla_gpu_deterministic_ops, so resumed and
  uninterrupted runs there agree to float32 rounding (seen on an H100: 7e-9 absolute), not bit for bit."""
  exact = jax.default_backend() == 'cpu'
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
    if exact:
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))
    else:
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-7,
                                 err_msg=jax.tree_util.keystr(path))


# Python run in a fresh process before a training call: the process kills itself with SIGKILL when it is
# handed the training batch of step 25 (after the checkpoint of step 20, before that of step 30).
KILLED_AT_STEP_25 = """
import os, signal
from symjax.tasks import base
batch = base.FixedSetTask.batch
def killing_batch(self, split, step, *args):
  if split == 'train' and step == 25:
    os.kill(os.getpid(), signal.SIGKILL)
  return batch(self, split, step, *args)
base.FixedSetTask.batch = killing_batch
"""


# Ways a checkpoint's files get damaged on disk, each of which once left Orbax reads in flight after the
# failed restore (a flood of "Event loop is closed" tracebacks).
DAMAGE = ('short', 'half', 'zero', 'garbage', 'manifest', 'array_metadatas', 'metadata')


def damage(checkpoint: str, kind: str) -> int:
  """Damages the checkpoint folder ``checkpoint`` (``.../checkpoints/<step>``) in the way ``kind`` names;
  returns how many files it changed. ``short``: every stored file overwritten with a short string;
  ``half``/``zero``/``garbage``: every array data file truncated to half, zeroed, or overwritten with random
  bytes of the same size; ``manifest``: the OCDBT manifests deleted; ``array_metadatas``/``metadata``: those
  JSON files overwritten."""
  if kind not in DAMAGE:
    raise ValueError(f'unknown damage {kind!r}; kinds: {DAMAGE}')
  root = os.path.join(checkpoint, 'default')
  if kind == 'short':
    paths = [p for p in glob.glob(os.path.join(root, '**', '*'), recursive=True) if os.path.isfile(p)]
  elif kind in ('half', 'zero', 'garbage'):
    paths = glob.glob(os.path.join(root, '**', 'd', '*'), recursive=True)
  elif kind == 'manifest':
    paths = glob.glob(os.path.join(root, '**', 'manifest.ocdbt'), recursive=True)
  else:
    paths = glob.glob(os.path.join(root, 'array_metadatas', '*')) if kind == 'array_metadatas' else [
        os.path.join(root, '_METADATA')]
  rng = np.random.default_rng(0)
  for path in paths:
    size = os.path.getsize(path)
    if kind == 'half':
      os.truncate(path, size // 2)
    elif kind == 'manifest':
      os.remove(path)
    else:
      data = {'zero': bytes(size), 'garbage': rng.bytes(size)}.get(kind, b'not a checkpoint')
      with open(path, 'wb') as f:
        f.write(data)
  return len(paths)
