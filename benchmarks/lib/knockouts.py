"""The four parts benchmarks/speed/part_costs.py takes out of the standard model's step, in symjax and in the
PyTorch peer (benchmarks/speed/torch_gpt.py), and how a part's cost is read from interleaved blocks. Apart from
the script so that tests import it without the script's flags.
"""

from __future__ import annotations

import contextlib
import statistics
import types

KNOCKOUTS = ('attention core', 'FFN', 'LayerNorms', 'AdamW and metrics')
WHOLE = 'whole step'


@contextlib.contextmanager
def symjax_knockout(part: str | None):
  """Within the block, symjax's modules and step build without ``part`` (one of KNOCKOUTS; None: nothing)."""
  import flax.linen as nn
  import optax

  from symjax.model import attention, transformer
  from symjax.train import optim, trainer

  def without_core(q, k, v, bias, mask):
    return v + 0.0 * (q + k), None

  swaps = {'attention core': [(attention, 'dot_product_attention', without_core)],
           'FFN': [(transformer.MLP, '__call__', lambda self, x: x)],
           'LayerNorms': [(nn.LayerNorm, '__call__', lambda self, x, *args, **kwargs: x)],
           'AdamW and metrics': [(optim, 'make_optimizer', lambda config: optax.sgd(config.learning_rate)),
                                 (trainer, 'training_dynamics', lambda params, grads: {})],
           None: []}[part]
  saved = [(owner, name, getattr(owner, name)) for owner, name, _ in swaps]
  try:
    for owner, name, new in swaps:
      setattr(owner, name, new)
    yield
  finally:
    for owner, name, old in saved:
      setattr(owner, name, old)


def torch_block_forward(block, x, distance, future, part: str | None):
  """torch_gpt.Block.forward without ``part`` (None: the same computation as torch_gpt's)."""
  import torch.nn.functional as F
  b, t, d = x.shape
  norm = (lambda _, h: h) if part == 'LayerNorms' else (lambda ln, h: ln(h))
  q, k, v = block.qkv(norm(block.norm_attn, x)).view(b, t, 3, block.heads, d // block.heads).permute(2, 0, 3, 1, 4)
  if part == 'attention core':
    y = v + 0.0 * (q + k)
  else:
    bias = (-block.log_slope.exp()[:, None, None] * distance).masked_fill(future, float('-inf'))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
  x = x + block.out(y.transpose(1, 2).reshape(b, t, d))
  if part == 'FFN':
    return x
  return x + block.wo(F.gelu(block.wi(norm(block.norm_ffn, x)), approximate='tanh'))


def torch_model(part: str | None):
  """(model, optimizer step) of the PyTorch peer without ``part``: torch_gpt's GPT and AdamW."""
  import torch

  from benchmarks.speed import torch_gpt
  torch.manual_seed(0)
  model = torch_gpt.GPT(65)
  for block in model.blocks:
    block.forward = types.MethodType(lambda self, x, distance, future: torch_block_forward(
        self, x, distance, future, part), block)
  if part == 'LayerNorms':
    model.norm_final = torch.nn.Identity()
  if part == 'AdamW and metrics':
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    return model, opt.step
  opt = torch_gpt.adamw(model, lr=1e-3)

  def update():
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
  return model, update


def costs(blocks: dict, limit: float | None) -> dict:
  """{variant: ms per step} and {part: its cost}: medians over the blocks whose slowest round trip (each
  block's ``core_round_trip_ns``) is at most ``limit`` ns, the whole step's and the knockout's both
  (``blocks_cores_near``: how many pairs); every block when ``limit`` is None (one core: no pair to place) or
  no pair of blocks was near (then ``blocks_cores_near`` is 0)."""
  near = lambda i, name: limit is None or (blocks[name][i].get('core_round_trip_ns') or float('inf')) <= limit
  out = {'step_ms': {}, 'cost_ms': {}, 'blocks_cores_near': {}}
  for name, rows in blocks.items():
    paired = [i for i in range(len(rows)) if near(i, name) and near(i, WHOLE)]
    kept = paired or list(range(len(rows)))
    out['step_ms'][name] = statistics.median(rows[i]['ms'] for i in kept)
    out['blocks_cores_near'][name] = len(paired) if limit is not None else None
    if name != WHOLE:
      out['cost_ms'][name] = statistics.median(blocks[WHOLE][i]['ms'] - rows[i]['ms'] for i in kept)
  return out
