"""Seconds per call of the edge methods (``symjax.interpret.edges``) on the text recipe's 4-layer model: EAP over
every edge, EAP-IG, AtP*, the exact patch of every edge and ACDC, compiled and warm, per model kind.

  python -m benchmarks.speed.edges [--kinds=standard,token_factored,symbolic] [--batch=8] [--length=64]
      [--repeats=5] [--json=benchmarks/results/edges_speed.json]

``eap_ig_16_one_program`` times EAP-IG's 16 steps vmapped in one compiled program, the alternative to the
library's one backward pass a step. The model is ``--config=KIND:task=text,size=medium`` (4 layers × 4 heads,
d_model 128) over Tiny Shakespeare's 65 characters, at its initialisation: the time of a pass does not depend on
the values of the weights. Clean and corrupt inputs are random characters, ``--batch`` × ``--length``; the metric
is the mean log-probability of the clean run's last prediction. Each method is called once to compile, then
timed ``--repeats`` times (median).
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import configs
from benchmarks.lib import cli
from benchmarks.lib import results as result_files
from symjax.model import build
from symjax.train import config as config_lib

_KINDS = flags.DEFINE_list('kinds', ['standard', 'token_factored', 'symbolic'], 'Model kinds.')
_BATCH = flags.DEFINE_integer('batch', 8, 'Prompts.', lower_bound=1)
_LENGTH = flags.DEFINE_integer('length', 64, 'Tokens a prompt.', lower_bound=2)
_REPEATS = cli.repeats(5)
_ACDC = flags.DEFINE_float('threshold', 0.001, "ACDC's threshold.", lower_bound=0)
_JSON = cli.json_output('benchmarks/results/edges_speed.json', 'Output.')
VOCAB = 65  # Tiny Shakespeare's characters


def timed(fn, repeats: int) -> tuple[float, float]:
  """(the first call's seconds, the median of ``repeats`` more)."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return first, statistics.median(times)


def measure(kind: str) -> dict:
  from symjax.interpret import edges
  config = configs.from_file(f'{kind}:task=text,size=medium')
  cfg = config_lib.model_config(config, VOCAB, causal=True)
  model = build(cfg)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, _LENGTH.value), jnp.int32))['params']
  rng = np.random.default_rng(0)
  clean, corrupt = (rng.integers(0, VOCAB, (_BATCH.value, _LENGTH.value)) for _ in range(2))
  weights = np.zeros(clean.shape, np.float32)
  weights[:, -1] = 1.0
  e = edges.Edges(model, params, clean, corrupt, weights=weights)
  # EAP-IG as the library runs it (a compiled backward pass a step) beside its 16 steps as one program (the
  # same gradients vmapped in one batch), the alternative it was chosen over.
  alphas = (jnp.arange(16, dtype=jnp.float32) + 0.5) / 16
  value = e._program('value')
  one_program = jax.jit(lambda data, ws: jax.lax.map(jax.vmap(jax.grad(lambda w: value(data, w))), ws))
  steps = alphas[None, :, None] * jnp.ones((1, 1, len(e.graph.edges)), jnp.float32)
  calls = {'eap': e.eap, 'eap_ig_16': lambda: e.eap_ig(16),
           'eap_ig_16_one_program': lambda: one_program(e._data, steps),
           'atp_star': e.atp_star, 'exact': e.exact, 'acdc': lambda: e.acdc(_ACDC.value)[0]}
  out = {'edges': len(e.graph.edges), 'nodes': len(e.graph.nodes)}
  for name, fn in calls.items():
    repeats = _REPEATS.value if name not in ('exact', 'acdc') else 1
    first, warm = timed(fn, repeats)
    out[name] = {'seconds': warm, 'seconds_first': first}
    print(kind, name, f'{warm:.3f} s warm, {first:.3f} s first', flush=True)
  return out


def main(argv):
  del argv
  per_kind = {kind: measure(kind) for kind in _KINDS.value}
  result_files.write(_JSON.value, {
      'what': 'seconds per call of the edge methods on the text recipe\'s 4-layer model (size=medium), compiled '
              'and warm (median), and the first call (compiling); EAP over every edge, EAP-IG with 16 steps',
      'batch': _BATCH.value, 'length': _LENGTH.value, 'repeats': _REPEATS.value, 'threshold': _ACDC.value,
      'per_kind': per_kind})


if __name__ == '__main__':
  app.run(main)
