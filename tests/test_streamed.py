"""The streamed vocabulary projection and loss equal the direct ones: values and every gradient."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import paper_reference as ref
import pytest
from helpers import randomize

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
  variables = randomize(symbolic.VocabProjection(heads).init(jax.random.key(0), z, table), 4)

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
  cfg = ModelConfig(kind='symbolic', vocab_size=19, num_layers=2, num_heads=2, head_dim=4, ff_dim=8,
                    ff_dim_per_head=6, max_len=8, vocab_chunk_size=6, vocab_pad_multiple=4)
  tokens = jax.random.randint(jax.random.key(5), (2, 8), 0, cfg.vocab_size)
  variables = randomize(Transformer(cfg).init(jax.random.key(0), tokens), 6, scale=0.4)
  assert variables['params']['embed']['embedding'].shape == (20, 8)  # padded to a multiple of 4
  logits_d, grads_d = _model_grads(cfg, tokens, variables)
  logits_s, grads_s = _model_grads(dataclasses.replace(cfg, vocab_projection='streamed'), tokens, variables)
  assert logits_d.shape == (2, 8, 19)
  assert ref.rel_err(logits_s, logits_d) <= TOL
  assert max_rel_err(grads_s, grads_d) <= TOL


@pytest.mark.slow
@pytest.mark.parametrize('remat', ['full', 'dots'])
def test_rematerialised_blocks_give_the_same_gradients(remat):
  cfg = ModelConfig(kind='symbolic', vocab_size=11, num_layers=2, num_heads=2, head_dim=4, ff_dim=8,
                    ff_dim_per_head=6, max_len=8)
  tokens = jax.random.randint(jax.random.key(5), (2, 8), 0, cfg.vocab_size)
  variables = randomize(Transformer(cfg).init(jax.random.key(0), tokens), 6, scale=0.4)
  _, grads = _model_grads(cfg, tokens, variables)
  _, grads_remat = _model_grads(dataclasses.replace(cfg, remat=remat), tokens, variables)
  assert max_rel_err(grads_remat, grads) <= TOL
