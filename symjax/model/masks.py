"""Attention masks as predicates on (query position i, key position j), and the algebra that names them.

Following the view of attention masks as logical constraints on index pairs (PyNeuraLogic's "Beyond
standard attention aggregation"), a mask is a boolean predicate that composes with &, | and ~.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Callable

import jax
import numpy as np

from symjax.system.errors import InputError

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Mask:
  """A predicate ``(i, j) -> bool`` saying whether query position i may attend to key position j."""

  fn: Callable[[Array, Array], Array]
  name: str

  def __call__(self, i: Array, j: Array) -> Array:
    return self.fn(i, j)

  def __and__(self, other: Mask) -> Mask:
    return Mask(lambda i, j: self(i, j) & other(i, j), f'({self.name} & {other.name})')

  def __or__(self, other: Mask) -> Mask:
    return Mask(lambda i, j: self(i, j) | other(i, j), f'({self.name} | {other.name})')

  def __invert__(self) -> Mask:
    return Mask(lambda i, j: ~self(i, j), f'~{self.name}')

  def matrix(self, q_len: int, k_len: int | None = None) -> np.ndarray:
    """The ``[q_len, k_len]`` boolean matrix of the predicate (queries and keys start at position 0), a
    NumPy constant (predicates are built from operators that NumPy evaluates at trace time)."""
    k_len = q_len if k_len is None else k_len
    i = np.arange(q_len)[:, None]
    j = np.arange(k_len)[None, :]
    return np.broadcast_to(self(i, j), (q_len, k_len))


full = Mask(lambda i, j: np.ones(np.broadcast_shapes(i.shape, j.shape), bool), 'full')
causal = Mask(lambda i, j: j <= i, 'causal')


def sliding_window(width: int) -> Mask:
  """Keys at most ``width - 1`` positions away (Sparse Transformer's local head, both directions)."""
  if width < 1:
    raise InputError(f'sliding_window width must be >= 1, got {width}')
  return Mask(lambda i, j: abs(i - j) < width, f"window({width})")


def strided(stride: int) -> Mask:
  """Keys whose distance is a multiple of ``stride`` (Sparse Transformer's strided head)."""
  if stride < 1:
    raise InputError(f'strided stride must be >= 1, got {stride}')
  return Mask(lambda i, j: (i - j) % stride == 0, f'stride({stride})')


MASK_NAMES = {'full': full, 'causal': causal}
MASK_FUNCTIONS = {'window': sliding_window, 'stride': strided}
MASK_GRAMMAR = ("names full, causal; calls window(n), stride(n) with an integer n >= 1; combined with "
                "& (and), | (or), ~ (not) and parentheses; '; ' between per-head masks")


def parse_mask(text: str) -> Mask:
  """The mask an expression of the algebra names, e.g. ``'causal & (window(8) | stride(8))'``.

  Parsed with Python's ``ast`` and evaluated over the names above only (nothing else is evaluated).
  """
  def fail(why: str):
    raise InputError(f'model.mask {text!r}: {why}; allowed: {MASK_GRAMMAR}')

  def build(node) -> Mask:
    if isinstance(node, ast.Name):
      if node.id not in MASK_NAMES:
        fail(f'unknown mask {node.id!r}')
      return MASK_NAMES[node.id]
    if isinstance(node, ast.Call):
      name = getattr(node.func, 'id', None)
      if name not in MASK_FUNCTIONS:
        fail(f'unknown mask function {ast.unparse(node.func)!r}')
      args = node.args
      if (len(args) != 1 or node.keywords or not isinstance(args[0], ast.Constant)
          or type(args[0].value) is not int or args[0].value < 1):
        fail(f'{name}() takes one integer >= 1, got {ast.unparse(node)!r}')
      return MASK_FUNCTIONS[name](args[0].value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
      left, right = build(node.left), build(node.right)
      return left & right if isinstance(node.op, ast.BitAnd) else left | right
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
      return ~build(node.operand)
    fail(f'cannot read {ast.unparse(node)!r}')

  if not isinstance(text, str) or not text.strip():
    raise InputError(f'model.mask must be a non-empty expression, got {text!r}; allowed: {MASK_GRAMMAR}')
  try:
    tree = ast.parse(text.strip(), mode='eval')
  except SyntaxError:
    fail('not an expression')
  return build(tree.body)


def parse_head_masks(text: str, num_heads: int) -> tuple[Mask, ...]:
  """One mask per head from ``'m'`` (every head) or ``'m_1; ...; m_g'`` (g divides the heads: heads
  ``[k·H/g, (k+1)·H/g)`` use m_{k+1}, as the Sparse Transformer splits its heads between patterns)."""
  parts = text.split(';')
  if any(not p.strip() for p in parts):
    raise InputError(f'model.mask {text!r}: an empty mask between semicolons; allowed: {MASK_GRAMMAR}')
  if num_heads % len(parts):
    raise InputError(f'model.mask {text!r} gives {len(parts)} per-head masks, which must divide '
                     f'model.num_heads = {num_heads}')
  masks = [parse_mask(p) for p in parts]
  return tuple(m for m in masks for _ in range(num_heads // len(parts)))


def head_mask_matrix(masks: Mask | tuple[Mask, ...], q_len: int, k_len: int) -> np.ndarray:
  """The static ``[heads or 1, q_len, k_len]`` boolean matrix of one mask or of per-head masks (NumPy, so
  that it is a trace-time constant and its block structure can be read)."""
  masks = masks if isinstance(masks, tuple) else (masks,)
  i, j = np.arange(q_len)[:, None], np.arange(k_len)[None, :]
  return np.stack([np.broadcast_to(np.asarray(m(i, j)), (q_len, k_len)) for m in masks])
