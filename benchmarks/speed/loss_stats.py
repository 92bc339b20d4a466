"""The direct loss's statistics summed in one read of the logits or in two, on the machine's own backend.

  python -m benchmarks.speed.loss_stats [--shapes=768x65,768x1024,4096x8192] [--rounds=3] \
      [--json=benchmarks/results/loss_stats_cpu.json]

For each shape TOKENSxVOCAB (hidden width 128, float32), the loss of ``readout.direct_readout_stats`` and its
gradient in h and the table, compiled once with ``readout.one_pass_stats`` (the maximum, the sum of
exponentials and the two rank counts merged in one reduction) and once with ``readout.two_pass_stats``
(``logit_stats``' passes), which ``readout.loss_stats`` chooses between by platform. The two are timed in
alternation, ``--rounds`` rounds of 30 calls each; the table gives the median call of every round, and the
JSON every round's median. Tests time nothing.
"""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
from absl import app, flags

from benchmarks.lib import results as result_files
from benchmarks.lib import timing
from symjax.ops import readout

_SHAPES = flags.DEFINE_list('shapes', ['768x65', '768x1024', '4096x8192'], 'TOKENSxVOCAB shapes.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Alternating rounds per shape.')
_CALLS = flags.DEFINE_integer('calls', 30, 'Timed calls per round.')
_JSON = flags.DEFINE_string('json', 'benchmarks/results/loss_stats_cpu.json', 'Where to write the results.')
WIDTH = 128
SUMS = {'one_pass': readout.one_pass_stats, 'two_pass': readout.two_pass_stats}


def compiled(sums, h, table, targets):
  """value_and_grad of ``direct_readout_stats``' summed loss with ``sums`` in its forward pass, compiled for
  the default backend (the sums are read when the step is traced)."""
  chosen = readout.loss_stats
  readout.loss_stats = sums
  try:
    return jax.jit(jax.value_and_grad(lambda h, t: jnp.sum(readout.direct_readout_stats(h, t, targets)[0]),
                                      argnums=(0, 1))).lower(h, table).compile()
  finally:
    readout.loss_stats = chosen


def main(_):
  rows = {}
  for shape in _SHAPES.value:
    tokens, vocab = (int(x) for x in shape.split('x'))
    h = jax.random.normal(jax.random.key(0), (tokens, WIDTH))
    table = jax.random.normal(jax.random.key(1), (vocab, WIDTH)) * 0.1
    targets = jax.random.randint(jax.random.key(2), (tokens,), 0, vocab)
    fns = {name: compiled(sums, h, table, targets) for name, sums in SUMS.items()}
    losses = {name: float(fn(h, table)[0]) for name, fn in fns.items()}
    rounds = {name: [] for name in SUMS}
    for _ in range(_ROUNDS.value):
      for name in SUMS:
        rounds[name].append(timing.median_seconds(fns[name], h, table, steps=1, repeats=_CALLS.value,
                                                   warmup=1))
    rows[shape] = {'tokens': tokens, 'vocab': vocab, 'width': WIDTH, 'round_median_s': rounds,
                   'summed_loss': losses}
    result_files.write(_JSON.value, {'backend': jax.default_backend(), 'calls_per_round': _CALLS.value,
                                     'rows': rows})
  print(f'{jax.default_backend()}: value and gradient of the direct loss, median call per round (ms)')
  print('| tokens x vocab | one pass | two passes | one / two |')
  print('|---|---|---|---:|')
  for shape, row in rows.items():
    one, two = row['round_median_s']['one_pass'], row['round_median_s']['two_pass']
    fmt = lambda xs: ' / '.join(f'{1e3 * x:.2f}' for x in xs)
    print(f'| {shape} | {fmt(one)} | {fmt(two)} | {statistics.median(one) / statistics.median(two):.2f} |')
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
