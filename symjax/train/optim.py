"""The training state and its optimiser, and the check that a config can continue a folder's optimiser state:
what the trainer and the seed trainer share."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

from symjax.model import Transformer
from symjax.run import workdir as rundir
from symjax.system.errors import InputError

# A resume under another value would train the restored parameters on other data, or with other keys.
RESUME_FIELDS = ('task', 'data_seed', 'seed')


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
  edges = jnp.zeros((1, seq_len, seq_len), jnp.int32) if model.config.attention.relational else None
  params = model.init(rng, tokens, edges=edges)['params']
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def check_continues(where: str, saved: dict, config: ml_collections.ConfigDict) -> None:
  """Refuses a config that cannot continue the checkpoints ``saved`` (their config.json) trained: another task,
  data_seed or seed, or an option that changes the optimiser state's structure (e.g. clipping switched on or
  off). ``where`` names the work directory."""
  scalar = lambda v: isinstance(v, (bool, int, float, str))
  differ = {k: (saved[k], config[k]) for k in sorted(saved)
            if k in config and scalar(saved[k]) and scalar(config[k]) and saved[k] != config[k]}
  details = lambda keys: ', '.join(f'{k}: {differ[k][0]!r} -> {differ[k][1]!r}' for k in keys)
  changed = [k for k in RESUME_FIELDS if k in differ]
  if changed:
    raise InputError(f'{where} was trained with other data or keys ({details(changed)}); resume it with its own '
                     f'values (its {rundir.CONFIG_FILE}) or choose a new --workdir')
  old = config.copy_and_resolve_references()
  with old.unlocked():
    for k, (was, _) in differ.items():
      old[k] = type(config[k])(was)
  probe = {'kernel': jax.ShapeDtypeStruct((2, 2), jnp.float32), 'scale': jax.ShapeDtypeStruct((2,), jnp.float32)}
  structure = lambda c: jax.tree.structure(jax.eval_shape(make_optimizer(c).init, probe))
  if structure(old) != structure(config):
    raise InputError(f'{where} holds checkpoints whose optimiser state this config cannot continue '
                     f'({details(differ)}); resume with the values in its {rundir.CONFIG_FILE} or choose a new '
                     f'--workdir (nothing was moved)')
