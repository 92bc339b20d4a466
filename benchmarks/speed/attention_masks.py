"""Dense against blocked attention for masks from the algebra, measured side by side in one run.

  python -m benchmarks.speed.attention_masks [--json=benchmarks/results/attention_masks.json] [--time=1024]

One attention layer's forward and backward (``symjax.attention``: the dense path, and the blocked path that
scores only the (query block, key block) pairs a static mask allows), batch 4 × ``--time`` tokens, 4 heads
× 32, ALiBi, float32. For each mask: the share of the dense scores the blocked path computes, the time of
both (median of ``--repeats`` rounds of ``--steps`` calls, compilation excluded) and their ratio.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from benchmarks.lib import cli
from benchmarks.lib import results as result_files
from benchmarks.lib.timing import median_seconds
from symjax.model import attention as attn
from symjax.model import masks
from symjax.ops import attention as attention_ops
from symjax.system import host

_JSON = cli.json_output('benchmarks/results/attention_masks.json')
_TIME = flags.DEFINE_integer('time', 1024, 'Sequence length.')
_BLOCK = flags.DEFINE_integer('block', 64, 'Block size of the blocked path.')
_STEPS = cli.steps(10, 'Calls per round.')
_REPEATS = cli.repeats(5, 'Rounds; the median is reported.')
MASKS = ('causal', 'causal & window(64)', 'causal & window(128); causal & stride(128)',
         'causal & (window(32) | stride(256))')


def timed(fn, *args) -> float:
  return median_seconds(fn, *args, steps=_STEPS.value, repeats=_REPEATS.value, warmup=1)


def main(_):
  host.prepare()
  t, heads, dim = _TIME.value, 4, 32
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(4, t, heads, dim)), jnp.float32) for _ in range(3))
  slopes = jnp.asarray(attn.alibi_slopes(heads), jnp.float32)
  distance = np.abs(np.arange(t)[:, None] - np.arange(t)[None]).astype(np.float32)
  rows = []
  for text in MASKS:
    static = masks.head_mask_matrix(masks.parse_head_masks(text, heads), t, t)
    plan = attention_ops.block_plan(static, _BLOCK.value)
    mask = jnp.asarray(static)[None]

    def dense(q, k, v):
      return attention_ops.dot_product_attention(q, k, v, -slopes[:, None, None] * distance, mask)[0]

    def blocked(q, k, v):
      return attention_ops.blocked_attention(q, k, v, slopes, plan, None)[0]

    grad = lambda f: jax.jit(jax.grad(lambda q, k, v: (f(q, k, v) ** 2).sum(), argnums=(0, 1, 2)))
    np.testing.assert_allclose(jax.jit(blocked)(q, k, v), jax.jit(dense)(q, k, v), rtol=1e-4, atol=1e-5)
    times = {'dense': timed(grad(dense), q, k, v), 'blocked': timed(grad(blocked), q, k, v)}
    rows.append({'mask': text, 'allowed_fraction': float(static.any(0).mean()),
                 'scored_fraction': plan.scored_fraction, 'dense_s': times['dense'], 'blocked_s': times['blocked'],
                 'blocked_over_dense': times['blocked'] / times['dense']})
  print(f'\n{jax.devices()[0].device_kind} ({jax.default_backend()}): one attention layer, forward + backward, '
        f'batch 4 × {t}, 4 heads × 32, block {_BLOCK.value}; median of {_REPEATS.value} rounds of {_STEPS.value}')
  print('| mask | allowed pairs | scored by blocked | dense (ms) | blocked (ms) | blocked / dense |')
  print('|---|---:|---:|---:|---:|---:|')
  for r in rows:
    print(f"| `{r['mask']}` | {100 * r['allowed_fraction']:.1f}% | {100 * r['scored_fraction']:.1f}% | "
          f"{1e3 * r['dense_s']:.1f} | {1e3 * r['blocked_s']:.1f} | {r['blocked_over_dense']:.2f}× |")
  os.makedirs(os.path.dirname(_JSON.value) or '.', exist_ok=True)
  result_files.write(_JSON.value, {'device': str(jax.devices()[0]), 'rows': rows, 'xla_flags': os.environ.get('XLA_FLAGS', ''),  # noqa: E501
               'command': 'python -m benchmarks.speed.attention_masks ' + ' '.join(sys.argv[1:])})
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
