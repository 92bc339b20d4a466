"""Training throughput, model FLOP utilisation and memory at GPT-2-small scale, on an accelerator.

  python -m benchmarks.speed.accelerator [--rows=standard,symbolic+cudnn+direct] [--batch=8] [--json=accelerator.json]

For standard / token_factored / symbolic: 12 layers, 12 heads × 64, |V| = 50,257, FFN 3072 (VocabFFN 256
per channel), bfloat16 compute, float32 parameters, AdamW. A row is ``KIND[+OPTION...]``; without options
the attention is the explicit one, the loss and the symbolic projections streamed (symjax's portable
defaults at this scale). Options: ``direct`` (the loss from whole logits), ``cudnn`` (cuDNN fused attention,
and for the symbolic kind the cuDNN vocabulary projection), ``pad`` (the embedding table padded to a
multiple of 128 rows, 50,304; padding rows get no probability), ``learned`` (learned positions instead of
ALiBi, the standard kind only). Five diagnostic options change what the step computes, to price a part
of it: ``lowlogits`` (the direct loss's logits written in the compute dtype instead of float32, the
statistics still summed in float32), ``twopass`` (the loss's statistics as ``readout.logit_stats`` sums
them, a pass for the maximum and one for the sum of exponentials, where a GPU step reads them in one,
``readout.loss_stats``), ``nocounts`` (``twopass`` without the two rank counts behind the logged
accuracy), ``v64`` (the causal ALiBi attention with the values and output left 64 wide while
the queries and keys carry ALiBi in 72, through JAX's cuDNN call that allows the two widths to differ;
it applies only where attention reads no key mask) and ``keymask`` (attention reads the batch's all-true
key mask, which cuDNN adds as a [batch, time, time] bias; the trainer reads none on text windows,
``symjax.train.trainer.StepOptions``).
Each row runs in its own process so that the device's peak-memory counter
belongs to it alone. Printed per row:

- steady-state tokens/s (compilation and the first steps excluded): steps run back to back and are
  synchronised once at the end, as in a training loop; the median of steps synchronised one by one is
  kept beside it (``synchronised_step_s``, the host's round trip included);
- model FLOPs per step (forward + backward = 3 × forward, counted from the shapes below; the causal
  attention is counted in full, as in the PaLM paper's MFU) and MFU = model FLOP/s ÷ the device's peak, next
  to the rate of a large bfloat16 matrix product measured in the same run;
- the peak device memory the step actually used (``memory_stats()['peak_bytes_in_use']``) next to XLA's
  compile-time prediction (arguments + outputs − donated + temporaries), and XLA's own FLOP count.

Then the vocabulary projection alone, direct vs streamed vs cuDNN, forward + backward at |V| = 50,257.
The JSON is rewritten after every row, so a run cut short keeps what it measured.
"""

import dataclasses
import gzip
import json
import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from benchmarks.lib import cli, profiling, recipe
from benchmarks.lib import results as result_files
from benchmarks.lib.flops import forward_flops_per_token
from symjax.model import Transformer, symbolic
from symjax.ops import readout as readout_ops
from symjax.train import config as config_lib
from symjax.train import optim
from symjax.train import trainer as train

_ROWS = flags.DEFINE_list('rows', ['standard', 'standard+direct', 'standard+cudnn+direct',
                                    'standard+cudnn+direct+pad', 'standard+cudnn+direct+pad+learned',
                                    'token_factored+cudnn+direct+pad', 'symbolic+cudnn+direct+pad', 'symbolic'],
                          'Rows KIND[+OPTION...]: options direct, cudnn, pad, learned (see the docstring).')
_BATCH = flags.DEFINE_integer('batch', 8, 'Sequences per step.')
_SEQ_LEN = flags.DEFINE_integer('seq_len', 1024, 'Tokens per sequence.')
_STEPS = cli.steps(20, 'Timed steps (the symbolic kind times at most --max_seconds).')
_MAX_SECONDS = flags.DEFINE_float('max_seconds', 60.0, 'Stop timing a kind after this many seconds.')
_CHUNK = flags.DEFINE_integer('chunk', 2048, 'Vocabulary rows per streamed step.')
_PEAK = flags.DEFINE_float('peak_tflops', 989.4, 'Device peak dense bfloat16 TFLOP/s (H100 SXM: 989.4).')
_PROJ_TOKENS = flags.DEFINE_integer('projection_tokens', 4096, 'Tokens for the projection comparison.')
_JSON = cli.json_output('accelerator.json')
_PROFILE_DIR = flags.DEFINE_string('profile_dir', '', 'If set: after timing, 3 steps of each row are traced '
                                    '(jax.profiler, Perfetto JSON) and their GPU kernels summed by name.')
_PROFILE_TOP = flags.DEFINE_integer('profile_top', 25, 'Kernels listed per row with --profile_dir.')
_HLO_DIR = flags.DEFINE_string('hlo_dir', '', "If set: each row's optimised HLO, gzipped, is written there.")
_PROJECTION = flags.DEFINE_bool('projection', True, 'Also time the vocabulary projection alone.')
_CHILD = flags.DEFINE_string('child', '', 'Internal: measure one kind and print its JSON.')

VOCAB = 50257


OPTIONS = ('direct', 'cudnn', 'pad', 'learned', 'lowlogits', 'nocounts', 'twopass', 'v64', 'keymask')


def model_config(name: str):
  kind, *options = name.split('+')
  unknown = sorted(set(options) - set(OPTIONS))
  if unknown:
    raise ValueError(f'row {name!r}: unknown option(s) {unknown}; allowed: {list(OPTIONS)}')
  config = config_lib.default_config(kind, 'paper')
  config.model.max_len = _SEQ_LEN.value
  config.model.dtype = 'bfloat16'
  config.model.vocab_projection = 'cudnn' if 'cudnn' in options else 'streamed'
  config.model.attention_impl = 'cudnn' if 'cudnn' in options else 'explicit'
  config.model.vocab_chunk_size = _CHUNK.value
  config.model.vocab_pad_multiple = 128 if 'pad' in options else 1
  config.model.positions = 'learned' if 'learned' in options else 'alibi'
  config.readout = 'direct' if 'direct' in options else 'streamed'
  config.batch_size = _BATCH.value
  return config, config_lib.model_config(config, VOCAB, causal=True)


def apply_diagnostics(name: str) -> dict | None:
  """Sets the diagnostic options on the modules before the step is traced (child process only); for `v64`,
  returns its check against symjax's attention."""
  _, *options = name.split('+')
  if 'lowlogits' in options:
    def compute_dtype_logits(h, table, num_valid):
      scores = jnp.einsum('nd,vd->nv', h, table, preferred_element_type=h.dtype)
      if num_valid is not None and num_valid < table.shape[0]:
        scores = jnp.where(jnp.arange(table.shape[0]) < num_valid, scores, jnp.finfo(h.dtype).min)
      return scores

    readout_ops._valid_logits = compute_dtype_logits
  if {'lowlogits', 'nocounts', 'twopass'} & set(options):
    chosen = readout_ops.loss_stats

    def stats(logits, targets):
      logits = logits.astype(jnp.float32)
      if 'twopass' in options or 'nocounts' in options:
        loss, argmax, above, tied, lse = readout_ops.two_pass_stats(logits, targets)
        if 'nocounts' in options:  # the counts read as 'the target is the argmax', at no cost
          above, tied = jnp.zeros_like(above), jnp.ones_like(tied)
        return loss, argmax, above, tied, lse
      return chosen(logits, targets)  # lowlogits alone: the platform's own sums

    readout_ops.loss_stats = stats
  if 'v64' in options:
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_attention

    from symjax.model import attention as attention_module
    from symjax.ops import attention as attention_ops
    fused = attention_module.fused_attention

    def values_at_width(q, k, v, bias, static, key_mask, implementation, slopes=None):
      time = q.shape[1]
      causal = np.array_equal(static, np.tril(np.ones((1, time, k.shape[1]), bool)))
      if implementation != 'cudnn' or slopes is None or bias is not None or key_mask is not None or not causal:
        return fused(q, k, v, bias, static, key_mask, implementation, slopes)
      wide_q, wide_k, _ = attention_ops.alibi_in_products(q, k, v, slopes)
      return cudnn_attention.dot_product_attention(
          wide_q, wide_k, v.astype(q.dtype), scale=1.0 / np.sqrt(q.shape[-1]),
          mask_type=cudnn_attention.MaskType.CAUSAL, qkv_layout='BTNH')

    attention_module.fused_attention = values_at_width
    return check_against(fused, values_at_width)
  return None


def check_against(reference, variant) -> dict:
  """Relative L2 distance of a diagnostic attention's output and gradients from symjax's own, bfloat16
  inputs at the benchmark's head shape, causal ALiBi with the reference slopes."""
  b, t, h, d = 2, _SEQ_LEN.value, 12, 64
  keys = jax.random.split(jax.random.key(3), 4)
  q, k, v, cot = (jax.random.normal(key, (b, t, h, d), jnp.bfloat16) for key in keys)
  slopes = jnp.asarray(2.0 ** (-8.0 * np.arange(1, h + 1) / h), jnp.float32)
  static = np.tril(np.ones((1, t, t), bool))

  def grads(fn):
    loss = lambda q, k, v, slopes: jnp.sum(fn(q, k, v, None, static, None, 'cudnn', slopes).astype(jnp.float32)
                                           * cot.astype(jnp.float32))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, slopes)

  (ref_value, ref_grads), (value, got) = grads(reference), grads(variant)
  rel = lambda a, b: float(jnp.linalg.norm((a - b).astype(jnp.float32)) / jnp.linalg.norm(b.astype(jnp.float32)))
  return {'loss': rel(value, ref_value), **{name: rel(a, b) for name, a, b in zip(('dq', 'dk', 'dv', 'dslopes'),
                                                                                   got, ref_grads)}}


def measure_kind(name: str) -> dict:
  config, cfg = model_config(name)
  check = apply_diagnostics(name)
  mesh = jax.make_mesh((1, 1), ('data', 'vocab'), devices=jax.devices()[:1],
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  b, t = _BATCH.value, _SEQ_LEN.value
  with jax.set_mesh(mesh):
    model = Transformer(cfg)
    rng = jax.random.key(0)
    options = dataclasses.replace(recipe.text_options(config), key_mask='keymask' in name.split('+'))
    run = train.compile_run(model, optim.make_optimizer(config), options, rng, mesh, (), t)
    tokens = jax.random.randint(jax.random.key(1), (b, t), 0, VOCAB, jnp.int32)
    batch = {'inputs': tokens, 'targets': jnp.roll(tokens, -1, axis=1), 'weights': jnp.ones((b, t), jnp.float32),
             'key_mask': jnp.ones((b, t), bool)}
    start = time.perf_counter()
    compiled = run.train_step.lower(run.abstract_state, batch).compile()
    compile_s = time.perf_counter() - start
    if _HLO_DIR.value:
      os.makedirs(_HLO_DIR.value, exist_ok=True)
      with gzip.open(os.path.join(_HLO_DIR.value, name.replace('+', '_') + '.hlo.txt.gz'), 'wt') as f:
        f.write(compiled.as_text())
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
    # Back to back, synchronised once at the end, as a training loop runs between two logged steps: the
    # host dispatches step n+1 while the device runs step n.
    pipelined = max(1, len(times))
    s = time.perf_counter()
    for _ in range(pipelined):
      state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    pipelined_s = (time.perf_counter() - s) / pipelined
    stats = jax.devices()[0].memory_stats() or {}
    kernels = None
    if _PROFILE_DIR.value:
      holder = [state]  # the step donates its state: each traced step feeds the next

      def step():
        holder[0], out = compiled(holder[0], batch)
        return out

      kernels = profile_kernels(step, name)
  step_s = pipelined_s
  flops = 3 * forward_flops_per_token(cfg, t) * b * t
  return {'kind': name, 'parameters': int(sum(x.size for x in jax.tree.leaves(run.abstract_state.params))),
          'compile_s': compile_s, 'timed_steps': len(times), 'step_s': step_s,
          'synchronised_step_s': statistics.median(times), 'tokens_per_s': b * t / step_s,
          'model_flops_per_step': flops, 'model_tflops_per_s': flops / step_s / 1e12,
          'xla_flops_per_step': float(cost.get('flops', float('nan'))) if cost else float('nan'),
          'peak_bytes_in_use': int(stats.get('peak_bytes_in_use', -1)), 'predicted_peak_bytes': int(predicted),
          'final_loss': float(metrics['loss']), **({'kernels': kernels} if kernels else {}),
          **({'check_against_symjax_attention': check} if check else {})}


def profile_kernels(step, name: str) -> dict:
  """The device's kernels and XLA ops by time per step (``profiling.profile_ops``)."""
  return profiling.profile_ops(step, os.path.join(_PROFILE_DIR.value, name.replace('+', '_')), 'GPU',
                               top=_PROFILE_TOP.value)


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
  impls = ('direct', 'streamed', 'cudnn') if jax.default_backend() == 'gpu' else ('direct', 'streamed')
  for impl in impls:
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

  def write(extra=None):
    result_files.write(_JSON.value, {'device': device.device_kind, 'jax': jax.__version__, 'batch': _BATCH.value,
                 'seq_len': _SEQ_LEN.value, 'vocab': VOCAB, 'chunk': _CHUNK.value, 'peak_tflops': _PEAK.value,
                 'rows': rows, **(extra or {}),
                 'command': 'python -m benchmarks.speed.accelerator ' + ' '.join(sys.argv[1:])})

  for kind in _ROWS.value:
    model_config(kind)  # a bad row is an error before anything runs
  for kind in _ROWS.value:
    args = [sys.executable, __file__, f'--child={kind}'] + [a for a in sys.argv[1:] if not a.startswith('--json')]
    proc = subprocess.run(args, capture_output=True, text=True, env=os.environ)
    line = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')]
    if proc.returncode or not line:
      print(f'{kind}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}', flush=True)
      rows[kind] = {'kind': kind, 'error': proc.stderr[-3000:]}
      continue
    rows[kind] = json.loads(line[0][len('RESULT '):])
    print(f"{kind}: {rows[kind]['step_s'] * 1e3:.1f} ms/step", flush=True)
    write()
  peak_matmul = matmul_tflops()
  projection = projection_times() if _PROJECTION.value else {}
  gib = lambda x: x / 2**30
  print(f'\n{device.device_kind}, batch {_BATCH.value} × {_SEQ_LEN.value}, |V| = {VOCAB:,}, bfloat16 compute; '
        f'8192³ bf16 matmul {peak_matmul:.0f} TFLOP/s, peak taken as {_PEAK.value} TFLOP/s')
  print('| kind | parameters | step | step, synchronised | tokens/s | model TFLOP/s | MFU | MFU of matmul rate | peak memory used '  # noqa: E501
        '| XLA predicted | compile |')
  print('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
  for kind, r in rows.items():
    if 'error' in r:
      print(f'| {kind} | failed | | | | | | | | | |')
      continue
    print(f"| {kind} | {r['parameters']:,} | {r['step_s'] * 1e3:.1f} ms | {r['synchronised_step_s'] * 1e3:.1f} ms | "
          f"{r['tokens_per_s']:,.0f} | "
          f"{r['model_tflops_per_s']:.1f} | {100 * r['model_tflops_per_s'] / _PEAK.value:.1f}% | "
          f"{100 * r['model_tflops_per_s'] / peak_matmul:.1f}% | {gib(r['peak_bytes_in_use']):.2f} GiB | "
          f"{gib(r['predicted_peak_bytes']):.2f} GiB | {r['compile_s']:.0f} s |")
  fastest = lambda kind: min((r['step_s'] for k, r in rows.items() if k.split('+')[0] == kind and 'step_s' in r),
                             default=None)
  if fastest('symbolic') and fastest('token_factored'):
    print(f"symbolic / token_factored step (fastest row of each) = "
          f"{fastest('symbolic') / fastest('token_factored'):.1f}")
  for kind, r in rows.items():
    if 'kernels' in r:
      profiling.print_profile(kind, r['step_s'] * 1e3, r['kernels'])
  if not projection:
    write({'matmul_tflops': peak_matmul})
    return
  print(f"\nvocabulary projection, forward + backward, {projection['tokens']} tokens × 12 heads × 64, "
        f"|V| = {VOCAB:,}: " + ', '.join(f"{impl} {projection[impl] * 1e3:.1f} ms "
                                         f"({projection['model_tflops'] / projection[impl]:.0f} TFLOP/s)"
                                         for impl in ('direct', 'streamed', 'cudnn') if impl in projection))
  write({'matmul_tflops': peak_matmul, 'projection': projection})
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
