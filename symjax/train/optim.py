"""The training state and its optimiser: what the trainer, ``symjax.load`` and the seed trainer share."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

from symjax.model import Transformer


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


def learning_rate_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup from 0, then cosine decay to ``end_learning_rate_fraction`` of the peak."""
  return optax.warmup_cosine_decay_schedule(
      0.0, config.learning_rate, config.warmup_steps, config.total_steps,
      end_value=config.learning_rate * config.end_learning_rate_fraction)


# Weight decay by role, not by rank: the leaves that are matrices multiplying activations — Dense and
# attention kernels, LSTM kernels, the VocabFFN's per-channel W1_h and W2_h, an untied readout table.
# Never decayed: norms' γ/β (channel LayerNorm's are [heads, head_dim], matrices by rank only), biases
# (VocabFFN's b1/b2 too), ALiBi log-slopes, log τ, W_head (an H×H routing of channels that starts at the
# identity; decaying it shrinks every value towards zero), and the embedding table: a lookup whose rows are
# the vocabulary symbols that symbolic layers mix, and the tied readout (decaying it shrinks every mixture).
DECAYED_LEAVES = ('kernel', 'w1', 'w2', 'readout')


def decay_mask(params) -> Any:
  """True for the leaves that weight decay applies to (``DECAYED_LEAVES``), False elsewhere."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], 'key', None) in DECAYED_LEAVES, params)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """AdamW on the schedule, global-norm clipping; weight decay by role (``decay_mask``)."""
  schedule = learning_rate_schedule(config)
  adamw = optax.adamw(schedule, b1=config.adam_b1, b2=config.adam_b2,
                      weight_decay=config.weight_decay, mask=decay_mask)
  if config.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), adamw)
  return adamw


def init_state(model: Transformer, tx: optax.GradientTransformation, rng: jax.Array, seq_len: int
               ) -> TrainState:
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  # A relational model also has edge projections: initialise it on a graph with every edge present.
  edges = jnp.zeros((1, seq_len, seq_len), jnp.int32) if model.config.relational else None
  params = model.init(rng, tokens, edges=edges)['params']
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
