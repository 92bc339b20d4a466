"""How far symjax's forward pass is from what the CPU allows, beside PyTorch's: the forward of
``vs_transformer_lens`` (nanoGPT's CPU shape, 8 × 64 tokens) against the same model written plainly in each
library, and the model's matrix products alone.

  pip install -e '.[bench]'
  python -m benchmarks.speed.forward_floor [--processes=3] [--json=benchmarks/results/forward_floor_cpu.json]

Rows, all on the same weights and timed side by side in bursts (``benchmarks.lib.lens_pair``):
- TransformerLens's ``HookedTransformer`` forward and symjax's ``HookedModel`` forward (the benchmark's rows);
- the same model as a plain PyTorch function (``F.layer_norm``, one q/k/v product,
  ``F.scaled_dot_product_attention``) and as a plain ``jax.jit`` function: each library without hooks;
- the forward's dense products alone (q/k/v, output, the MLP's two, the unembedding; no attention), in each
  library: what no implementation of the model removes.
The logits of the four forward rows are checked against each other before anything is timed. TransformerLens's
forward time moves between processes more than within one, so each of ``--processes`` processes times every
row, one after another. Run it on an idle machine.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from benchmarks.lib import cli
from benchmarks.lib import lens_pair as pair
from benchmarks.lib import results as result_files

_JSON = cli.json_output('benchmarks/results/forward_floor_cpu.json')
_REPEATS = cli.repeats(45, 'Warm calls timed per row, in bursts (the median is reported).')
_PROCESSES = flags.DEFINE_integer('processes', 3, 'Processes, one after another, each timing every row.')
D = pair.HEADS * pair.HEAD_DIM
_CHILD = 'SYMJAX_FORWARD_FLOOR_CHILD'  # set in the processes the first one starts


def layers(params):
  """Per block: (q/k/v [D, 3D], out [D, D], MLP in, bias, MLP out, bias, ln1 scale, bias, ln2 scale, bias)."""
  out = []
  for l in range(pair.LAYERS):
    p = params[f'layer_{l}']
    a = p['attention']
    qkv = np.concatenate([np.asarray(a[n]['kernel']).reshape(D, D) for n in ('query', 'key', 'value')], 1)
    out.append((qkv, np.asarray(a['out']['kernel']).reshape(D, D), p['ffn']['wi']['kernel'], p['ffn']['wi']['bias'],
                p['ffn']['wo']['kernel'], p['ffn']['wo']['bias'], p['norm_attn']['scale'], p['norm_attn']['bias'],
                p['norm_ffn']['scale'], p['norm_ffn']['bias']))
  return out


def products(blocks, emb, x):
  """The forward's dense products alone, on rows ``x`` [tokens, D]: in either library (``@`` and slices)."""
  for qkv, o, wi, _, wo, *_ in blocks:
    x = x + (x @ qkv)[:, :D] @ o
    x = x + (x @ wi) @ wo
  return x @ emb.T


def jax_rows(params):
  blocks = jax.tree.map(jnp.asarray, layers(params))
  emb, pos = jnp.asarray(params['embed']['embedding']), jnp.asarray(params['pos_embedding'])
  final = jnp.asarray(params['norm_final']['scale']), jnp.asarray(params['norm_final']['bias'])

  def norm(x, scale, bias):
    m = x.mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * scale + bias

  @jax.jit
  def forward(ids):
    b, t = ids.shape
    x = emb[ids] + pos[:t]
    causal = jnp.tril(jnp.ones((t, t), bool))
    for qkv, o, wi, bi, wo, bo, s1, b1, s2, b2 in blocks:
      q, k, v = jnp.split((norm(x, s1, b1) @ qkv).reshape(b, t, 3 * pair.HEADS, pair.HEAD_DIM), 3, axis=2)
      scores = jnp.where(causal, jnp.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(pair.HEAD_DIM), -jnp.inf)
      z = jnp.einsum('bhqk,bkhd->bqhd', jax.nn.softmax(scores, -1), v)
      x = x + z.reshape(b, t, D) @ o
      x = x + jax.nn.gelu(norm(x, s2, b2) @ wi + bi) @ wo + bo
    return norm(x, *final) @ emb.T

  return forward, jax.jit(functools.partial(products, blocks, emb))


def torch_rows(params):
  import torch
  F = torch.nn.functional
  t_ = lambda a: torch.tensor(np.asarray(a, np.float32))
  blocks = [tuple(t_(a) for a in block) for block in layers(params)]
  emb, pos = t_(params['embed']['embedding']), t_(params['pos_embedding'])
  final = t_(params['norm_final']['scale']), t_(params['norm_final']['bias'])

  def forward(ids):
    b, t = ids.shape
    x = emb[ids] + pos[:t]
    for qkv, o, wi, bi, wo, bo, s1, b1, s2, b2 in blocks:
      q, k, v = (F.layer_norm(x, (D,), s1, b1, 1e-5) @ qkv).view(b, t, 3 * pair.HEADS, pair.HEAD_DIM
                                                                  ).transpose(1, 2).split(pair.HEADS, dim=1)
      z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
      x = x + z.transpose(1, 2).reshape(b, t, D) @ o
      x = x + F.gelu(F.layer_norm(x, (D,), s2, b2, 1e-5) @ wi + bi, approximate='tanh') @ wo + bo
    return F.layer_norm(x, (D,), *final, 1e-5) @ emb.T

  return forward, functools.partial(products, blocks, emb)


def one_process() -> dict[str, float]:
  """{row: warm median ms} of this process."""
  import torch
  tokens = np.random.default_rng(0).integers(0, pair.VOCAB, (pair.BATCH, pair.CONTEXT))
  hm = pair.symjax_model('standard')
  lens = pair.lens_model(hm.params)
  jax_forward, jax_products = jax_rows(hm.params)
  torch_forward, torch_products = torch_rows(hm.params)
  ids = torch.tensor(tokens)
  x = np.random.default_rng(1).normal(size=(pair.BATCH * pair.CONTEXT, D)).astype(np.float32)
  xj, xt = jnp.asarray(x), torch.tensor(x)
  with torch.no_grad():
    want = np.asarray(hm(tokens))
    for name, got in (('transformer_lens', lens(ids).numpy()), ('plain_pytorch', torch_forward(ids).numpy()),
                      ('plain_jax', np.asarray(jax_forward(tokens)))):
      if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
        raise SystemExit(f'{name} logits differ from symjax by {np.abs(got - want).max():.3g}')
    ready = jax.block_until_ready
    rows = pair.timed_side_by_side({
        'transformer_lens_forward': lambda: lens(ids),
        'symjax_forward': lambda: ready(hm(tokens)),
        'plain_pytorch_forward': lambda: torch_forward(ids),
        'plain_jax_forward': lambda: ready(jax_forward(tokens)),
        'pytorch_products_alone': lambda: torch_products(xt),
        'jax_products_alone': lambda: ready(jax_products(xj)),
    }, _REPEATS.value)
  return {name: warm * 1e3 for name, (_, warm) in rows.items()}


def main(argv):
  del argv
  if _PROCESSES.value == 1 and os.environ.get(_CHILD):
    print(json.dumps(one_process()))
    return
  runs = []
  for i in range(_PROCESSES.value):
    env = dict(os.environ, **{_CHILD: '1'})
    out = subprocess.run([sys.executable, '-m', 'benchmarks.speed.forward_floor', '--processes=1',
                          f'--repeats={_REPEATS.value}'], env=env, capture_output=True, text=True)
    if out.returncode:
      raise SystemExit(f'process {i} failed:\n{out.stderr[-2000:]}')
    runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    products = runs[-1]['jax_products_alone']
    print(f'process {i}: ' + ', '.join(f'{k} {v:.2f} ms ({v / products:.2f}x)' for k, v in runs[-1].items()))
  median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
  ratio = [r['transformer_lens_forward'] / r['symjax_forward'] for r in runs]
  over_products = [r['symjax_forward'] / r['jax_products_alone'] for r in runs]
  print('TransformerLens over symjax per process: ' + ', '.join(f'{x:.2f}' for x in ratio)
        + '; symjax over the XLA products alone: ' + ', '.join(f'{x:.2f}' for x in over_products))
  import torch
  result_files.write(_JSON.value, {
      'what': 'the forward pass of benchmarks.speed.vs_transformer_lens (8 x 64 tokens, nanoGPT CPU shape) against '
              'the same model as a plain function in each library and the dense products alone; warm medians (ms) '
              'of bursts interleaved between the rows, one process after another',
      'shape': {'layers': pair.LAYERS, 'heads': pair.HEADS, 'head_dim': pair.HEAD_DIM, 'mlp': pair.MLP,
                'vocab': pair.VOCAB, 'context': pair.CONTEXT, 'batch': pair.BATCH},
      'repeats': _REPEATS.value, 'transformer_lens': importlib.metadata.version('transformer_lens'),
      'torch': torch.__version__, 'torch_threads': torch.get_num_threads(), 'jax': jax.__version__,
      'median_ms': median,
      'per_process_ms': runs,
      'transformer_lens_over_symjax': ratio,
      'symjax_over_jax_products': over_products,
      'plain_pytorch_over_jax_products': [r['plain_pytorch_forward'] / r['jax_products_alone'] for r in runs]})


if __name__ == '__main__':
  app.run(main)
