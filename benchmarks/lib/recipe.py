"""The compiled training step of one model kind at the text recipe, on random tokens, for the CPU benchmarks
(benchmarks/speed/throughput.py): `configs/<kind>.py:task=text,size=medium`
(4 layers, 4 heads × 32, context 64, batch 12), |V| = 65 as for Tiny Shakespeare, float32, one device."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

import symjax.configs as configs
from symjax.model import ModelConfig, Transformer
from symjax.tasks.text import TextTask
from symjax.train import config as config_lib
from symjax.train import optim
from symjax.train import trainer as train


@dataclasses.dataclass
class RecipeStep:
  cfg: ModelConfig
  step: Callable      # compiled: (state, data) -> (state, metrics); the state is donated
  state: Any          # the initial training state
  data: dict          # one batch, reused by every step
  parameters: int
  compile_s: float


def text_options(config) -> train.StepOptions:
  """The step options the trainer uses on the text task (``StepOptions.of(config, task)``), without
  building one: whether attention reads the key mask comes from ``TextTask.pads_inputs``."""
  return dataclasses.replace(train.StepOptions.of(config), key_mask=TextTask.pads_inputs)


def compile_recipe_step(kind: str, vocab: int = 65) -> RecipeStep:
  config = configs.from_file(f'{kind}:task=text,size=medium')
  config.data_seed = 0
  cfg = config_lib.model_config(config, vocab, causal=True)
  batch, seq_len = config.batch_size, config.seq_len
  mesh = jax.make_mesh((1, 1), ('data', 'vocab'), devices=jax.devices()[:1],
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  with jax.set_mesh(mesh):
    run = train.compile_run(Transformer(cfg), optim.make_optimizer(config), text_options(config),
                            jax.random.key(0), mesh, (), seq_len)
    tokens = jax.random.randint(jax.random.key(1), (batch, seq_len + 1), 0, vocab, jnp.int32)
    data = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:], 'weights': jnp.ones((batch, seq_len), jnp.float32),
            'key_mask': jnp.ones((batch, seq_len), bool)}
    start = time.perf_counter()
    step = run.train_step.lower(run.abstract_state, data).compile()
    compile_s = time.perf_counter() - start
    state = run.init(jax.random.key(0))
  return RecipeStep(cfg, step, state, data, int(sum(x.size for x in jax.tree.leaves(run.abstract_state.params))),
                    compile_s)
