"""The residual stream taken apart with TransformerLens's names: per head, per block, block by block, through
the frozen final norm onto chosen tokens. The terms add up to the cached logits for all three kinds, with
the hooks and key mask the cache was made with."""

import jax
import numpy as np
import pytest
from helpers import KINDS, randomize, shapes_of, small

from symjax.interpret import core, hooks
from symjax.model import Transformer
from symjax.system.errors import InputError

TOL = 1e-5  # float32 logits, terms summed in float64


def model_and_params(kind, seed=0):
  cfg = small(kind=kind)
  model = Transformer(cfg)
  tokens = np.asarray(jax.random.randint(jax.random.key(seed), (2, 9), 0, cfg.vocab_size))
  params = randomize(shapes_of(model, tokens)['params'], seed + 2)
  return model, params, tokens


@pytest.fixture(scope='module', params=KINDS)
def cached(request):
  model, params, tokens = model_and_params(request.param)
  logits, cache = hooks.run_with_cache(model, params, tokens)
  targets = np.asarray(jax.random.randint(jax.random.key(5), tokens.shape, 0, model.config.vocab_size))
  return model, params, tokens, logits, cache, targets


def logit_of(logits, targets):
  return np.take_along_axis(logits, targets[..., None], -1)[..., 0]


def test_heads_and_the_remainder_sum_to_the_logits_through_the_frozen_norm(cached):
  model, _, _, logits, cache, targets = cached
  stack, labels = cache.stack_head_results(incl_remainder=True, return_labels=True)
  cfg = model.config
  assert stack.shape == (cfg.num_layers * cfg.num_heads + 1, *cache['embed'].shape)
  assert labels[1] == ('L0H1' if cfg.kind == 'standard' else 'L0H1.x_t') and labels[-1] == 'remainder'
  got = cache.logit_attrs(stack, targets).sum(0) + cache.ln_bias_logits(targets)
  np.testing.assert_allclose(got, logit_of(logits, targets), atol=TOL)


def test_blocks_and_accumulated_states_sum_to_the_logits_and_name_their_streams(cached):
  model, _, _, logits, cache, targets = cached
  stack, labels = cache.decompose_resid(return_labels=True)
  L = model.config.num_layers
  two = model.config.kind != 'standard'
  assert labels[-2:] == ([f'{L - 1}_attn_out.x_t', f'{L - 1}_ffn_out.x_e'] if two else
                         [f'{L - 1}_attn_out', f'{L - 1}_mlp_out'])
  got = cache.logit_attrs(stack, targets).sum(0) + cache.ln_bias_logits(targets)
  np.testing.assert_allclose(got, logit_of(logits, targets), atol=TOL)
  acc, acc_labels = cache.accumulated_resid(return_labels=True)
  assert acc_labels == [f'{l}_pre' for l in range(L)] + ['final_post'] and acc.shape[0] == L + 1
  embeds = len(stack) - 2 * L  # a two-stream model's X_e starts at zero: one embedding term
  np.testing.assert_allclose(acc, np.cumsum(stack, 0)[[embeds - 1 + 2 * l for l in range(L + 1)]], atol=1e-9)
  # The last accumulated state is the state the final norm reads: read out, it gives the logits.
  last = cache.logit_attrs(acc[-1:], targets)[0] + cache.ln_bias_logits(targets)
  np.testing.assert_allclose(last, logit_of(logits, targets), atol=TOL)
  # Up to a layer: the blocks before it only.
  assert cache.decompose_resid(layer=1).shape[0] == len(stack) - 2 * (L - 1)


def test_a_head_of_a_two_stream_model_is_its_channel_of_attn_out_and_standard_heads_sum_to_it(cached):
  model, _, _, _, cache, _ = cached
  cfg = model.config
  h, dh = cfg.num_heads, cfg.head_dim
  stack = cache.stack_head_results()
  for l in range(cfg.num_layers):
    out = cache[f'blocks.{l}.attn.out'].astype(np.float64)
    heads = stack[l * h:(l + 1) * h]
    if cfg.kind == 'standard':
      np.testing.assert_allclose(heads.sum(0), out, atol=1e-5)
      continue
    for head in range(h):
      channel = slice(head * dh, (head + 1) * dh)
      np.testing.assert_array_equal(heads[head][..., channel], out[..., channel])
      assert not np.delete(heads[head], np.r_[channel], axis=-1).any()


def test_one_position_and_a_logit_difference(cached):
  model, _, _, logits, cache, targets = cached
  other = (targets + 1) % model.config.vocab_size
  stack = cache.stack_head_results(pos_slice=-1, incl_remainder=True)
  diff = cache.logit_attrs(stack, targets[:, -1], other[:, -1], pos_slice=-1)
  assert diff.shape == (len(stack), 2)
  want = logit_of(logits, targets)[:, -1] - logit_of(logits, other)[:, -1]
  np.testing.assert_allclose(diff.sum(0) + cache.ln_bias_logits(targets[:, -1], other[:, -1], pos_slice=-1), want,
                             atol=TOL)
  # One batch row, its axis taken away as TransformerLens's batch_slice does.
  row = cache.logit_attrs(stack[:, 1], targets[1, -1], other[1, -1], pos_slice=-1, batch_slice=1)
  np.testing.assert_allclose(row, diff[:, 1], atol=1e-12)


@pytest.mark.parametrize('kind', KINDS)
def test_decompose_keeps_the_hooks_and_key_mask_of_the_cache(kind):
  """A head zeroed by a hook and padded keys: the terms sum to the hooked, masked logits, not the plain ones."""
  model, params, tokens = model_and_params(kind, seed=3)
  key_mask = np.ones(tokens.shape, bool)
  key_mask[1, 6:] = False
  logits, cache = hooks.run_with_cache(model, params, tokens, key_mask=key_mask,
                                       hooks={'blocks.0.attn.z': hooks.zero_head(1)})
  plain = np.asarray(model.apply({'params': params}, tokens))
  assert np.abs(plain - logits).max() > 1e-3  # the hook and the mask change the logits
  parts = cache.decompose(position=5)
  np.testing.assert_allclose(sum(parts.values()), logits[:, 5], atol=TOL)
  stack = cache.stack_head_results(incl_remainder=True)
  assert not stack[1].any()  # the zeroed head writes nothing
  targets = np.zeros(tokens.shape, int)
  np.testing.assert_allclose(cache.logit_attrs(stack, targets).sum(0) + cache.ln_bias_logits(targets),
                             logits[..., 0], atol=TOL)


def test_layer_minus_one_stacks_every_block_as_transformer_lens_reads_it(cached):
  _, _, _, _, cache, _ = cached
  for method in (cache.stack_head_results, cache.decompose_resid, cache.accumulated_resid):
    every, labels = method(layer=-1, return_labels=True)
    want, want_labels = method(return_labels=True)
    np.testing.assert_array_equal(every, want)
    assert labels == want_labels
  assert len(cache.accumulated_resid(layer=-1)) > len(cache.accumulated_resid(layer=1))


def test_the_accumulated_states_are_the_cached_ones_with_transformer_lens_labels_and_middles(cached):
  model, _, _, _, cache, _ = cached
  L = model.config.num_layers
  stack, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
  assert labels == [name for l in range(L) for name in (f'{l}_pre', f'{l}_mid')] + ['final_post']
  two = model.config.kind != 'standard'
  for state, label in zip(stack, labels):
    if label == '0_pre':
      want = np.asarray(cache['embed'], np.float64)
    elif label == 'final_post':
      want = sum(np.asarray(cache[f'blocks.{L - 1}.{s}'], np.float64) for s in (('x_t', 'x_e') if two else ('resid',)))
    else:
      l, part = int(label.split('_')[0]), label.split('_')[1]
      sites = ([f'blocks.{l - 1}.x_t', f'blocks.{l - 1}.x_e'] if two else [f'blocks.{l - 1}.resid']) if part == 'pre' \
          else ([f'blocks.{l}.x_t_mid', f'blocks.{l}.x_e_mid'] if two else [f'blocks.{l}.resid_mid'])
      want = sum(np.asarray(cache[s], np.float64) for s in sites)
    np.testing.assert_allclose(state, want, atol=1e-5, err_msg=label)
  upto, upto_labels = cache.accumulated_resid(layer=1, mlp_input=True, return_labels=True)
  assert upto_labels == ['0_pre', '1_pre', '1_mid'] and np.array_equal(upto, stack[[0, 2, 3]])


def test_decompose_resid_modes_embeddings_and_mlp_input_sum_to_the_states_they_make(cached):
  model, _, _, _, cache, _ = cached
  L, two = model.config.num_layers, model.config.kind != 'standard'
  every, labels = cache.decompose_resid(return_labels=True)
  attn, attn_labels = cache.decompose_resid(mode='attn', incl_embeds=False, return_labels=True)
  ffn, ffn_labels = cache.decompose_resid(mode='mlp', incl_embeds=False, return_labels=True)
  assert attn_labels == [f'{l}_attn_out' + ('.x_t' if two else '') for l in range(L)]
  assert ffn_labels == [f'{l}_' + ('ffn_out.x_e' if two else 'mlp_out') for l in range(L)]
  np.testing.assert_allclose(every[0] + attn.sum(0) + ffn.sum(0), every.sum(0), atol=1e-9)
  # Up to block 1 with its attention: the state its FFN reads, as accumulated_resid gives it.
  mid = cache.decompose_resid(layer=1, mlp_input=True)
  np.testing.assert_allclose(mid.sum(0), cache.accumulated_resid(layer=1, mlp_input=True)[-1], atol=1e-9)


def test_apply_ln_is_the_frozen_final_norm_and_the_logit_lens_reads_its_own_statistics(cached):
  model, _, _, logits, cache, targets = cached
  heads = cache.stack_head_results(pos_slice=-1)
  np.testing.assert_array_equal(cache.stack_head_results(pos_slice=-1, apply_ln=True),
                                cache.apply_ln_to_stack(heads, pos_slice=-1))
  np.testing.assert_array_equal(cache.decompose_resid(apply_ln=True), cache.apply_ln_to_stack(cache.decompose_resid()))
  # The last state through the final norm, plus β, read out: the logits themselves.
  lens = cache.accumulated_resid(apply_ln=True)
  table = core.readout_table(model.config, cache.params)
  _, beta = core.final_norm_affine(model.config, cache.params, cache.accumulated_resid()[-1])
  np.testing.assert_allclose((lens[-1] + beta) @ table.T[:, :logits.shape[-1]], logits, atol=TOL)
  # TransformerLens's tutorial form: one state, not a stack, sliced by position and by batch row.
  final = cache.accumulated_resid(pos_slice=-1)[-1]                                   # [batch, d_model]
  np.testing.assert_array_equal(cache.apply_ln_to_stack(final, layer=-1, pos_slice=-1),
                                cache.apply_ln_to_stack(final[None], pos_slice=-1)[0])
  np.testing.assert_array_equal(cache.apply_ln_to_stack(final[1], pos_slice=-1, batch_slice=1, has_batch_dim=False),
                                cache.apply_ln_to_stack(final, pos_slice=-1)[1])
  np.testing.assert_array_equal(cache.apply_ln_to_stack(cache.accumulated_resid(), recompute_ln=True), lens)
  # An earlier state is normalised by its own statistics, not the final state's.
  frozen = cache.apply_ln_to_stack(cache.accumulated_resid())
  assert np.abs(lens[0] - frozen[0]).max() > 1e-3


def test_the_full_decomposition_into_heads_neurons_and_bias_sums_to_the_stream(cached):
  model, params, _, logits, cache, targets = cached
  cfg = model.config
  expand = cfg.kind != 'symbolic'
  stack, labels = cache.get_full_resid_decomposition(expand_neurons=expand, return_labels=True)
  assert len(stack) == len(labels) and labels[-1] == 'bias' and labels[1].startswith('L0H0')
  np.testing.assert_allclose(stack.sum(0), cache.accumulated_resid()[-1], atol=1e-9)
  got = cache.logit_attrs(stack, targets).sum(0) + cache.ln_bias_logits(targets)
  np.testing.assert_allclose(got, logit_of(logits, targets), atol=TOL)
  if not expand:
    with pytest.raises(InputError, match=r"block 0's FFN is symbolic"):
      cache.get_full_resid_decomposition()
    return
  # Block 1's neurons and its output bias make its FFN update.
  ff = cfg.ff_dim
  first = labels.index('L1N0' + ('' if cfg.kind == 'standard' else '.x_e'))
  bias = np.asarray(params['layer_1']['ffn']['wo']['bias'], np.float64)
  np.testing.assert_allclose(stack[first:first + ff].sum(0) + bias, cache['blocks.1.ffn.out'], atol=1e-5)
  # Up to block 1's FFN: the state it reads, at one position.
  mid = cache.get_full_resid_decomposition(layer=1, mlp_input=True, pos_slice=-1)
  np.testing.assert_allclose(mid.sum(0), cache.accumulated_resid(layer=1, mlp_input=True, pos_slice=-1)[-1],
                             atol=1e-9)


def test_bad_input_is_a_one_line_error(cached):
  model, _, _, _, cache, targets = cached
  stack = cache.stack_head_results()
  for call, message in [
      (lambda: cache.stack_head_results(layer=model.config.num_layers + 1), r'layer must be None or -1 \(every '),
      (lambda: cache.accumulated_resid(layer=-2), r'layer must be None or -1 \(every block\) or an integer'),
      (lambda: cache.decompose_resid(pos_slice=99), r'position 99 is outside the input of 9 tokens'),
      (lambda: cache.logit_attrs(stack, model.config.vocab_size), r'tokens must be integer ids in 0\.\.12'),
      (lambda: cache.logit_attrs(stack, targets[:, :3]), r'do not fit the stack'),
      (lambda: cache.apply_ln_to_stack(stack, pos_slice=-1), r'make the stack with the same slices'),
      (lambda: cache.apply_ln_to_stack(stack, layer=1), r'apply_ln_to_stack applies the final norm'),
      (lambda: cache.apply_ln_to_stack(stack[:, 0], has_batch_dim=False), r'has_batch_dim=False needs a batch of one'),
      (lambda: cache.decompose_resid(mode='ffn'), r"mode must be one of \['all', 'attn', 'mlp'\], got 'ffn'"),
      (lambda: cache.decompose_resid(layer=1, apply_ln=True), r'apply_ln applies the final norm'),
      (lambda: cache.accumulated_resid(layer=1, apply_ln=True), r'apply_ln reads each state through the final'),
  ]:
    with pytest.raises(InputError, match=message) as e:
      call()
    assert '\n' not in str(e.value)
