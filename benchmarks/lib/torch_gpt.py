"""The standard model of ``configs/standard.py:task=text,size=medium``, written in PyTorch: the peer that
``benchmarks/speed/vs_pytorch.py`` times symjax against. It does the work the symjax command does, so that
their wall times compare: the same model, optimiser, schedule, data, evaluation and checkpoints.

  pip install -e '.[bench]' --extra-index-url https://download.pytorch.org/whl/cpu
  python -c 'from benchmarks.lib import torch_gpt; torch_gpt.main()' --text_path=input.txt --workdir=/tmp/torch_gpt

(``vs_pytorch`` runs it so, as its own process, like the symjax command it times.)

- Model: pre-LayerNorm GPT, 4 layers, 4 heads × 32, FFN 512 (GELU, tanh approximation), no biases in
  attention, ALiBi with learned per-head slopes in every layer and no position embedding, final
  LayerNorm, readout tied to the token embedding; initialisation N(0, 0.02), biases 0.
- Optimiser: AdamW (β = 0.9, 0.99), weight decay 0.1 on the matrices only, global-norm clipping at 1,
  linear warmup over 100 steps to 3e-3, then cosine decay to a tenth by step 2000 (optax's
  ``warmup_cosine_decay_schedule``: the first update has learning rate 0).
- Data: one token per character; the first 90% of the corpus trains (12 random windows of 64 tokens a
  step), the next 5% validates, the last 5% tests. Every 250 steps: the validation loss on 516 fixed windows
  and a checkpoint, which it writes to ``--workdir``; at the end, the loss on each split.
- It prints the same lines as ``python -m symjax.main`` (``step N/T: loss L, R tokens/s, S s``, a line after
  the first step, a line per evaluation), which the benchmark reads.

PyTorch is a benchmark-only dependency (the ``bench`` extra); symjax never imports it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

try:
  import torch
  import torch.nn.functional as F
  from torch import nn
except ImportError:
  sys.exit(__doc__ + "\nPyTorch is not installed: pip install -e '.[bench]' --extra-index-url https://download.pytorch.org/whl/cpu")


def alibi_slopes(num_heads: int) -> list[float]:
  """The reference slopes 2^(-8k/n), k = 1..n (n a power of two, as here)."""
  return [2.0 ** (-8.0 * (k + 1) / num_heads) for k in range(num_heads)]


class Block(nn.Module):

  def __init__(self, d_model: int, heads: int, ff_dim: int):
    super().__init__()
    self.heads = heads
    self.norm_attn, self.norm_ffn = nn.LayerNorm(d_model, eps=1e-5), nn.LayerNorm(d_model, eps=1e-5)
    self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
    self.out = nn.Linear(d_model, d_model, bias=False)
    self.wi, self.wo = nn.Linear(d_model, ff_dim), nn.Linear(ff_dim, d_model)
    self.log_slope = nn.Parameter(torch.log(torch.tensor(alibi_slopes(heads))))

  def forward(self, x: torch.Tensor, distance: torch.Tensor, future: torch.Tensor) -> torch.Tensor:
    b, t, d = x.shape
    q, k, v = self.qkv(self.norm_attn(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
    bias = (-self.log_slope.exp()[:, None, None] * distance).masked_fill(future, float('-inf'))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
    return x + self.wo(F.gelu(self.wi(self.norm_ffn(x)), approximate='tanh'))


class GPT(nn.Module):

  def __init__(self, vocab: int, d_model: int = 128, layers: int = 4, heads: int = 4, ff_dim: int = 512):
    super().__init__()
    self.embed = nn.Embedding(vocab, d_model)
    self.blocks = nn.ModuleList(Block(d_model, heads, ff_dim) for _ in range(layers))
    self.norm_final = nn.LayerNorm(d_model, eps=1e-5)
    for m in self.modules():
      if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, 0.0, 0.02)
      if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)

  def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    t = tokens.shape[1]
    pos = torch.arange(t)
    distance = (pos[:, None] - pos[None, :]).abs().float()
    future = pos[None, :] > pos[:, None]
    x = self.embed(tokens)
    for block in self.blocks:
      x = block(x, distance, future)
    logits = self.norm_final(x) @ self.embed.weight.T
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def adamw(model: nn.Module, lr: float, fused: bool = True) -> torch.optim.AdamW:
  """AdamW (β = 0.9, 0.99) with weight decay 0.1 on the matrices only (not the embedding, biases, norms or
  slopes), as symjax's decay mask."""
  decayed = lambda n, p: n.endswith('weight') and p.dim() == 2 and 'embed' not in n
  groups = [{'params': [p for n, p in model.named_parameters() if decayed(n, p) == wanted], 'weight_decay': decay}
            for wanted, decay in ((True, 0.1), (False, 0.0))]
  return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), fused=fused)


def learning_rate(step: int, peak: float, warmup: int, total: int, end_fraction: float) -> float:
  if step < warmup:
    return peak * step / warmup
  cosine = 0.5 * (1 + math.cos(math.pi * min(step - warmup, total - warmup) / (total - warmup)))
  return peak * (end_fraction + (1 - end_fraction) * cosine)


def main(argv: list[str] | None = None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--text_path', required=True)
  p.add_argument('--workdir', required=True)
  p.add_argument('--steps', type=int, default=2000)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--threads', type=int, default=0, help='torch.set_num_threads; 0 keeps PyTorch\'s default')
  p.add_argument('--fused', type=int, default=1, help='AdamW with fused=True (PyTorch\'s fastest on CPU)')
  args = p.parse_args(argv)
  if args.threads:
    torch.set_num_threads(args.threads)
  torch.manual_seed(args.seed)
  seq_len, batch, log_every, eval_every, eval_windows = 64, 12, 50, 250, 512

  with open(args.text_path, encoding='utf-8') as f:
    text = f.read()
  vocab = sorted(set(text))
  index = {c: i for i, c in enumerate(vocab)}
  ids = np.array([index[c] for c in text], np.int64)
  cut, held_out = int(0.9 * len(ids)), int(0.95 * len(ids))
  streams = {'train': ids[:cut], 'validation': ids[cut:held_out], 'test': ids[held_out:]}

  def windows(split: str, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.from_numpy(np.stack([streams[split][s:s + seq_len + 1] for s in starts]))
    return w[:, :-1], w[:, 1:]

  rng = np.random.default_rng(args.seed)
  count = -(-eval_windows // batch) * batch
  eval_starts = {s: np.random.default_rng([args.seed, i]).integers(0, len(streams[s]) - seq_len, count)
                 for i, s in enumerate(streams)}

  model = GPT(len(vocab))
  opt = adamw(model, lr=0.0, fused=bool(args.fused))
  print(f'torch_gpt: {sum(p.numel() for p in model.parameters()):,} parameters, vocabulary {len(vocab)}, '
        f'{torch.get_num_threads()} threads, workdir {args.workdir}', flush=True)
  os.makedirs(args.workdir, exist_ok=True)

  @torch.no_grad()
  def evaluate(split: str) -> float:
    model.eval()
    starts = eval_starts[split]
    loss = sum(model(*windows(split, starts[i:i + batch])).item() for i in range(0, count, batch))
    model.train()
    return loss / (count // batch)

  started = last_time = time.time()
  for step in range(args.steps):
    for group in opt.param_groups:
      group['lr'] = learning_rate(step, 3e-3, 100, args.steps, 0.1)
    loss = model(*windows('train', rng.integers(0, len(streams['train']) - seq_len, batch)))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    done = step + 1
    if done == 1:
      print(f'first step done, {time.time() - started:.1f} s', flush=True)
    if done % log_every == 0 or done == args.steps:
      now = time.time()
      print(f'step {done}/{args.steps}: loss {loss.item():.4f}, {log_every * batch * seq_len / (now - last_time):,.0f} '
            f'tokens/s, {now - started:.1f} s', flush=True)
      last_time = now
    if done % eval_every == 0 or done == args.steps:
      print(f'step {done}: validation loss={evaluate("validation"):.4f}', flush=True)
      path = os.path.join(args.workdir, f'checkpoint_{done}.pt')
      torch.save({'step': done, 'model': model.state_dict(), 'optimizer': opt.state_dict()}, path + '.tmp')
      os.replace(path + '.tmp', path)
  print('final ' + ' '.join(f'{s}={evaluate(s):.4f}' for s in streams), flush=True)
