"""Where one CPU core's time goes in each kind's training step, and how the step divides over the cores.

  python -m benchmarks.speed.step_attribution [--kinds=standard,token_factored,symbolic] [--json=F]

The compiled training step of each kind at the text recipe (benchmarks/lib/recipe.py: random tokens), as the
trainer compiles it for that kind (symjax.system.host), is timed in two child processes: one pinned to one CPU,
one on all of them, the second with the cores' placement sampled beside it (benchmarks/speed/core_latency.py;
the median is over the rounds run with the cores near). The first kind's children also time the side by side
benchmark's PyTorch model (benchmarks/speed/torch_gpt.py: forward, backward, clipping, fused AdamW) on one
thread and on all, so the two programs' gain from the second core is read in one run.

Pinned, XLA:CPU runs every op on one thread, so the trace's op times add up to the step (on several threads they
do not: a product can hand parts of itself to another thread without a trace event there). Each op of 3 traced
steps is charged, through the optimised HLO's metadata (benchmarks/lib/profiling.py), to its pass (forward,
backward, or the update and metrics after the gradient), the module it sits in (attention, FFN, norms,
embedding and readout, residual adds), and to the matrix products (a dot, or a fusion holding one) or the rest.
The products' rate is the model's product FLOPs (3 × the forward count of benchmarks/lib/flops.py) over their
time, against the best rate one core reaches on one of the model's own products (the FFN's [768, 128] @
[128, 512]) in XLA, NumPy's BLAS and PyTorch, each on one thread. From these: the one-core step with every
product at that best rate, and that step on all cores if they divided it as they divide the measured one (a
projection, printed as such). The standard kind's children also time its block's parts alone. One run;
timings, not trained models.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_KINDS = flags.DEFINE_list('kinds', ['standard', 'token_factored', 'symbolic'],
                           'Model kinds (configs/<kind>.py at the text recipe).')
_JSON = flags.DEFINE_string('json', 'benchmarks/results/step_attribution.json', 'Where to write the results.')
_WORKER = flags.DEFINE_enum('worker', '', ['', 'one_core', 'all_cores'], 'Internal: run one child.')
_TORCH = flags.DEFINE_bool('torch', True, 'Internal: a child also times the PyTorch model.')
_STEPS = flags.DEFINE_integer('steps', 30, 'Steps per timed round.')
_REPEATS = flags.DEFINE_integer('repeats', 7, 'Timed rounds (the median is reported).')

PEAK_SHAPE = (768, 128, 512)  # the FFN's input product at the recipe: [tokens, d_model] @ [d_model, ff_dim]


def peak_rates(one_core: bool) -> dict[str, float]:
  """GFLOP/s of PEAK_SHAPE's product in XLA, PyTorch (if installed) and NumPy, each on this process's CPUs."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from benchmarks.lib.timing import median_seconds
  m, k, n = PEAK_SHAPE
  flop = 2 * m * k * n
  a, b = np.random.default_rng(0).standard_normal((2, max(m, k), max(k, n)), np.float32)
  a, b = np.ascontiguousarray(a[:m, :k]), np.ascontiguousarray(b[:k, :n])
  product = jax.jit(jnp.matmul)
  xa, xb = jnp.asarray(a), jnp.asarray(b)
  rates = {'xla': flop / median_seconds(product, xa, xb, steps=50, repeats=9) / 1e9,
           'numpy': flop / median_seconds(np.matmul, a, b, steps=50, repeats=9) / 1e9}
  try:
    import torch
  except ImportError:
    return rates
  if one_core:
    torch.set_num_threads(1)
  ta, tb = torch.from_numpy(a), torch.from_numpy(b)
  rates['torch'] = flop / median_seconds(lambda: torch.matmul(ta, tb), steps=50, repeats=9) / 1e9
  return rates


def timed_rounds(step) -> list[dict]:
  """ms per step of --repeats rounds of --steps calls of ``step`` (which waits for its result), after 5."""
  for _ in range(5):
    step()
  rounds = []
  for _ in range(_REPEATS.value):
    start, clock = time.time(), time.perf_counter()
    for _ in range(_STEPS.value):
      step()
    rounds.append({'ms': 1e3 * (time.perf_counter() - clock) / _STEPS.value, 'span_unix': (start, time.time())})
  return rounds


def torch_step_rounds(one_core: bool) -> list[dict] | None:
  """The side by side benchmark's PyTorch model (benchmarks/speed/torch_gpt.py) at the same recipe: the
  training step (forward, backward, clipping, fused AdamW) on random tokens; None without PyTorch."""
  try:
    import torch
  except ImportError:
    return None
  from benchmarks.speed import torch_gpt
  torch.set_num_threads(1 if one_core else len(os.sched_getaffinity(0)))
  torch.manual_seed(0)
  model = torch_gpt.GPT(65)
  opt = torch_gpt.adamw(model, lr=1e-3)
  tokens = torch.randint(0, 65, (12, 65))

  def step():
    loss = model(tokens[:, :-1], tokens[:, 1:])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
  return timed_rounds(step)


def part_rounds(cfg, state) -> dict[str, list[dict]]:
  """The standard block's parts at the recipe's shapes, each its forward and backward pass alone ([12, 64, 128]
  random inputs): attention with its projections, the FFN, one LayerNorm, the whole block; and the AdamW update
  with clipping of the whole model's parameters (the gradients a fixed fraction of them). Rounds as the step's."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import optax

  from symjax.model import transformer
  from symjax.train import config as config_lib
  from symjax.train import optim
  x = jax.random.normal(jax.random.key(0), (12, 64, cfg.d_model))
  key_mask = jnp.ones(x.shape[:2], bool)
  modules = {'attention': (transformer.attention_layer(cfg, True, True), {'key_mask': key_mask}),
             'FFN': (transformer.MLP(cfg.ff_dim), {}),
             'LayerNorm': (nn.LayerNorm(cfg.layer_norm_epsilon), {}),
             'block': (transformer.StandardBlock(cfg), {'key_mask': key_mask})}
  out = {}
  for name, (module, kw) in modules.items():
    params = module.init(jax.random.key(1), x, **kw)

    def forward_backward(params, x, module=module, kw=kw):
      y, vjp = jax.vjp(lambda p, x: module.apply(p, x, **kw), params, x)
      return vjp(y)
    compiled = jax.jit(forward_backward).lower(params, x).compile()
    out[name] = timed_rounds(lambda: jax.block_until_ready(compiled(params, x)))
  tx = optim.make_optimizer(config_lib.from_file('standard:task=text,size=medium'))
  params = state.params
  grads = jax.tree.map(lambda p: 0.01 * p, params)

  def update(params, opt_state, grads):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
  compiled = jax.jit(update).lower(params, state.opt_state, grads).compile()
  out['AdamW update'] = timed_rounds(lambda: jax.block_until_ready(compiled(params, state.opt_state, grads)))
  return out


def worker(kind: str, one_core: bool, with_torch: bool) -> dict:
  if one_core:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    os.environ['OPENBLAS_NUM_THREADS'] = os.environ['OMP_NUM_THREADS'] = '1'  # NumPy's BLAS on this core
  from symjax.system import host
  host.set_cpu_compiler_defaults(kind)
  import jax

  from benchmarks.lib import profiling
  from benchmarks.lib.flops import forward_flops_per_token
  from benchmarks.lib.recipe import compile_recipe_step

  recipe = compile_recipe_step(kind)
  box = [recipe.state]

  def step():
    box[0], metrics = recipe.step(box[0], recipe.data)
    return metrics

  rounds = timed_rounds(lambda: jax.block_until_ready(step()))
  parts = part_rounds(recipe.cfg, box[0]) if kind == 'standard' else None
  tokens = recipe.data['inputs'].size
  result = {'rounds': rounds,
            'cpus': len(os.sched_getaffinity(0)),
            'model_gflop': 3 * forward_flops_per_token(recipe.cfg, recipe.data['inputs'].shape[1]) * tokens / 1e9,
            'peak_gflops': peak_rates(one_core), 'part_rounds': parts,
            'torch_rounds': torch_step_rounds(one_core) if with_torch else None}
  if not one_core:
    return result
  ops = profiling.hlo_ops(recipe.step.as_text())
  with tempfile.TemporaryDirectory() as log_dir:
    with jax.profiler.trace(log_dir, create_perfetto_trace=True):
      for _ in range(3):
        jax.block_until_ready(step())
    events, steps = profiling.trace_events(log_dir, ops)
  table: dict[str, dict[str, float]] = collections.defaultdict(lambda: {'products_ms': 0.0, 'other_ms': 0.0})
  partial_sums = 0.0
  for name, us in events:
    op_name, product = ops[name]
    stage, part = profiling.classify(op_name)
    table[f'{stage}: {part}']['products_ms' if product else 'other_ms'] += us / 1e3 / steps
    partial_sums += us / 1e3 / steps if 'reduce-window' in name else 0.0
  result.update(traced_steps=steps, rows=dict(table), partial_sums_ms=partial_sums)
  return result


def child(kind: str, which: str, with_torch: bool) -> dict:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get('PYTHONPATH')])))
  proc = subprocess.run([sys.executable, '-m', 'benchmarks.speed.step_attribution', f'--kinds={kind}',
                         f'--worker={which}', f'--torch={with_torch}', f'--steps={_STEPS.value}',
                         f'--repeats={_REPEATS.value}'], capture_output=True, text=True, env=env)
  lines = [line for line in proc.stdout.splitlines() if line.startswith('{')]
  if proc.returncode or not lines:
    sys.exit(f'error: the {which} child of {kind} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}')
  return json.loads(lines[-1])


def measure(kind: str, with_torch: bool, probe: str | None, folder: str) -> tuple[dict, dict]:
  """(one core, all cores) for ``kind``; all cores with the probe sampling the cores' placement beside it."""
  from benchmarks.speed import core_latency
  one = child(kind, 'one_core', with_torch)
  with core_latency.Monitor(probe, os.path.join(folder, f'{kind}.log'), core_latency.INTERVAL_MS) as monitor:
    every = child(kind, 'all_cores', with_torch)
  samples = monitor.samples()
  limit = core_latency.FAR_FACTOR * min(ns for _, ns in samples) if samples else None
  for result, bound in ((one, None), (every, limit)):  # one core: no pair of cores to place
    for key in ('rounds', 'torch_rounds'):
      if result.get(key):
        result[key.replace('rounds', 'ms')] = core_latency.median_with_cores_near(result[key], samples, bound)
    if result.get('part_rounds'):
      result['parts_ms'] = {name: core_latency.median_with_cores_near(rounds, samples, bound)
                            for name, rounds in result['part_rounds'].items()}
  return one, every


def report(kind: str, one: dict, every: dict) -> dict:
  """Prints ``kind``'s table and returns its record."""
  rows = one['rows']
  products_ms = sum(r['products_ms'] for r in rows.values())
  other_ms = sum(r['other_ms'] for r in rows.values())
  peak = max(one['peak_gflops'].values())
  at_peak_ms = 1e3 * one['model_gflop'] / peak + other_ms
  speedup = one['ms']['step_ms'] / every['ms']['step_ms']
  print(f"\n{kind}: step at the text recipe, median of {_REPEATS.value} rounds of {_STEPS.value} steps")
  print(f"  {'program':14s} {'one core':>9s} {str(every['cpus']) + ' cores':>9s} {'speed-up':>8s}")
  for name, key in ((kind, 'ms'), ('PyTorch', 'torch_ms')):
    if key in one and key in every:
      print(f"  {name:14s} {one[key]['step_ms']:6.1f} ms {every[key]['step_ms']:6.1f} ms "
            f"{one[key]['step_ms'] / every[key]['step_ms']:7.2f}×")
  near = every['ms'].get('rounds_cores_near')
  print(f"  ({every['cpus']} cores: " + ('the cores\' placement not sampled)' if near is None else
        f"the median of the rounds run with the cores near, {near} of {_REPEATS.value}"
        + (f", {every['torch_ms']['rounds_cores_near']} for PyTorch)" if 'torch_ms' in every else ')')))
  print(f"  one core, traced ops per step (sum {products_ms + other_ms:.1f} ms of a {one['ms']['step_ms']:.1f} ms "
        f"step):\n    {'pass: part':42s} {'products':>9s} {'other':>8s}")
  for name, r in sorted(rows.items(), key=lambda kv: -(kv[1]['products_ms'] + kv[1]['other_ms'])):
    print(f"    {name:42s} {r['products_ms']:6.2f} ms {r['other_ms']:6.2f} ms")
  rate = one['model_gflop'] / products_ms * 1e3
  print(f"  products: {one['model_gflop']:.2f} GFLOP in {products_ms:.1f} ms, {rate:.0f} GFLOP/s on one core; the "
        'best rate on one core: ' + ', '.join(f'{k} {v:.0f}' for k, v in one['peak_gflops'].items())
        + f' GFLOP/s ({PEAK_SHAPE[0]}×{PEAK_SHAPE[1]} @ {PEAK_SHAPE[1]}×{PEAK_SHAPE[2]})')
  print(f"  XLA:CPU's partial sums of long reductions (reduce-window), within the rows above: "
        f"{one['partial_sums_ms']:.1f} ms")
  if one.get('parts_ms') and every.get('parts_ms'):
    print(f"  the block's parts alone, forward and backward (the update: AdamW with clipping):\n"
          f"    {'part':14s} {'one core':>9s} {str(every['cpus']) + ' cores':>9s} {'speed-up':>8s}")
    for name, mine in one['parts_ms'].items():
      a, b = mine['step_ms'], every['parts_ms'][name]['step_ms']
      print(f"    {name:14s} {a:6.2f} ms {b:6.2f} ms {a / b:7.2f}×")
  print(f"  every product at {peak:.0f} GFLOP/s: one core {at_peak_ms:.1f} ms a step; on {every['cpus']} cores "
        f"divided as now ({speedup:.2f}×), {at_peak_ms / speedup:.1f} ms (projection)")
  return {'one_core': one, 'all_cores': every, 'products_ms': products_ms, 'other_ms': other_ms,
          'products_gflops': rate, 'best_gflops': peak, 'step_at_best_rate_one_core_ms': at_peak_ms,
          'cores_speedup': speedup, 'projected_step_at_best_rate_ms': at_peak_ms / speedup}


def main(_):
  if _WORKER.value:
    print(json.dumps(worker(_KINDS.value[0], _WORKER.value == 'one_core', _TORCH.value)))
    return
  from benchmarks.lib import results as result_files
  from benchmarks.speed import core_latency
  records = {}
  with tempfile.TemporaryDirectory() as folder:
    probe, why_not = core_latency.build(folder)
    if why_not:
      print(f"the cores' placement is not sampled: {why_not}", file=sys.stderr)
    for i, kind in enumerate(_KINDS.value):
      records[kind] = report(kind, *measure(kind, i == 0, probe, folder))  # PyTorch's model once
  result_files.write(_JSON.value, {'steps': _STEPS.value, 'repeats': _REPEATS.value, 'kinds': records})


if __name__ == '__main__':
  app.run(main)
