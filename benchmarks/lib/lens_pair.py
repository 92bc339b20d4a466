"""The model pair of the TransformerLens benchmarks (``benchmarks/speed/vs_transformer_lens.py``,
``forward_floor.py``): symjax's model at nanoGPT's CPU shape, the same weights in TransformerLens's
``HookedTransformer``, and the side-by-side timing both use."""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

LAYERS, HEADS, HEAD_DIM, MLP, VOCAB, CONTEXT, BATCH = 4, 4, 32, 512, 65, 64, 8
ANSWER, WRONG = 1, 2
SWEEPS = ('heads_sweep_16', 'resid_pre_sweep_256', 'heads_by_position_sweep_1024', 'resid_pre_sweep_256_from_0',
          'heads_by_position_sweep_1024_from_0')  # the patching workloads of ``symjax_workloads``


def symjax_model(kind: str, context: int = CONTEXT):
  import flax.linen as nn

  from symjax.interpret import HookedModel
  from symjax.model import ModelConfig, Transformer
  cfg = ModelConfig.of(kind=kind, vocab_size=VOCAB, num_layers=LAYERS, num_heads=HEADS, head_dim=HEAD_DIM,
                    ff_dim=MLP, ff_dim_per_head=MLP // HEADS, max_len=context,
                    positions='learned' if kind == 'standard' else 'alibi')
  model = Transformer(cfg)
  params = nn.meta.unbox(model.init(jax.random.key(0), jnp.zeros((1, context), jnp.int32))['params'])
  # Away from the initialisation, so that the patches move the metric.
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  params = jax.tree.unflatten(tree, [x + 0.3 * jax.random.normal(k, x.shape) * (np.std(x) + 0.05)
                                     for x, k in zip(leaves, keys)])
  return HookedModel(model, params)


def lens_model(params, context: int = CONTEXT):
  """TransformerLens's HookedTransformer holding the standard model's weights (biases it lacks set to 0)."""
  import torch
  from transformer_lens import HookedTransformer, HookedTransformerConfig
  cfg = HookedTransformerConfig(n_layers=LAYERS, d_model=HEADS * HEAD_DIM, d_head=HEAD_DIM, n_heads=HEADS,
                                d_mlp=MLP, d_vocab=VOCAB, n_ctx=context, act_fn='gelu_new',
                                normalization_type='LN', positional_embedding_type='standard', device='cpu',
                                eps=1e-5)
  model = HookedTransformer(cfg)
  t = lambda x: torch.tensor(np.asarray(x, np.float32))
  sd = model.state_dict()
  new = {'embed.W_E': t(params['embed']['embedding']), 'pos_embed.W_pos': t(params['pos_embedding']),
         'ln_final.w': t(params['norm_final']['scale']), 'ln_final.b': t(params['norm_final']['bias']),
         'unembed.W_U': t(params['embed']['embedding']).T.contiguous(), 'unembed.b_U': torch.zeros(VOCAB)}
  for l in range(LAYERS):
    p, b = params[f'layer_{l}'], f'blocks.{l}.'
    for ours, theirs in (('query', 'Q'), ('key', 'K'), ('value', 'V')):
      new[b + f'attn.W_{theirs}'] = t(np.transpose(p['attention'][ours]['kernel'], (1, 0, 2)))
      new[b + f'attn.b_{theirs}'] = torch.zeros(HEADS, HEAD_DIM)
    new[b + 'attn.W_O'] = t(p['attention']['out']['kernel'])
    new[b + 'attn.b_O'] = torch.zeros(HEADS * HEAD_DIM)
    new[b + 'ln1.w'], new[b + 'ln1.b'] = t(p['norm_attn']['scale']), t(p['norm_attn']['bias'])
    new[b + 'ln2.w'], new[b + 'ln2.b'] = t(p['norm_ffn']['scale']), t(p['norm_ffn']['bias'])
    new[b + 'mlp.W_in'], new[b + 'mlp.b_in'] = t(p['ffn']['wi']['kernel']), t(p['ffn']['wi']['bias'])
    new[b + 'mlp.W_out'], new[b + 'mlp.b_out'] = t(p['ffn']['wo']['kernel']), t(p['ffn']['wo']['bias'])
  missing = sorted(k for k in sd if k not in new and not k.endswith(('.IGNORE', '.mask')))
  if missing:
    raise SystemExit(f'weights not mapped into TransformerLens: {missing}')
  sd.update(new)
  model.load_state_dict(sd)
  return model.eval()


def prompts(sweep_batch: int = 1):
  """The benchmarks' inputs: ``BATCH`` × ``CONTEXT`` tokens, and ``sweep_batch`` clean prompts with their
  corrupt versions (the middle token changed)."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, VOCAB, (BATCH, CONTEXT))
  clean = rng.integers(0, VOCAB, (sweep_batch, CONTEXT))
  corrupt = clean.copy()
  corrupt[:, CONTEXT // 2] = (corrupt[:, CONTEXT // 2] + 7) % VOCAB
  return tokens, clean, corrupt


def first_token_corrupted(clean):
  corrupt = clean.copy()
  corrupt[:, 0] = (corrupt[:, 0] + 7) % VOCAB
  return corrupt


def ablate(z, hook, head):
  """TransformerLens's head-ablation hook as its users write it: an in-place write, returned."""
  z[:, :, head, :] = 0.0
  return z


def scale_inline():
  """A hook written inline: a new function object at every call."""
  return lambda z, hook: z * 0.5


def user_metric(logits):
  """The logit difference written by a user with ``jnp`` (or torch): nothing tells symjax which positions
  it reads."""
  return (logits[:, -1, ANSWER] - logits[:, -1, WRONG]).mean()


# Generation: a context-GENERATION_CONTEXT model continues GENERATION_PROMPTS prompts of GENERATION_PROMPT_LEN
# tokens by GENERATION_NEW tokens, greedily, each library with its key-value cache.
GENERATION_CONTEXT, GENERATION_PROMPTS, GENERATION_PROMPT_LEN, GENERATION_NEW = 256, 4, 8, 120


def generation_prompts() -> np.ndarray:
  return np.random.default_rng(1).integers(0, VOCAB, (GENERATION_PROMPTS, GENERATION_PROMPT_LEN))


# The user-metric sweeps call the same TransformerLens functions as the built-in ones (its metric is always a
# user function), so their ratios are against those rows.
SAME_FOR_LENS = {'heads_sweep_16_user_metric': 'heads_sweep_16', 'resid_pre_sweep_256_user_metric':
                 'resid_pre_sweep_256', 'heads_by_position_sweep_1024_user_metric': 'heads_by_position_sweep_1024',
                 'zero_head_loop_16': 'partial_loop_16', 'hook_sweep_16': 'partial_loop_16',
                 'patch_loop_16': 'heads_sweep_16'}


def symjax_workloads(hm, tokens, clean, corrupt):
  """{workload: a call} of the benchmarks' symjax workloads on ``hm``: a forward, a full cache and a hooked loss
  of ``tokens``; the patching sweeps of ``clean`` against ``corrupt`` and, as ``…_from_0``, against ``clean``
  with its first token changed (every patch then runs)."""
  import functools

  from symjax.interpret import hooks, patching
  metric = patching.logit_difference(ANSWER, WRONG)
  grid = {'layer': range(LAYERS), 'head': range(HEADS)}
  zero = hooks.zero_head(0)
  ready = lambda x: jax.block_until_ready(x)
  first = first_token_corrupted(clean)
  return {
      'forward': lambda: ready(hm(tokens)),
      'run_with_cache': lambda: ready(hm.run_with_cache(tokens)[0]),
      'hooked_loss': lambda: hm.run_with_hooks(tokens, {'blocks.1.attn.z': zero}, return_type='loss'),
      'heads_sweep_16': lambda: patching.get_act_patch_attn_head_out_all_pos(hm, clean, corrupt, metric),
      'resid_pre_sweep_256': lambda: patching.get_act_patch_resid_pre(hm, clean, corrupt, metric),
      'heads_by_position_sweep_1024': lambda: patching.get_act_patch_attn_head_out_by_pos(hm, clean, corrupt, metric),
      'resid_pre_sweep_256_from_0': lambda: patching.get_act_patch_resid_pre(hm, clean, first, metric),
      'heads_by_position_sweep_1024_from_0': lambda: patching.get_act_patch_attn_head_out_by_pos(hm, clean, first,
                                                                                              metric),
      'inline_hook_loss': lambda: hm.run_with_hooks(tokens, [('blocks.1.attn.hook_z', scale_inline())],
                                                    return_type='loss'),
      'partial_loop_16': lambda: [hm.run_with_hooks(tokens, [(f'blocks.{l}.attn.hook_z', functools.partial(
          ablate, head=h))], return_type='loss') for l in grid['layer'] for h in grid['head']],
      'zero_head_loop_16': lambda: [hm.run_with_hooks(tokens, [(f'blocks.{l}.attn.hook_z', hooks.zero_head(h))],
                                                      return_type='loss') for l in grid['layer'] for h in grid['head']],
      'hook_sweep_16': lambda: hm.sweep_hooks(tokens, 'blocks.{layer}.attn.hook_z', ablate, grid),
      'patch_loop_16': lambda: [patching.patch(hm, clean, corrupt, f'blocks.{l}.attn.z', heads=h, metric=metric)
                                for l in grid['layer'] for h in grid['head']],
      'heads_sweep_16_user_metric': lambda: patching.get_act_patch_attn_head_out_all_pos(hm, clean, corrupt,
                                                                                         user_metric),
      'resid_pre_sweep_256_user_metric': lambda: patching.get_act_patch_resid_pre(hm, clean, corrupt, user_metric),
      'heads_by_position_sweep_1024_user_metric': lambda: patching.get_act_patch_attn_head_out_by_pos(
          hm, clean, corrupt, user_metric),
  }


def seconds(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def timed(fn, repeats: int) -> tuple[float, float]:
  """(first call's seconds, median of ``repeats`` warm calls' seconds)."""
  first = seconds(fn)
  return first, statistics.median(seconds(fn) for _ in range(repeats))


# PyTorch's OpenMP workers spin for 200 ms after each parallel region (Intel OpenMP's default block time), so a
# call made just after a PyTorch call shares the cores with them (``interference`` measures it; the JSON keeps
# it); and after the cores idle, the next calls of either library run slower for tens of milliseconds. A
# library's calls are therefore timed in bursts, each after a pause longer than that spin and WARM_UP_S of its
# own untimed calls: each library is timed as a loop of its calls runs, neither slowed by the other.
QUIET_S, WARM_UP_S = 0.3, 0.1


def timed_side_by_side(fns: dict, repeats: int, rounds: int = 5, burst_s: float = 2.0
                       ) -> dict[str, tuple[float, float]]:
  """{name: (first call's seconds, median of its warm calls)} of functions computing the same thing:
  ``rounds`` rounds, each a burst of every function's calls in turn (``repeats`` calls over the rounds, fewer
  where a burst would pass ``burst_s``, one at least), so that a machine whose speed drifts during the run
  slows them alike and their ratio stays."""
  first = {name: seconds(fn) for name, fn in fns.items()}
  warm = {name: [] for name in fns}
  for _ in range(rounds):
    for name, fn in fns.items():
      time.sleep(QUIET_S)
      start, last = time.perf_counter(), 0.0
      while time.perf_counter() - start < WARM_UP_S or not last:
        last = seconds(fn)
      calls = max(1, min(-(-repeats // rounds), int(burst_s / last)))
      warm[name].extend(seconds(fn) for _ in range(calls))
  return {name: (first[name], statistics.median(warm[name])) for name in fns}
