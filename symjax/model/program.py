"""Program training's weights ("Learning Transformer Programs" §3): the straight-through argmax, Gumbel
sampling of it while training, and the 0/1 predicates of numerical heads. The attention and the vocabulary
projections apply them to the soft weights they compute; evaluation and the decompiled program take the
noiseless argmax.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


def straight_through(weights: Array) -> Array:
  """One-hot at the argmax of ``weights`` over the last axis in the forward pass, with the gradient of
  ``weights`` (the straight-through estimator). Ties go to the first index, as NumPy's argmax does."""
  hard = jax.nn.one_hot(jnp.argmax(weights, -1), weights.shape[-1], dtype=weights.dtype)
  return weights + jax.lax.stop_gradient(hard - weights)


# The random stream of program training's Gumbel noise (``model.gumbel_scale``): the train step passes it,
# evaluation does not, so evaluation and the decompiled program take the noiseless argmax.
GUMBEL_RNG = 'gumbel'


def gumbel_perturbed(weights: Array, key: Array, scale: Any) -> Array:
  """softmax(log weights + scale·g), g standard Gumbel noise: its argmax is a sample from ``weights``
  sharpened to temperature ``scale`` (the Gumbel-max trick; scale 1 samples ``weights`` itself), and it is
  the soft weights whose gradient the straight-through estimate takes ("Learning Transformer Programs" §3.2,
  after Jang et al.'s Gumbel-softmax). Zero weights (masked keys, padding rows) stay zero."""
  live = weights > 0
  # log of 1 where a weight is 0, so that no gradient passes through log 0; a finite floor where -inf would
  # make a row with no live weight (a padding query) NaN.
  logits = jnp.log(jnp.where(live, weights, 1.0))
  noisy = logits + scale * jax.random.gumbel(key, weights.shape, logits.dtype)
  return jax.nn.softmax(jnp.where(live, noisy, jnp.finfo(logits.dtype).min), -1)


def sampling(module: nn.Module) -> bool:
  """Whether a hard module samples its argmaxes in this call: it has a Gumbel scale (a float, or the
  trainer's annealed value, traced) and the GUMBEL_RNG stream (passed by the train step only)."""
  return module.hard and module.gumbel_scale is not None and module.has_rng(GUMBEL_RNG)


def predicate_weights(scores: Array, allowed: Array, hard: bool, key: Array | None = None,
                      scale: Any = 0.0) -> Array:
  """The weights of a numerical head, S_ij: 1 for every allowed key whose score is above 0 (a learned
  predicate), 0 elsewhere ("Learning Transformer Programs"' numerical attention, which sums where softmax
  attention averages). ``hard=False`` gives the soft version, sigmoid(score) in place of the 0/1 predicate;
  ``hard=True`` the 0/1 one in the forward pass with the soft one's gradient. With ``key``, the score is
  perturbed by ``scale`` times logistic noise first (the difference of two Gumbels: an entry-wise
  Gumbel-sigmoid, the form that paper names for predicates with several keys per query).
  scores, allowed: ``[..., q_time, k_time]`` (allowed broadcastable)."""
  allowed = jnp.broadcast_to(allowed, scores.shape)
  if key is not None:
    scores = scores + scale * jax.random.logistic(key, scores.shape, scores.dtype)
  soft = jnp.where(allowed, jax.nn.sigmoid(jnp.where(allowed, scores, 0.0)), 0.0)
  if not hard:
    return soft
  chosen = (allowed & (scores > 0)).astype(soft.dtype)
  return soft + jax.lax.stop_gradient(chosen - soft)


def weights(module: nn.Module, soft: Array, scores: Array, mask: Array, v: Array) -> tuple[Array, Array]:
  """An attention module's weights ``[batch, heads, q, k]`` under program training: the argmax of ``soft``
  (``module.hard``; sampled with Gumbel noise while training), and for the last ``module.numerical_heads``
  heads the 0/1 predicate of ``scores`` with the value 1 (such a head outputs n = Σ_j S_ij, the number of
  keys it selects: RASP's selector_width, on every dimension). Unchanged weights and values otherwise."""
  if not (module.hard or module.numerical_heads):
    return soft, v
  noise = sampling(module)
  if module.numerical_heads:
    keys = jax.random.split(module.make_rng(GUMBEL_RNG)) if noise else (None, None)
  else:
    keys = (module.make_rng(GUMBEL_RNG) if noise else None, None)
  out = gumbel_perturbed(soft, keys[0], module.gumbel_scale) if noise else soft
  out = straight_through(out) if module.hard else out
  if module.numerical_heads:
    first = module.num_heads - module.numerical_heads
    allowed = jnp.broadcast_to(mask, scores.shape)[:, first:]
    counts = predicate_weights(scores[:, first:], allowed, module.hard, keys[1], module.gumbel_scale)
    out = jnp.concatenate([out[:, :first], counts], axis=1)
    v = v.at[:, :, first:].set(1.0)
  return out, v
