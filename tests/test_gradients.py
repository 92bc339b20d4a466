"""Gradients at named sites and attribution patching: the functional core of the hooked model goes through
jax.grad, and its gradients agree with the readout's own rows and with finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import KINDS, randomize, shapes_of, small

from symjax.interpret import core, hooks, patching
from symjax.model import Transformer


def setup(kind):
  cfg = small(kind=kind)
  model = Transformer(cfg)
  clean = np.asarray(jax.random.randint(jax.random.key(3), (2, 7), 0, cfg.vocab_size))
  corrupt = clean.copy()
  corrupt[:, 2] = (corrupt[:, 2] + 5) % cfg.vocab_size
  params = randomize(shapes_of(model, clean)['params'], 4)
  return model, params, clean, corrupt


def difference(logits):  # mean over the batch of logit 3 − logit 4 at the last position
  return (logits[:, -1, 3] - logits[:, -1, 4]).mean()


@pytest.mark.parametrize('kind', KINDS)
def test_the_gradient_at_the_final_norm_is_the_readout_rows_and_one_inside_matches_finite_differences(kind):
  model, params, clean, _ = setup(kind)
  value, grads = hooks.site_gradients(model, params, clean, difference, ['final.norm', 'blocks.0.attn.z'])
  np.testing.assert_allclose(value, patching.logit_difference(3, 4)(hooks.run_with_hooks(model, params, clean, {})),
                             rtol=1e-5, atol=1e-5)
  # logits = final.norm · Eᵀ: the gradient is (E[3] − E[4]) / batch at the last position, 0 elsewhere.
  table = core.readout_table(model.config, params)
  want = np.zeros(grads['final.norm'].shape)
  want[:, -1] = (table[3] - table[4]) / clean.shape[0]
  np.testing.assert_allclose(grads['final.norm'], want, rtol=1e-5, atol=1e-6)
  # One element of a head's output, by central differences through hooks.
  index, eps = (1, 4, 2, 1), 1e-2

  def nudged(sign):
    def fn(v, name):
      return v.at[index].add(sign * eps)
    return float(difference(hooks.apply_with_hooks(model, params, clean, {'blocks.0.attn.z': fn})))

  np.testing.assert_allclose((nudged(1) - nudged(-1)) / (2 * eps), grads['blocks.0.attn.z'][index], rtol=2e-2,
                             atol=1e-4)


@pytest.mark.parametrize('kind', KINDS)
def test_attribution_patching_is_exact_for_a_metric_linear_in_the_site(kind):
  model, params, clean, corrupt = setup(kind)
  estimate = hooks.attribution_patch(model, params, clean, corrupt, difference, ['final.norm', 'blocks.0.attn.z'])
  assert estimate['final.norm'].shape == clean.shape and estimate['blocks.0.attn.z'].shape == (
      *clean.shape, model.config.num_heads)
  exact = float(difference(jnp.asarray(patching.patch(model, params, clean, corrupt, 'final.norm')))) - float(
      difference(jnp.asarray(hooks.run_with_hooks(model, params, corrupt, {}))))
  np.testing.assert_allclose(estimate['final.norm'].sum(), exact, rtol=1e-4, atol=1e-5)


def test_logit_difference_is_a_metric_that_gradients_and_attribution_patching_go_through():
  model, params, clean, corrupt = setup('symbolic')
  sites = ['final.norm', 'blocks.0.attn.z']
  for reduce in ('mean', 'none'):
    metric = patching.logit_difference(3, 4, reduce=reduce)
    by_hand = difference if reduce == 'mean' else (lambda logits: logits[:, -1, 3] - logits[:, -1, 4])
    value, grads = hooks.site_gradients(model, params, clean, lambda x: metric(x).sum(), sites)
    want_value, want = hooks.site_gradients(model, params, clean, lambda x: by_hand(x).sum(), sites)
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    for name in sites:
      np.testing.assert_allclose(grads[name], want[name], rtol=1e-6, atol=1e-7)
  estimate = hooks.attribution_patch(model, params, clean, corrupt, patching.logit_difference(3, 4), sites)
  want = hooks.attribution_patch(model, params, clean, corrupt, difference, sites)
  np.testing.assert_allclose(estimate['blocks.0.attn.z'], want['blocks.0.attn.z'], rtol=1e-5, atol=1e-7)
  # Outside a trace it still gives plain numbers: a float, or one value per row.
  logits = hooks.run_with_hooks(model, params, clean, {})
  assert isinstance(patching.logit_difference(3, 4)(logits), float)
  assert isinstance(patching.logit_difference(3, 4, reduce='none')(jnp.asarray(logits)), np.ndarray)


def test_the_functional_core_jits_and_its_gradient_reaches_the_parameters():
  model, params, clean, _ = setup('symbolic')
  loss = jax.jit(lambda p: difference(hooks.apply_with_hooks(model, p, clean, {'blocks.0.attn.z': hooks.zero_head(1)})))
  grads = jax.grad(loss)(params)
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
  assert np.abs(np.asarray(grads['embed']['embedding'])).sum() > 0


def test_a_cache_with_gradients_holds_those_of_site_gradients():
  model, params, clean, _ = setup('token_factored')
  _, cache = hooks.run_with_cache(model, params, clean, ['blocks.1.x_e', 'blocks.1.resid', 'final.norm'],
                                  incl_grad=True, metric=difference)
  _, grads = hooks.site_gradients(model, params, clean, difference, ['blocks.1.x_e', 'final.norm'])
  for name, grad in grads.items():
    np.testing.assert_array_equal(cache[f'{name}_grad'], grad)
  assert 'blocks.1.resid_grad' not in cache  # a two-stream model's resid is a read-only sum
  with pytest.raises(ValueError, match=r'incl_grad=True needs metric='):
    hooks.run_with_cache(model, params, clean, incl_grad=True)
