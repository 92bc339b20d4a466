"""The vocabulary projection softmax(z E^(h)ᵀ/τ) E^(h), direct vs streamed: memory and CPU time.

  python -m benchmarks.speed.vocab_projection [--json=vocab_projection.json] [--chunk=512]

(a) Compiled temporary memory (XLA's memory analysis; nothing is run or allocated) of one projection,
    forward + backward (gradients of z, E and τ), at the paper's size: T = 2048 tokens, H = 12,
    d_head = 64, |V| = 50,257 — and the streamed one at |V| = 200,000.
(b) Time of forward + backward on this machine at a size where the direct one fits (median of repeats),
    and the streamed projection's achieved FLOP/s — 14·N·H·V·d per call (forward 4, backward with
    recomputation 10) — as a fraction of a large float32 matrix product's FLOP/s in the same run.
"""

import statistics
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from benchmarks.lib import cli
from benchmarks.lib import results as result_files
from symjax.model import symbolic

_JSON = cli.json_output('vocab_projection.json')
_CHUNK = flags.DEFINE_integer('chunk', 512, 'Vocabulary rows per streamed step.')
_REPEATS = cli.repeats(9, 'Timed repeats (after one warm-up).')
_TIME_TOKENS = flags.DEFINE_integer('time_tokens', 512, 'Tokens for the timing comparison.')
_TIME_VOCAB = flags.DEFINE_integer('time_vocab', 8192, 'Vocabulary for the timing comparison.')

HEADS, HEAD_DIM = 12, 64


def fwd_bwd(impl: str, chunk: int):
  """(z, table, tau, cotangent) -> gradients of <projection, cotangent> w.r.t. z, table and tau."""
  project = symbolic.VOCAB_PROJECTIONS[impl]

  def loss(z, table, tau, cotangent):
    out, _ = project(z, table, tau, chunk, None)
    return jnp.sum(out * cotangent)

  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def args(tokens: int, vocab: int, concrete: bool = False):
  shapes = [(tokens, HEADS, HEAD_DIM), (vocab, HEADS, HEAD_DIM), (HEADS,), (tokens, HEADS, HEAD_DIM)]
  if not concrete:
    return [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
  keys = jax.random.split(jax.random.key(0), 4)
  z, table, _, cot = (jax.random.normal(k, s, jnp.float32) for k, s in zip(keys, shapes))
  return [z, table * 0.3, jnp.ones((HEADS,), jnp.float32), cot]


def temp_bytes(impl: str, tokens: int, vocab: int, chunk: int) -> int:
  compiled = fwd_bwd(impl, chunk).lower(*args(tokens, vocab)).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes)


def time_call(f, *a) -> float:
  jax.block_until_ready(f(*a))
  times = []
  for _ in range(_REPEATS.value):
    start = time.perf_counter()
    jax.block_until_ready(f(*a))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main(_):
  chunk = _CHUNK.value
  gb = lambda b: b / 2**30
  memory = {
      'direct_50257': temp_bytes('direct', 2048, 50257, chunk),
      'streamed_50257': temp_bytes('streamed', 2048, 50257, chunk),
      'streamed_200000': temp_bytes('streamed', 2048, 200000, chunk),
  }
  print(f'(a) compiled temporaries, forward + backward, T=2048, H={HEADS}, d_head={HEAD_DIM}, chunk={chunk}')
  print('| projection | vocabulary | temporaries |')
  print('|---|---:|---:|')
  for key, value in memory.items():
    impl, vocab = key.split('_')
    print(f'| {impl} | {int(vocab):,} | {gb(value):.3f} GiB |')
  ratio = memory['direct_50257'] / memory['streamed_50257']
  growth = memory['streamed_200000'] / memory['streamed_50257'] - 1
  print(f'direct / streamed = {ratio:.1f}x; streamed growth from 50,257 to 200,000: {100 * growth:+.1f}%')

  n, v = _TIME_TOKENS.value, _TIME_VOCAB.value
  concrete = args(n, v, concrete=True)
  times = {impl: time_call(fwd_bwd(impl, chunk), *concrete) for impl in ('direct', 'streamed')}
  size = 2048
  a = jax.random.normal(jax.random.key(1), (size, size), jnp.float32)
  matmul_time = time_call(jax.jit(lambda x: x @ x), a)
  matmul_flops = 2 * size ** 3 / matmul_time
  streamed_flops = 14 * n * HEADS * v * HEAD_DIM / times['streamed']
  print(f'\n(b) forward + backward time on this machine, N={n}, V={v}, H={HEADS}, d_head={HEAD_DIM}')
  print('| projection | time | GFLOP/s (14·N·H·V·d) |')
  print('|---|---:|---:|')
  for impl, t in times.items():
    print(f'| {impl} | {1e3 * t:.1f} ms | {14 * n * HEADS * v * HEAD_DIM / t / 1e9:.1f} |')
  print(f'| {size}² float32 matmul | {1e3 * matmul_time:.1f} ms | {matmul_flops / 1e9:.1f} |')
  print(f"streamed / direct time = {times['streamed'] / times['direct']:.2f}; streamed FLOP/s = "
        f'{100 * streamed_flops / matmul_flops:.0f}% of the matmul')

  result_files.write(_JSON.value, {'device': str(jax.devices()[0]), 'chunk': chunk, 'temp_bytes': memory,
               'direct_over_streamed': ratio, 'streamed_growth_50k_to_200k': growth,
               'time_tokens': n, 'time_vocab': v, 'seconds': times, 'matmul_seconds': matmul_time,
               'streamed_flops': streamed_flops, 'matmul_flops': matmul_flops,
               'streamed_over_direct_time': times['streamed'] / times['direct'],
               'streamed_flops_fraction': streamed_flops / matmul_flops})
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
