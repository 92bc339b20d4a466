"""A dense layer's product, x W or x W + b, and the products its backward pass computes.

Shapes: x ``[..., in]``; kernel ``[in, out]``; bias ``[out]``.

On the CPU backend both backward passes hand XLA products of untransposed operands: xᵀ and Wᵀ are made first,
behind an optimisation barrier. Why: without it XLA folds the transpose into the product that reads it, and
XLA:CPU's YNNPACK then either runs a transposed operand inside its fusion, which gains little from a second
core, or rejects it and leaves the product to Eigen; the copy and a plain product take less time together
(measured in ``benchmarks/results/plain_operand_products_amd.json``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def product(x: Array, kernel: Array) -> Array:
  """x W over x's last axis, both in one dtype. On the CPU backend its backward pass is
  ``plain_operand_product``'s; elsewhere autodiff's."""
  if jax.default_backend() == 'cpu':
    return plain_operand_product(x, kernel)
  return jnp.dot(x, kernel)


def _transposed(*arrays: Array) -> tuple[Array, ...]:
  """The matrices transposed, as copies XLA does not fold into the products that read them."""
  return jax.lax.optimization_barrier(tuple(a.T for a in arrays))


@jax.custom_vjp
def plain_operand_product(x: Array, kernel: Array) -> Array:
  """x W whose backward pass computes dx = dy Wᵀ and dW = xᵀ dy from copies of Wᵀ and xᵀ (the module's
  docstring says why). The same gradients as autodiff's, to rounding."""
  return jnp.dot(x, kernel)


def _plain_fwd(x, kernel):
  return plain_operand_product(x, kernel), (x, kernel)


def _plain_bwd(res, dy):
  x, kernel = res
  rows, dy_rows = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
  rows_t, kernel_t = _transposed(rows, kernel)
  dx = jnp.dot(dy_rows, kernel_t, preferred_element_type=jnp.float32).astype(x.dtype).reshape(x.shape)
  dw = jnp.dot(rows_t, dy_rows, preferred_element_type=jnp.float32).astype(kernel.dtype)
  return dx, dw


plain_operand_product.defvjp(_plain_fwd, _plain_bwd)


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
  of ones beside x, that product yields db as one more row. dx = dy Wᵀ reads a copy of Wᵀ (the module's
  docstring says why). The sum is the same, in the product's order instead of the reduction's.
  """
  return jnp.dot(x, kernel) + bias


def _fwd(x, kernel, bias):
  return bias_gradient_in_product(x, kernel, bias), (x, kernel)


def _bwd(res, dy):
  x, kernel = res
  rows = x.reshape(-1, x.shape[-1])
  with_ones = jnp.concatenate([rows, jnp.ones((rows.shape[0], 1), rows.dtype)], -1)
  both = jnp.einsum('mk,mn->kn', with_ones, dy.reshape(-1, dy.shape[-1]), preferred_element_type=jnp.float32)
  (kernel_t,) = _transposed(kernel)
  dx = jnp.einsum('...n,nk->...k', dy, kernel_t, preferred_element_type=jnp.float32).astype(x.dtype)
  return dx, both[:-1].astype(kernel.dtype), both[-1].astype(kernel.dtype)


bias_gradient_in_product.defvjp(_fwd, _bwd)
