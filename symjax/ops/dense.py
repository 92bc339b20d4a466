"""A dense layer's product with its bias, x W + b, and where its backward pass sums the bias's gradient.

Shapes: x ``[..., in]``; kernel ``[in, out]``; bias ``[out]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def biased_dense(x: Array, kernel: Array, bias: Array) -> Array:
  """x W + b, all three in one dtype. On the CPU backend the bias's gradient comes out of the kernel's
  (``bias_gradient_in_product``); elsewhere autodiff sums it."""
  if jax.default_backend() == 'cpu':
    return bias_gradient_in_product(x, kernel, bias)
  return jnp.dot(x, kernel) + bias


@jax.custom_vjp
def bias_gradient_in_product(x: Array, kernel: Array, bias: Array) -> Array:
  """x W + b whose backward pass computes [dW; db] = [x, 1]ᵀ dy as one product.

  Why: db = Σ_tokens dy is a column sum, which XLA:CPU rewrites into partial sums (reduce-windows) that
  run several times slower than the product dW = xᵀ dy over the same tokens, on the same dy. With a column
  of ones beside x, that product yields db as one more row. dx is autodiff's. The sum is the same, in the
  product's order instead of the reduction's.
  """
  return jnp.dot(x, kernel) + bias


def _fwd(x, kernel, bias):
  return bias_gradient_in_product(x, kernel, bias), (x, kernel)


def _bwd(res, dy):
  x, kernel = res
  rows = x.reshape(-1, x.shape[-1])
  with_ones = jnp.concatenate([rows, jnp.ones((rows.shape[0], 1), rows.dtype)], -1)
  both = jnp.einsum('mk,mn->kn', with_ones, dy.reshape(-1, dy.shape[-1]), preferred_element_type=jnp.float32)
  dx = jnp.einsum('...n,kn->...k', dy, kernel, preferred_element_type=jnp.float32).astype(x.dtype)
  return dx, both[:-1].astype(kernel.dtype), both[-1].astype(kernel.dtype)


bias_gradient_in_product.defvjp(_fwd, _bwd)
