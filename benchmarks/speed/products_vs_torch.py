"""The standard model's matrix products one by one, XLA:CPU against PyTorch, on this machine's CPU.

  python -m benchmarks.speed.products_vs_torch [--json=benchmarks/results/products_vs_torch.json]
  (PyTorch from the `bench` extra)

For each product of the standard model at the text recipe (benchmarks/lib/flops.py: batch 12 × 64 tokens,
width 128, 4 heads × 32, FFN 512, |V| = 65) and each of its three forms (the forward product, the gradient
of its left operand, the gradient of its right one), the median time of one product: XLA runs --copies
independent copies in one jitted function (as a step would give it independent work), PyTorch runs the same
copies one after another on --threads threads. Then the per-step total, each product counted as often as the
step holds it, for each library and with each product at the faster library's time: the floor the products
alone put under a step on this CPU, whichever library computes them. XLA:CPU's compiler flags are the
trainer's (symjax.system.host); --xla_flags adds more, to try XLA's product libraries. Timings, not trained
models: one run, no seeds.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

_JSON = flags.DEFINE_string('json', 'benchmarks/results/products_vs_torch.json', 'Where to write the results.')
_COPIES = flags.DEFINE_integer('copies', 16, 'Independent copies of each product per timed call.')
_CALLS = flags.DEFINE_integer('calls', 30, 'Timed calls (the median is reported).')
_THREADS = flags.DEFINE_integer('threads', 0, "PyTorch's threads (0: the cores this process may run on).")
_XLA_FLAGS = flags.DEFINE_string('xla_flags', '', 'Extra XLA_FLAGS for this run.')


def main(_):
  if _XLA_FLAGS.value:
    os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {_XLA_FLAGS.value}".strip()
  from symjax.system import host
  host.set_cpu_compiler_defaults()
  import jax
  import jax.numpy as jnp
  import numpy as np
  try:
    import torch
  except ImportError:
    sys.exit("error: PyTorch is not installed; pip install -e '.[bench]' --extra-index-url "
             "https://download.pytorch.org/whl/cpu")
  from benchmarks.lib import results as result_files
  from benchmarks.lib.flops import products
  from benchmarks.lib.timing import median_seconds
  from symjax.train import config as config_lib

  threads = _THREADS.value or len(os.sched_getaffinity(0))
  torch.set_num_threads(threads)
  config = config_lib.from_file('standard:task=text,size=medium')
  cfg = config_lib.model_config(config, 65, causal=True)
  batch, seq_len = config.batch_size, config.seq_len
  d, f, h, dh, t = cfg.d_model, cfg.ff_dim, cfg.num_heads, cfg.head_dim, seq_len
  names = {(1, t, d, d): 'q, k, v, o', (1, t, d, f): 'ffn in', (1, t, f, d): 'ffn out',
           (1, t, d, cfg.vocab_size): 'readout', (h, t, dh, t): 'q kᵀ', (h, t, t, dh): 'weights v'}
  counts: dict[tuple, int] = {}
  for b, m, k, n, per_sequence in products(cfg, seq_len):
    shape = (b * batch, m, k, n) if per_sequence else (b, m * batch, k, n)
    counts[(names[(b, m, k, n)], shape)] = counts.get((names[(b, m, k, n)], shape), 0) + 1

  def median_us(fn) -> float:  # one product: the median call over the copies it runs
    return 1e6 * median_seconds(fn, steps=1, repeats=_CALLS.value) / _COPIES.value

  rng = np.random.default_rng(0)
  forms = {'forward': (lambda a, w, g: a @ w, lambda a, w, g: a @ w),
           'd left': (lambda a, w, g: g @ jnp.swapaxes(w, 1, 2), lambda a, w, g: g @ w.transpose(1, 2)),
           'd right': (lambda a, w, g: jnp.swapaxes(a, 1, 2) @ g, lambda a, w, g: a.transpose(1, 2) @ g)}
  rows, total = [], {'xla': 0.0, 'torch': 0.0, 'faster_each': 0.0}
  print(f"{'product':10s} {'shape [b, m, k, n]':22s} {'form':8s} {'XLA µs':>8s} {'PyTorch µs':>10s} {'ratio':>6s}")
  for (name, (b, m, k, n)), count in counts.items():
    arrays = [[rng.standard_normal(s, np.float32) for s in ((b, m, k), (b, k, n), (b, m, n))]
              for _ in range(_COPIES.value)]
    on_jax = [[jnp.asarray(x) for x in c] for c in arrays]
    on_torch = [[torch.from_numpy(x) for x in c] for c in arrays]
    for form, (jax_fn, torch_fn) in forms.items():
      jitted = jax.jit(lambda copies, f=jax_fn: [f(*c) for c in copies])
      xla = median_us(lambda: jax.block_until_ready(jitted(on_jax)))
      peer = median_us(lambda: [torch_fn(*c) for c in on_torch])
      total['xla'] += count * xla
      total['torch'] += count * peer
      total['faster_each'] += count * min(xla, peer)
      rows.append({'product': name, 'shape': [b, m, k, n], 'form': form, 'per_step': count, 'xla_us': xla,
                   'torch_us': peer, 'xla_over_torch': xla / peer})
      print(f'{name:10s} {str([b, m, k, n]):22s} {form:8s} {xla:8.1f} {peer:10.1f} {xla / peer:6.2f}')
  print(f"per step: XLA {total['xla'] / 1e3:.2f} ms, PyTorch {total['torch'] / 1e3:.2f} ms, "
        f"ratio {total['xla'] / total['torch']:.2f}; "
        f"the faster of the two for each product {total['faster_each'] / 1e3:.2f} ms")
  result_files.write(_JSON.value, {
      'xla_flags': os.environ.get('XLA_FLAGS', ''), 'torch_threads': threads, 'copies': _COPIES.value,
      'versions': {'jax': jax.__version__, 'torch': torch.__version__},
      'per_step_ms': {name: value / 1e3 for name, value in total.items()}, 'products': rows})


if __name__ == '__main__':
  app.run(main)
