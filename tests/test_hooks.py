"""The named cache and hooks against the existing readings: the sown intermediates, the interventions, the
exact mixture trace. Hooks run inside the model's own modules, so an identity hook changes nothing."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import KINDS, compilations, randomize, shapes_of, small

from symjax.interpret import core, hooks, interventions, mixtures
from symjax.model import Transformer
from symjax.system.errors import InputError


def model_and_params(kind, seed=0, **kw):
  cfg = small(kind=kind, **kw)
  model = Transformer(cfg)
  tokens = jax.random.randint(jax.random.key(seed), (2, 9), 0, cfg.vocab_size)
  params = randomize(shapes_of(model, tokens)['params'], seed + 2)
  return model, params, np.asarray(tokens)


@pytest.fixture(scope='module', params=KINDS)
def cached(request):
  model, params, tokens = model_and_params(request.param)
  logits, cache = hooks.run_with_cache(model, params, tokens)
  return model, params, tokens, logits, cache


def test_site_axes_give_each_sites_rank_and_its_position_and_head_sizes(cached):
  """The masks of a patch are built from ``site_axes`` alone (no traced shapes): every site's rank, and the
  prompt's length at its position axis and the heads at its head axis, as the cached values have them."""
  model, _, tokens, _, cache = cached
  for site, (time_axis, head_axis, rank) in hooks.site_axes(model, list(cache), hooking=False).items():
    shape = np.shape(cache[site])
    assert len(shape) == rank, site
    if time_axis is not None:
      assert shape[time_axis] == tokens.shape[1], site
    if head_axis is not None:
      assert shape[head_axis] == model.config.num_heads, site


def test_the_cache_holds_every_named_site_with_the_models_own_values(cached):
  model, params, tokens, logits, cache = cached
  cfg = model.config
  assert list(cache) == hooks.valid_names(model)  # every site, in the order the pass meets them
  plain, inter = core.run(model, params, tokens)
  np.testing.assert_allclose(logits, np.asarray(model.apply({'params': params}, tokens)), rtol=1e-5, atol=1e-5)
  # The cache comes from a compiled pass, ``plain`` from an eager one: float32 rounding apart.
  np.testing.assert_allclose(cache['final.logits'], plain, rtol=1e-5, atol=1e-5)
  streams = core.streams(cfg, inter)
  for l in range(cfg.num_layers):
    np.testing.assert_allclose(cache[f'blocks.{l}.attn.pattern'], inter[f'blocks.{l}.attn.pattern'],
                               atol=1e-6)
    np.testing.assert_allclose(cache[f'blocks.{l}.resid'], streams[l + 1]['x'], rtol=1e-5, atol=1e-6)
    assert cache[f'blocks.{l}.attn.q'].shape == (2, 9, cfg.num_heads, cfg.head_dim)
    assert cache[f'blocks.{l}.attn.scores'].shape == (2, cfg.num_heads, 9, 9)
    if cfg.kind != 'standard':
      np.testing.assert_allclose(cache[f'blocks.{l}.x_t'], streams[l + 1]['x_t'], rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(cache[f'blocks.{l}.x_e'], streams[l + 1]['x_e'], rtol=1e-5, atol=1e-6)
      # The attention update is what changed X_t, and the FFN update what changed X_e.
      np.testing.assert_allclose(cache[f'blocks.{l}.attn.out'], streams[l + 1]['x_t'] - streams[l]['x_t'],
                                 rtol=1e-4, atol=1e-5)
      np.testing.assert_allclose(cache[f'blocks.{l}.ffn.out'], streams[l + 1]['x_e'] - streams[l]['x_e'],
                                 rtol=1e-4, atol=1e-5)
    if cfg.kind == 'symbolic':
      np.testing.assert_allclose(cache[f'blocks.{l}.attn.v_mixture'],
                                 inter[f'blocks.{l}.attn.v_mixture'], atol=1e-6)
      np.testing.assert_allclose(cache[f'blocks.{l}.ffn.mixture'],
                                 inter[f'blocks.{l}.ffn.mixture'], atol=1e-6)
  # Causal scores are -inf exactly where the pattern is masked.
  scores, pattern = cache['blocks.0.attn.scores'], cache['blocks.0.attn.pattern']
  assert np.all(np.isneginf(scores[..., np.triu_indices(9, 1)[0], np.triu_indices(9, 1)[1]]))
  np.testing.assert_allclose(pattern.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize('kind', KINDS)
def test_identity_hooks_everywhere_change_nothing(kind):
  model, params, tokens = model_and_params(kind)
  seen = []
  hookable = [n for n in hooks.valid_names(model) if kind == 'standard' or not n.endswith(('.resid', '.resid_mid'))]
  fns = {name: (lambda v, n: (seen.append(n), v)[1]) for name in hookable}
  logits = hooks.run_with_hooks(model, params, tokens, fns)
  np.testing.assert_allclose(logits, np.asarray(model.apply({'params': params}, tokens)), rtol=1e-5, atol=1e-5)
  assert seen == hookable


@pytest.mark.parametrize('kind', KINDS)
def test_zero_ablation_through_hooks_equals_the_ablation_interventions(kind):
  model, params, tokens = model_and_params(kind)
  cases = [({'blocks.1.attn.z': hooks.zero_head(2)}, interventions.Ablation('head', 1, 2, mode='zero')),
           ({'blocks.0.attn.out': lambda v, n: v * 0}, interventions.Ablation('attention', 0, mode='zero')),
           ({'blocks.1.ffn.out': lambda v, n: v * 0}, interventions.Ablation('ffn', 1, mode='zero'))]
  for fns, ablation in cases:
    want, _ = interventions.run_with(model, params, tokens, [ablation])
    got = hooks.run_with_hooks(model, params, tokens, fns)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(ablation))
    assert np.abs(got - hooks.run_with_hooks(model, params, tokens, {})).max() > 1e-4  # it did something


def test_a_loop_of_hooks_carrying_numbers_compiles_once():
  """Hooks are data: ``zero_head(h)``, ``functools.partial(fn, head=h)`` and an inline lambda reading a loop
  variable compile one program for all their values (compilations counted, not seconds), and each call gives
  the values of its own head."""
  model, params, tokens = model_and_params('standard', seed=5, vocab_size=17)
  plain = hooks.run_with_hooks(model, params, tokens, {})

  def zero(z, hook, head):
    return z.at[:, :, head].set(0)
  loops = {'zero_head': lambda h: hooks.zero_head(h), 'partial': lambda h: functools.partial(zero, head=h),
           'lambda': lambda h: (lambda z, name: zero(z, name, h))}
  results = {}
  for label, make in loops.items():
    with compilations() as count:
      results[label] = [hooks.run_with_hooks(model, params, tokens, {'blocks.0.attn.z': make(h)}) for h in range(3)]
    assert count() == 1, (label, count())
  for h in range(3):
    for label in loops:
      np.testing.assert_allclose(results[label][h], results['zero_head'][h], rtol=0, atol=1e-6)
    assert np.abs(results['zero_head'][h] - plain).max() > 1e-4  # each head's ablation did something
  assert np.abs(results['zero_head'][0] - results['zero_head'][1]).max() > 1e-4


def test_a_hook_needing_concrete_numbers_or_arrays_still_runs(capsys):
  """A number used as a slice bound is compiled per value; a hook reading NumPy runs eagerly and says so once."""
  model, params, tokens = model_and_params('standard', seed=5, vocab_size=17)

  def first_positions(v, name, k):
    return v.at[:, :k].set(0)
  for k in (2, 4):
    got = hooks.run_with_hooks(model, params, tokens, {'blocks.1.attn.out': functools.partial(first_positions, k=k)})
    want = hooks.run_with_hooks(model, params, tokens, {'blocks.1.attn.out': lambda v, n, k=k: v.at[:, :k].set(0)})
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)

  def in_numpy(v, name):
    return jnp.asarray(np.asarray(v) * 2)
  eager = [hooks.run_with_hooks(model, params, tokens, {'blocks.1.attn.out': in_numpy}) for _ in range(2)]
  want = hooks.run_with_hooks(model, params, tokens, {'blocks.1.attn.out': lambda v, n: v * 2})
  np.testing.assert_allclose(eager[1], want, rtol=1e-6, atol=1e-6)
  assert capsys.readouterr().err.count('in_numpy') == 1


def test_transformer_lens_in_place_hooks_run_as_written():
  """A hook that assigns in place (``z[:, :, h] = 0`` returning None, ``z[...] *= 0.5``, ``z *= 0``) gives the
  functional hook's values."""
  model, params, tokens = model_and_params('standard', seed=5, vocab_size=17)
  run = lambda fn, site='blocks.0.attn.z': hooks.run_with_hooks(model, params, tokens, {site: fn})

  def ablate(z, hook, head_index_to_ablate):
    z[:, :, head_index_to_ablate, :] = 0.

  def halve(z, hook):
    z[...] *= 0.5
    return z

  def erase(out, hook):
    out *= 0
  for h in range(3):
    np.testing.assert_allclose(run(functools.partial(ablate, head_index_to_ablate=h)), run(hooks.zero_head(h)),
                               rtol=0, atol=1e-6)
  np.testing.assert_allclose(run(halve), run(lambda z, n: z * 0.5), rtol=0, atol=1e-6)
  np.testing.assert_allclose(run(erase, 'blocks.1.attn.out'), run(lambda v, n: v * 0, 'blocks.1.attn.out'),
                             rtol=0, atol=1e-6)
  assert np.abs(run(halve) - run(lambda z, n: z)).max() > 1e-4


def test_a_mixture_hook_sets_the_values_to_its_tokens_embeddings():
  """Replacing α of the values with a one-hot on token 3 makes every head move E^(h)[3]: the output is the
  mixture of the new weights, not of the old ones."""
  model, params, tokens = model_and_params('symbolic')
  cfg = model.config
  one_hot = lambda v, n: jnp.zeros_like(v).at[..., 3].set(1.0)
  _, cache = hooks.run_with_cache(model, params, tokens, hooks={'blocks.0.attn.v_mixture': one_hot})
  table = np.asarray(params['embed']['embedding'])[3].reshape(cfg.num_heads, cfg.head_dim)
  np.testing.assert_allclose(cache['blocks.0.attn.values'], np.broadcast_to(table, (2, 9, *table.shape)),
                             rtol=1e-6, atol=1e-6)
  assert np.all(cache['blocks.0.attn.v_mixture'][..., 3] == 1.0)


def test_top_tokens_read_the_exact_mixture_and_the_lens_is_named_apart():
  model, params, tokens = model_and_params('symbolic')
  _, cache = hooks.run_with_cache(model, params, tokens)
  trace = mixtures.mixture_trace(model, params, tokens)
  weights = trace.x_e[2][0, -1, 1, :model.config.vocab_size]          # X_e after block 1, last position, head 1
  want = np.argsort(-weights, kind='stable')[:4]
  got = cache.top_tokens('blocks.1.x_e', -1, head=1, k=4)
  assert [t for t, _ in got] == list(want) and np.allclose([w for _, w in got], weights[want])
  alpha = cache['blocks.0.ffn.mixture'][1, 4, 0, :model.config.vocab_size]
  assert [t for t, _ in cache.top_tokens('blocks.0.ffn.mixture', 4, head=0, k=2, batch=1)] == list(
      np.argsort(-alpha, kind='stable')[:2])
  assert set(cache.top_tokens('blocks.0.x_t', 0)) == set(range(model.config.num_heads))
  lens = cache.lens_top_tokens('blocks.1.x_e', -1, head=1, k=3)
  assert len(lens) == 3 and all(0 <= w <= 1 for _, w in lens)


def test_decompose_sums_to_the_logits():
  model, params, tokens = model_and_params('symbolic')
  logits, cache = hooks.run_with_cache(model, params, tokens)
  parts = cache.decompose(-1)
  np.testing.assert_allclose(sum(parts.values()), logits[:, -1], rtol=1e-4, atol=1e-4)


def test_loss_return_type_is_the_next_token_cross_entropy():
  model, params, tokens = model_and_params('token_factored')
  logits = np.asarray(model.apply({'params': params}, tokens), np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  want = -np.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1).mean()
  assert hooks.run_with_hooks(model, params, tokens, {}, return_type='loss') == pytest.approx(want, rel=1e-5)


def test_bad_names_positions_heads_and_hooks_are_one_line_errors():
  model, params, tokens = model_and_params('symbolic')
  with pytest.raises(InputError, match=r"unknown site name 'blocks.0.attn.pattrn'; this symbolic model has \['embed'"):
    hooks.run_with_hooks(model, params, tokens, {'blocks.0.attn.pattrn': lambda v, n: v})
  with pytest.raises(InputError, match=r"unknown site name 'blocks.2.attn.q'"):
    hooks.run_with_cache(model, params, tokens, ['blocks.2.attn.q'])
  _, cache = hooks.run_with_cache(model, params, tokens, ['blocks.0.x_e', 'blocks.0.attn.pattern'])
  assert set(cache) == {'blocks.0.x_e', 'blocks.0.attn.pattern'}
  with pytest.raises(KeyError, match="'blocks.1.x_e' is not in this cache"):
    cache['blocks.1.x_e']
  with pytest.raises(InputError, match=r'position 9 is outside the input of 9 tokens \(allowed: -9..8\)'):
    cache.top_tokens('blocks.0.x_e', 9)
  with pytest.raises(InputError, match=r'head 3 is out of range: the model has heads 0..2'):
    cache.top_tokens('blocks.0.x_e', 0, head=3)
  with pytest.raises(InputError, match='has no exact mixture'):
    cache.top_tokens('blocks.0.attn.pattern', 0)
  with pytest.raises(InputError, match=r'returned shape \(3,\); the site has \(2, 9, 12\)'):
    hooks.run_with_hooks(model, params, tokens, {'blocks.0.ffn.pre': lambda v, n: jnp.zeros(3)})
  with pytest.raises(InputError, match='read-only in a two-stream model'):
    hooks.run_with_hooks(model, params, tokens, {'blocks.0.resid': lambda v, n: v})
  with pytest.raises(InputError, match=r'token ids must be in \[0, 13\)'):
    hooks.run_with_cache(model, params, np.array([[1, 13]]))
  with pytest.raises(InputError, match="return_type must be one of"):
    hooks.run_with_hooks(model, params, tokens, {}, return_type='probs')
  tf_model, tf_params, _ = model_and_params('token_factored')
  with pytest.raises(InputError, match='not exact token mixtures'):
    hooks.run_with_cache(tf_model, tf_params, tokens)[1].top_tokens('blocks.0.x_e', 0)
