"""The streamed vocabulary projection and loss equal the direct ones: values and every gradient."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import paper_reference as ref
import pytest
from helpers import randomize, shapes_of

from symjax.model import ModelConfig, Transformer, symbolic
from symjax.ops import readout

TOL = 1e-5


def max_rel_err(a, b):
  return max(ref.rel_err(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize('vocab, chunk, num_valid', [(29, 7, None), (29, 29, None), (29, 64, None),
                                                      (32, 8, 27), (40, 16, 33)])
@pytest.mark.slow
def test_streamed_projection_equals_direct_with_all_gradients(vocab, chunk, num_valid):
  heads, dim = 3, 4
  z = jax.random.normal(jax.random.key(1), (2, 5, heads, dim))
  table = jax.random.normal(jax.random.key(2), (vocab, heads * dim))
  cotangent = jax.random.normal(jax.random.key(3), (2, 5, heads, dim))
  variables = randomize(shapes_of(symbolic.VocabProjection(heads), z, table), 4)

  def run(impl):
    module = symbolic.VocabProjection(heads, impl=impl, chunk_size=chunk, num_valid=num_valid)
    f = lambda v, z, t: jnp.sum(module.apply(v, z, t) * cotangent)
    return jax.jit(lambda v, z, t: (module.apply(v, z, t), jax.grad(f, argnums=(0, 1, 2))(v, z, t)))(
        variables, z, table)

  out_d, grads_d = run('direct')
  out_s, grads_s = run('streamed')
  assert ref.rel_err(out_s, out_d) <= TOL
  for name, gs, gd in zip(('log_tau', 'z', 'table'), grads_s, grads_d):
    assert max_rel_err(gs, gd) <= TOL, name
  assert np.abs(np.asarray(grads_d[0]['params']['log_tau'])).min() > 0  # τ really receives gradient
  if num_valid is not None:  # padding rows get no weight and no gradient
    np.testing.assert_array_equal(np.asarray(grads_s[2])[num_valid:], 0.0)


@pytest.mark.slow
@pytest.mark.parametrize('vocab, chunk, num_valid', [(50, 16, None), (50, 50, None), (56, 9, 50)])
def test_streamed_loss_equals_direct_loss_with_gradients(vocab, chunk, num_valid):
  h = jax.random.normal(jax.random.key(1), (24, 12))
  table = jax.random.normal(jax.random.key(2), (vocab, 12))
  targets = jax.random.randint(jax.random.key(3), (24,), 0, num_valid or vocab)
  weights = jax.random.uniform(jax.random.key(4), (24,))

  def total(stats_fn, *args):
    return lambda h, t: jnp.sum(stats_fn(h, t, targets, *args)[0] * weights)

  direct = readout.direct_readout_stats(h, table, targets, num_valid)
  chunked = readout.readout_stats(h, table, targets, chunk, num_valid)
  assert ref.rel_err(chunked[0], direct[0]) <= TOL
  np.testing.assert_array_equal(chunked[1], direct[1])  # argmax
  np.testing.assert_array_equal(chunked[2], direct[2])  # logits above the target's
  np.testing.assert_array_equal(chunked[3], direct[3])  # logits tied with it (the target itself)
  np.testing.assert_array_equal(chunked[3], 1)
  g_direct = jax.grad(total(readout.direct_readout_stats, num_valid), argnums=(0, 1))(h, table)
  g_chunked = jax.grad(total(readout.readout_stats, chunk, num_valid), argnums=(0, 1))(h, table)
  assert max_rel_err(g_chunked, g_direct) <= TOL
  # Against the textbook cross-entropy on the unpadded logits.
  logits = np.asarray(h, np.float64) @ np.asarray(table, np.float64)[:num_valid or vocab].T
  want = np.log(np.exp(logits).sum(-1)) - logits[np.arange(24), np.asarray(targets)]
  assert ref.rel_err(chunked[0], want) <= TOL


def test_one_pass_stats_equal_the_textbook_loss_and_ranks_with_padding_ties_and_nan():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(40, 37)).astype(np.float32) * 4
  logits[:, 33:] = -np.inf                                  # padding rows of the table
  logits[5, 7] = logits[5, 2] = logits[5, 30] = 30.0        # a three-way tie at the maximum
  logits[6, 1] = np.nan                                     # a diverged logit beside the target
  targets = rng.integers(0, 33, size=40)
  targets[5], targets[6] = 7, 0
  loss, argmax, above, tied, lse = jax.jit(readout.one_pass_stats)(jnp.asarray(logits), jnp.asarray(targets))

  wide = logits.astype(np.float64)
  peak = wide[:, :33].max(-1, keepdims=True)
  want_lse = peak[:, 0] + np.log(np.exp(wide[:, :33] - peak).sum(-1))
  target = wide[np.arange(40), targets]
  finite = np.arange(40) != 6
  np.testing.assert_allclose(np.asarray(lse)[finite], want_lse[finite], rtol=2e-6)
  np.testing.assert_allclose(np.asarray(loss)[finite], (want_lse - target)[finite], rtol=2e-6, atol=2e-6)
  np.testing.assert_array_equal(np.asarray(above), (wide > target[:, None]).sum(-1))
  np.testing.assert_array_equal(np.asarray(tied), (wide == target[:, None]).sum(-1))
  assert tied[5] == 3 and above[5] == 0
  assert np.isnan(loss[6]) and np.isnan(lse[6])              # a NaN is reported, never averaged away
  np.testing.assert_array_equal(np.asarray(argmax)[finite], np.argmax(logits, -1)[finite])
  # The same four statistics as logit_stats, which sums in two passes.
  for a, b in zip(readout.logit_stats(jnp.asarray(logits[finite]), jnp.asarray(targets[finite])),
                  readout.one_pass_stats(jnp.asarray(logits[finite]), jnp.asarray(targets[finite]))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize('platform, merged', [('cuda', True), ('cpu', False)])
def test_the_direct_loss_reads_its_logits_once_when_compiled_for_a_gpu(platform, merged):
  step = jax.jit(jax.value_and_grad(lambda h, t, y: jnp.sum(readout.direct_readout_stats(h, t, y, 37)[0]),
                                    argnums=(0, 1)))
  args = (jax.ShapeDtypeStruct((16, 8), jnp.float32), jax.ShapeDtypeStruct((40, 8), jnp.float32),
          jax.ShapeDtypeStruct((16,), jnp.int32))
  text = jax.export.export(step, platforms=[platform])(*args).mlir_module()
  over_logits = [line for line in text.splitlines() if 'stablehlo.reduce' in line and 'tensor<16x40xf32>' in line]
  four_sums = [line for line in over_logits if line.count(' init: ') == 4]
  assert bool(four_sums) == merged, over_logits
  assert len(over_logits) == (1 if merged else 2), over_logits  # else the maximum, then the exponentials


@functools.partial(jax.jit, static_argnums=0)
def _model_grads(cfg, tokens, variables):
  model = Transformer(cfg)

  def loss(params):
    h, table = model.apply({'params': params}, tokens, return_hidden=True)
    return jnp.sum(readout.direct_readout_stats(h.reshape(-1, h.shape[-1]), table, tokens.reshape(-1),
                                                 cfg.num_valid_rows)[0])

  return model.apply(variables, tokens), jax.grad(loss)(variables['params'])


@pytest.mark.slow
def test_symbolic_model_with_streamed_projection_equals_direct():
  cfg = ModelConfig.of(kind='symbolic', vocab_size=19, num_layers=2, num_heads=2, head_dim=4, ff_dim=8,
                    ff_dim_per_head=6, max_len=8, vocab_chunk_size=6, vocab_pad_multiple=4)
  tokens = jax.random.randint(jax.random.key(5), (2, 8), 0, cfg.vocab_size)
  variables = randomize(shapes_of(Transformer(cfg), tokens), 6, scale=0.4)
  assert variables['params']['embed']['embedding'].shape == (20, 8)  # padded to a multiple of 4
  logits_d, grads_d = _model_grads(cfg, tokens, variables)
  logits_s, grads_s = _model_grads(cfg.replace(vocab_projection='streamed'), tokens, variables)
  assert logits_d.shape == (2, 8, 19)
  assert ref.rel_err(logits_s, logits_d) <= TOL
  assert max_rel_err(grads_s, grads_d) <= TOL


@pytest.mark.slow
@pytest.mark.parametrize('remat', ['full', 'dots'])
def test_rematerialised_blocks_give_the_same_gradients(remat):
  cfg = ModelConfig.of(kind='symbolic', vocab_size=11, num_layers=2, num_heads=2, head_dim=4, ff_dim=8,
                    ff_dim_per_head=6, max_len=8)
  tokens = jax.random.randint(jax.random.key(5), (2, 8), 0, cfg.vocab_size)
  variables = randomize(shapes_of(Transformer(cfg), tokens), 6, scale=0.4)
  _, grads = _model_grads(cfg, tokens, variables)
  _, grads_remat = _model_grads(cfg.replace(remat=remat), tokens, variables)
  assert max_rel_err(grads_remat, grads) <= TOL
