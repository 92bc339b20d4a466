"""Training throughput on this machine against the rate of the model's own matrix products.

  python -m benchmarks.speed.throughput [--steps=100] [--json=benchmarks/results/throughput.json]

Each kind at the text recipe (`configs/<kind>.py:task=text,size=medium`: 4 layers, 4 heads × 32, context
64, batch 12, |V| = 65 as for Tiny Shakespeare), float32, on random tokens: steady-state tokens/s of the
compiled training step (compilation and two warm-up steps excluded; median of --repeats rounds of --steps
steps), model FLOP/s (3 × the forward count of benchmarks/lib/flops.py), and, in the same run, the FLOP/s of
exactly the model's matrix products (each forward product and its two backward products, one jitted
function, nothing else). The ratio is the fraction of that limit the training step reaches. Also the
compile time of the step, the time from process start to the first finished step, the loss after the timed
steps (equal across runs that change only how the step runs) and the process's peak resident memory so
far (kinds run in the order given). The compiler flags of symjax/system/host.py are applied as the trainer
applies them.
"""

import os
import resource
import sys
import time

_START = time.perf_counter()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks.lib import cli, profiling  # noqa: E402
from benchmarks.lib import results as result_files  # noqa: E402
from benchmarks.lib.flops import forward_flops_per_token, products  # noqa: E402
from benchmarks.lib.recipe import compile_recipe_step  # noqa: E402
from benchmarks.lib.timing import median_seconds  # noqa: E402
from symjax.system import host  # noqa: E402

_KINDS = cli.kinds()
_STEPS = cli.steps(100, 'Steps per timed round.')
_REPEATS = cli.repeats(3, 'Timed rounds (the median is reported).')
_VOCAB = flags.DEFINE_integer('vocab', 65, 'Vocabulary size (Tiny Shakespeare: 65 characters).')
_JSON = cli.json_output('benchmarks/results/throughput.json')
_PROFILE_DIR = flags.DEFINE_string('profile_dir', '', 'If set: after timing, 3 steps of each kind are traced '
                                    '(jax.profiler) and XLA:CPU\'s ops summed by name (benchmarks/lib/profiling.py).')


def timed_rounds(fn, *args) -> float:
  """Median seconds per call over --repeats rounds of --steps calls (after two warm-up calls)."""
  return median_seconds(fn, *args, steps=_STEPS.value, repeats=_REPEATS.value)


def matmul_limit(cfg, batch: int, seq_len: int) -> tuple[float, float]:
  """(seconds, FLOPs) of the model's forward products and their backward products, batch × sequences."""
  shapes = [(b * batch, m, k, n) if per_sequence else (b, m * batch, k, n)
            for b, m, k, n, per_sequence in products(cfg, seq_len)]
  keys = iter(jax.random.split(jax.random.key(0), 3 * len(shapes)))
  operands = [tuple(jax.random.normal(next(keys), s, jnp.float32) for s in ((b, m, k), (b, k, n), (b, m, n)))
              for b, m, k, n in shapes]

  @jax.jit
  def all_products(operands):
    out = []
    for a, w, g in operands:
      out += [a @ w, g @ jnp.swapaxes(w, 1, 2), jnp.swapaxes(a, 1, 2) @ g]  # y, dL/da, dL/dw
    return out

  flops = sum(3 * 2 * b * m * k * n for b, m, k, n in shapes)
  return timed_rounds(all_products, operands), flops


def measure(kind: str) -> dict:
  recipe = compile_recipe_step(kind, _VOCAB.value)
  cfg, compiled, data = recipe.cfg, recipe.step, recipe.data
  batch, seq_len = data['inputs'].shape
  state, metrics = compiled(recipe.state, data)
  jax.block_until_ready(metrics)
  first_step_s = time.perf_counter() - _START
  # Donated state: thread it through the timed calls.
  box = [state]

  def one(_):
    box[0], m = compiled(box[0], data)
    return m

  step_s = timed_rounds(one, None)
  # The loss after a fixed number of steps (2 warm-up + repeats × steps): runs of this script with other
  # settings must reproduce it, since a setting that speeds the step up may not change what it computes.
  loss = float(one(None)['loss'])
  peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
  ops = (profiling.profile_ops(lambda: one(None), os.path.join(_PROFILE_DIR.value, kind), 'CPU')
         if _PROFILE_DIR.value else None)
  matmul_s, matmul_flops = matmul_limit(cfg, batch, seq_len)
  flops = 3 * forward_flops_per_token(cfg, seq_len) * batch * seq_len
  return {'kind': kind, 'parameters': recipe.parameters,
          'step_s': step_s, 'tokens_per_s': batch * seq_len / step_s, 'model_flops_per_step': flops,
          'model_gflops_per_s': flops / step_s / 1e9, 'matmul_gflops_per_s': matmul_flops / matmul_s / 1e9,
          'matmul_flops': matmul_flops, 'fraction_of_limit': (flops / step_s) / (matmul_flops / matmul_s),
          'compile_s': recipe.compile_s, 'seconds_to_first_step': first_step_s, 'loss_after_timed_steps': loss,
          'peak_resident_mib_so_far': peak_rss_mib, **({'ops': ops} if ops else {})}


def main(_):
  host.prepare()  # as the trainer does
  rows = [measure(kind) for kind in _KINDS.value]
  print(f'\n{jax.devices()[0].device_kind} ({jax.default_backend()}), text recipe: batch 12 × 64, |V| = {_VOCAB.value}, '  # noqa: E501
        f'float32; median of {_REPEATS.value} rounds of {_STEPS.value} steps')
  print('| kind | parameters | step | tokens/s | model GFLOP/s | its products alone, GFLOP/s | fraction | compile '
        '| loss after | peak resident |')
  print('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
  for r in rows:
    print(f"| {r['kind']} | {r['parameters']:,} | {1e3 * r['step_s']:.2f} ms | {r['tokens_per_s']:,.0f} | "
          f"{r['model_gflops_per_s']:.1f} | {r['matmul_gflops_per_s']:.1f} | {100 * r['fraction_of_limit']:.0f}% | "
          f"{r['compile_s']:.1f} s | {r['loss_after_timed_steps']:.6f} | {r['peak_resident_mib_so_far']:.0f} MiB |")
  for r in rows:
    if 'ops' in r:
      profiling.print_profile(r['kind'], r['step_s'] * 1e3, r['ops'], lines_with=('',))
  print(f"time from start to the first finished step (first kind, compile included): "
        f"{rows[0]['seconds_to_first_step']:.1f} s")
  result_files.write(_JSON.value, {'device': jax.devices()[0].device_kind, 'jax': jax.__version__, 'rows': rows,
               'xla_flags': os.environ.get('XLA_FLAGS', ''),
               'command': 'python -m benchmarks.speed.throughput ' + ' '.join(sys.argv[1:])})
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
