"""Training throughput, model FLOP utilisation and memory at GPT-2-small scale, on an accelerator.

  python benchmarks/accelerator.py [--batch=8] [--seq_len=1024] [--json=accelerator.json]

For standard / token_factored / symbolic (streamed projection, streamed loss): 12 layers, 12 heads × 64,
|V| = 50,257, FFN 3072 (VocabFFN 256 per channel), bfloat16 compute, float32 parameters, AdamW. Each kind
runs in its own process so that the device's peak-memory counter belongs to it alone. Printed per kind:

- steady-state tokens/s (compilation and the first steps excluded; timed over whole steps, synchronised);
- model FLOPs per step (forward + backward = 3 × forward, counted from the shapes below; the causal
  attention is counted in full, as in the PaLM paper's MFU) and MFU = model FLOP/s ÷ the device's peak, next
  to the rate of a large bfloat16 matrix product measured in the same run;
- the peak device memory the step actually used (``memory_stats()['peak_bytes_in_use']``) next to XLA's
  compile-time prediction (arguments + outputs − donated + temporaries), and XLA's own FLOP count.

Then the vocabulary projection alone, direct vs streamed, forward + backward at |V| = 50,257.
"""

import json
import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from symjax import config_lib, optim, symbolic, train
from flops import forward_flops_per_token  # benchmarks/flops.py
from symjax.model import Transformer

_KINDS = flags.DEFINE_list('kinds', ['standard', 'standard:direct', 'token_factored', 'token_factored:direct',
                                      'symbolic'],
                           'Model kinds; KIND:direct computes the loss from whole logits (readout direct).')
_BATCH = flags.DEFINE_integer('batch', 8, 'Sequences per step.')
_SEQ_LEN = flags.DEFINE_integer('seq_len', 1024, 'Tokens per sequence.')
_STEPS = flags.DEFINE_integer('steps', 20, 'Timed steps (the symbolic kind times at most --max_seconds).')
_MAX_SECONDS = flags.DEFINE_float('max_seconds', 60.0, 'Stop timing a kind after this many seconds.')
_CHUNK = flags.DEFINE_integer('chunk', 2048, 'Vocabulary rows per streamed step.')
_PEAK = flags.DEFINE_float('peak_tflops', 989.4, 'Device peak dense bfloat16 TFLOP/s (H100 SXM: 989.4).')
_PROJ_TOKENS = flags.DEFINE_integer('projection_tokens', 4096, 'Tokens for the projection comparison.')
_JSON = flags.DEFINE_string('json', 'accelerator.json', 'Where to write the results.')
_CHILD = flags.DEFINE_string('child', '', 'Internal: measure one kind and print its JSON.')

VOCAB = 50257


def model_config(name: str):
  kind, _, readout = name.partition(':')
  config = config_lib.default_config(kind, 'paper')
  config.model.max_len = _SEQ_LEN.value
  config.model.dtype = 'bfloat16'
  config.model.vocab_projection = 'streamed'
  config.model.vocab_chunk_size = _CHUNK.value
  config.readout = readout or 'streamed'
  config.batch_size = _BATCH.value
  return config, config_lib.model_config(config, VOCAB, causal=True)


def measure_kind(name: str) -> dict:
  config, cfg = model_config(name)
  mesh = jax.make_mesh((1, 1), ('data', 'vocab'), devices=jax.devices()[:1],
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  b, t = _BATCH.value, _SEQ_LEN.value
  with jax.set_mesh(mesh):
    model = Transformer(cfg)
    rng = jax.random.key(0)
    run = train.compile_run(model, optim.make_optimizer(config), config, rng, mesh, (), t)
    tokens = jax.random.randint(jax.random.key(1), (b, t), 0, VOCAB, jnp.int32)
    batch = {'inputs': tokens, 'targets': jnp.roll(tokens, -1, axis=1), 'weights': jnp.ones((b, t), jnp.float32),
             'key_mask': jnp.ones((b, t), bool)}
    start = time.perf_counter()
    compiled = run.train_step.lower(run.abstract_state, batch).compile()
    compile_s = time.perf_counter() - start
    analysis = compiled.memory_analysis()
    predicted = (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
                 - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    state = run.init(rng)
    for _ in range(2):  # warm-up
      state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    times = []
    begin = time.perf_counter()
    while len(times) < _STEPS.value and time.perf_counter() - begin < _MAX_SECONDS.value:
      s = time.perf_counter()
      state, metrics = compiled(state, batch)
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - s)
    stats = jax.devices()[0].memory_stats() or {}
  step_s = statistics.median(times)
  flops = 3 * forward_flops_per_token(cfg, t) * b * t
  return {'kind': name, 'parameters': int(sum(x.size for x in jax.tree.leaves(run.abstract_state.params))),
          'compile_s': compile_s, 'timed_steps': len(times), 'step_s': step_s, 'tokens_per_s': b * t / step_s,
          'model_flops_per_step': flops, 'model_tflops_per_s': flops / step_s / 1e12,
          'xla_flops_per_step': float(cost.get('flops', float('nan'))) if cost else float('nan'),
          'peak_bytes_in_use': int(stats.get('peak_bytes_in_use', -1)), 'predicted_peak_bytes': int(predicted),
          'final_loss': float(metrics['loss'])}


def matmul_tflops() -> float:
  n = 8192
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
  f = jax.jit(lambda x, y: x @ y)
  jax.block_until_ready(f(a, b))
  times = []
  for _ in range(10):
    s = time.perf_counter()
    jax.block_until_ready(f(a, b))
    times.append(time.perf_counter() - s)
  return 2 * n ** 3 / statistics.median(times) / 1e12


def projection_times() -> dict:
  """Forward + backward of one vocabulary projection, bfloat16 inputs, direct vs streamed."""
  n, h, d = _PROJ_TOKENS.value, 12, 64
  keys = jax.random.split(jax.random.key(2), 3)
  z = jax.random.normal(keys[0], (n, h, d), jnp.bfloat16)
  table = (0.3 * jax.random.normal(keys[1], (VOCAB, h, d), jnp.float32)).astype(jnp.bfloat16)
  cot = jax.random.normal(keys[2], (n, h, d), jnp.bfloat16)
  tau = jnp.ones((h,), jnp.float32)
  out = {}
  for impl in ('direct', 'streamed'):
    project = symbolic.VOCAB_PROJECTIONS[impl]
    loss = lambda z, table, tau: jnp.sum(project(z, table, tau, _CHUNK.value, None)[0].astype(jnp.float32)
                                         * cot.astype(jnp.float32))
    f = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    jax.block_until_ready(f(z, table, tau))
    times = []
    for _ in range(10):
      s = time.perf_counter()
      jax.block_until_ready(f(z, table, tau))
      times.append(time.perf_counter() - s)
    out[impl] = statistics.median(times)
  out['tokens'], out['model_tflops'] = n, 3 * 2 * 2 * n * h * VOCAB * d / 1e12
  return out


def main(_):
  if _CHILD.value:
    print('RESULT ' + json.dumps(measure_kind(_CHILD.value)), flush=True)
    return
  device = jax.devices()[0]
  print(f'device: {device.device_kind} ({jax.default_backend()}), jax {jax.__version__}', flush=True)
  rows = {}
  for kind in _KINDS.value:
    args = [sys.executable, __file__, f'--child={kind}'] + [a for a in sys.argv[1:] if not a.startswith('--json')]
    proc = subprocess.run(args, capture_output=True, text=True, env=os.environ)
    line = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')]
    if proc.returncode or not line:
      print(f'{kind}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}', flush=True)
      rows[kind] = {'kind': kind, 'error': proc.stderr[-3000:]}
      continue
    rows[kind] = json.loads(line[0][len('RESULT '):])
    print(f"{kind}: {rows[kind]['step_s'] * 1e3:.1f} ms/step", flush=True)
  peak_matmul = matmul_tflops()
  projection = projection_times()
  gib = lambda x: x / 2**30
  print(f'\n{device.device_kind}, batch {_BATCH.value} × {_SEQ_LEN.value}, |V| = {VOCAB:,}, bfloat16 compute; '
        f'8192³ bf16 matmul {peak_matmul:.0f} TFLOP/s, peak taken as {_PEAK.value} TFLOP/s')
  print('| kind | parameters | step | tokens/s | model TFLOP/s | MFU | MFU of matmul rate | peak memory used '
        '| XLA predicted | compile |')
  print('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
  for kind, r in rows.items():
    if 'error' in r:
      print(f'| {kind} | failed | | | | | | | | |')
      continue
    print(f"| {kind} | {r['parameters']:,} | {r['step_s'] * 1e3:.1f} ms | {r['tokens_per_s']:,.0f} | "
          f"{r['model_tflops_per_s']:.1f} | {100 * r['model_tflops_per_s'] / _PEAK.value:.1f}% | "
          f"{100 * r['model_tflops_per_s'] / peak_matmul:.1f}% | {gib(r['peak_bytes_in_use']):.2f} GiB | "
          f"{gib(r['predicted_peak_bytes']):.2f} GiB | {r['compile_s']:.0f} s |")
  if 'step_s' in rows.get('symbolic', {}) and 'step_s' in rows.get('token_factored', {}):
    print(f"symbolic / token_factored step = {rows['symbolic']['step_s'] / rows['token_factored']['step_s']:.1f}")
  print(f"\nvocabulary projection, forward + backward, {projection['tokens']} tokens × 12 heads × 64, "
        f"|V| = {VOCAB:,}: direct {projection['direct'] * 1e3:.1f} ms, streamed {projection['streamed'] * 1e3:.1f} ms "
        f"(streamed / direct = {projection['streamed'] / projection['direct']:.2f}; "
        f"{projection['model_tflops'] / projection['streamed']:.0f} TFLOP/s streamed)")
  with open(_JSON.value, 'w') as f:
    json.dump({'device': device.device_kind, 'jax': jax.__version__, 'batch': _BATCH.value,
               'seq_len': _SEQ_LEN.value, 'vocab': VOCAB, 'chunk': _CHUNK.value, 'peak_tflops': _PEAK.value,
               'matmul_tflops': peak_matmul, 'rows': rows, 'projection': projection,
               'command': 'python benchmarks/accelerator.py ' + ' '.join(sys.argv[1:])}, f, indent=1)
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
