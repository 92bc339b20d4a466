"""Run by test_sharding.py in a process with 8 simulated CPU devices: the gradient and three training steps
of a symbolic model (streamed projection and loss) on several meshes, printed as JSON for the test.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/sharded_step.py
"""

import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import symjax.configs as configs
from symjax.model import Transformer  # noqa: E402
from symjax.system import mesh as mesh_lib  # noqa: E402
from symjax.tasks.text import TextTask  # noqa: E402
from symjax.train import config as config_lib  # noqa: E402
from symjax.train import optim
from symjax.train import trainer as train

MESHES = [(1, 1), (2, 4), (1, 8)]


def main(corpus_path):
  config = config_lib.default_config('symbolic', configs.shape('tiny'))
  config.model.vocab_projection = 'streamed'
  config.model.vocab_chunk_size = 4
  config.readout = 'streamed'
  config.batch_size = 8
  task = TextTask(corpus_path, seq_len=8)
  rules = tuple(tuple(r) for r in config.sharding_rules)
  batch = task.batch('train', 0, config.batch_size, 0)
  results = {}
  for data, vocab in MESHES:
    mesh = jax.make_mesh((data, vocab), ('data', 'vocab'), devices=jax.devices()[:data * vocab],
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    # Pad the table to a multiple of 8 for every mesh, so all runs have the same parameters.
    model_config = config_lib.model_config(config, len(task.vocab), True, vocab_shards=8)
    with jax.set_mesh(mesh):
      model = Transformer(model_config)
      tx = optim.make_optimizer(config)
      rng = jax.random.key(0)
      run = train.compile_run(model, tx, train.StepOptions.of(config), rng, mesh, rules, task.seq_len)
      state = run.init(rng)
      table = state.params['embed']['embedding']
      share = table.addressable_shards[0].data.shape[0] / table.shape[0]
      on_mesh = mesh_lib.batch_putter(mesh)(batch)
      loss = lambda p: train.token_stats(model, p, on_mesh, config.readout)[0].mean()
      grads = jax.jit(jax.grad(loss), out_shardings=run.shardings.params)(state.params)
      for step in range(3):  # step 0 has learning rate 0 (warmup), so take three
        state, metrics = run.train_step(state, mesh_lib.batch_putter(mesh)(task.batch('train', step, 8, 0)))
    flat = lambda tree: {'/'.join(str(k.key) for k in path): np.asarray(x).tolist()
                         for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
    results[f'{data}x{vocab}'] = {'loss': float(metrics['loss']), 'grad_norm': float(metrics['grad_norm']),
                                  'table_share': share, 'params': flat(state.params), 'grads': flat(grads),
                                  'table_rows': int(table.shape[0]), 'vocab_size': len(task.vocab)}
  print(json.dumps(results))


if __name__ == '__main__':
  main(sys.argv[1])
