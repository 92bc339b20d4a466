"""Each module against the NumPy transcription of the paper's equations (float32, rel. error <= 1e-5)."""

import re

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import paper_reference as ref
import pytest
from helpers import f64, randomize, shapes_of

from symjax.model import attention as attn
from symjax.model import intermediates as names
from symjax.model import masks, symbolic
from symjax.model.transformer import Dense
from symjax.ops import attention as attention_ops
from symjax.ops import dense

TOL = 1e-5


@pytest.mark.parametrize('num_heads', [1, 2, 3, 4, 5, 6, 8, 12, 16, 24])
def test_alibi_slopes_match_reference_sequence(num_heads):
  np.testing.assert_allclose(attn.alibi_slopes(num_heads), ref.alibi_slopes(num_heads), rtol=1e-12)


def test_alibi_slopes_for_six_heads_use_the_interleaved_extension():
  # 4 heads' slopes, then every other slope of the 8-head sequence.
  np.testing.assert_allclose(attn.alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])


@pytest.mark.parametrize('learned', [True, False])
def test_alibi_bias_is_minus_slope_times_distance(learned):
  module = attn.ALiBi(num_heads=6, learned=learned)
  variables = module.init(jax.random.key(0), 5, 7)
  assert ('log_slope' in variables.get('params', {})) == learned
  if learned:  # random log-slopes: slopes stay positive whatever the parameter
    variables = {'params': {'log_slope': jnp.array([-9.0, -1.0, 0.0, 0.5, 3.0, -20.0])}}
  bias = module.apply(variables, 5, 7)
  chex.assert_shape(bias, (6, 5, 7))
  slopes = f64(module.apply(variables, method=attn.ALiBi.slopes))
  assert np.all(slopes > 0)
  for h in range(6):
    for i in range(5):
      for j in range(7):
        np.testing.assert_allclose(bias[h, i, j], -slopes[h] * abs(i - j), rtol=1e-6)


def test_alibi_initial_slopes_are_reference():
  module = attn.ALiBi(num_heads=12)
  variables = module.init(jax.random.key(0), 2, 2)
  np.testing.assert_allclose(module.apply(variables, method=attn.ALiBi.slopes), ref.alibi_slopes(12),
                             rtol=1e-6)


def test_mask_predicates_compose():
  t = 9
  m = (masks.causal & masks.sliding_window(3)) | (masks.causal & masks.strided(4))
  got = np.asarray(m.matrix(t))
  want = np.array([[(j <= i and i - j < 3) or (j <= i and (i - j) % 4 == 0) for j in range(t)]
                   for i in range(t)])
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(np.asarray((~masks.causal).matrix(t)), ~np.tril(np.ones((t, t), bool)))
  assert np.asarray(masks.full.matrix(3, 5)).all()
  with pytest.raises(ValueError, match='width'):
    masks.sliding_window(0)


def test_attention_with_no_allowed_key_gives_zero_weights_not_nan():
  q = jnp.ones((1, 3, 1, 2))
  mask = jnp.array([[False, False, False], [True, False, False], [True, True, False]])
  out, w = attention_ops.dot_product_attention(q, q, q, None, mask[None, None])
  assert np.isfinite(np.asarray(out)).all()
  np.testing.assert_array_equal(np.asarray(w[0, 0, 0]), 0.0)
  np.testing.assert_allclose(np.asarray(w[0, 0, 2]), [0.5, 0.5, 0.0])


@pytest.mark.parametrize('init', ['identity', 'normal'])
def test_kronecker_value_matches_explicit_kronecker_product(init):
  num_heads, head_dim = 4, 3
  module = symbolic.KroneckerValue(num_heads, init)
  x = jax.random.normal(jax.random.key(1), (2, 5, num_heads * head_dim))
  variables = module.init(jax.random.key(0), x)
  w = variables['params']['w_head']
  chex.assert_shape(w, (num_heads, num_heads))  # exactly H² parameters
  assert sum(p.size for p in jax.tree.leaves(variables)) == num_heads ** 2
  if init == 'identity':
    np.testing.assert_array_equal(w, np.eye(num_heads))
  variables = randomize(variables, 2)
  got = module.apply(variables, x)
  chex.assert_shape(got, (2, 5, num_heads, head_dim))
  want = ref.kronecker_value(f64(x), f64(variables['params']['w_head']), head_dim)
  assert ref.rel_err(got.reshape(2, 5, -1), want) <= TOL


@pytest.mark.slow
@pytest.mark.parametrize('scale', ['vector', 'scalar'])
@pytest.mark.parametrize('eps', [1e-5, 0.1])  # a large ε tells σ + ε (eq. 18) from sqrt(σ² + ε)
def test_channel_layer_norm_matches_eq_18(scale, eps):
  num_heads, head_dim = 3, 8
  module = symbolic.ChannelLayerNorm(num_heads, scale, epsilon=eps)
  x = 3.0 * jax.random.normal(jax.random.key(1), (4, 6, num_heads * head_dim)) + 1.0
  variables = randomize(shapes_of(module, x), 3)
  p = variables['params']
  chex.assert_shape(p['scale'], (num_heads, head_dim) if scale == 'vector' else (num_heads, 1))
  want = ref.channel_layer_norm(f64(x), f64(p['scale']), f64(p['bias']), num_heads, eps)
  assert ref.rel_err(module.apply(variables, x), want) <= TOL


def test_channel_layer_norm_differs_from_full_layer_norm():
  # Statistics are per channel: two channels of very different scale are normalised separately.
  x = jnp.concatenate([jnp.arange(4.0), 100.0 * jnp.arange(4.0)])[None]
  module = symbolic.ChannelLayerNorm(2)
  y = np.asarray(module.apply(module.init(jax.random.key(0), x), x))
  np.testing.assert_allclose(y[0, :4], y[0, 4:], rtol=1e-5)


@pytest.mark.slow
def test_vocab_projection_matches_eqs_21_22_and_is_a_convex_mixture():
  num_heads, head_dim, vocab = 3, 4, 11
  module = symbolic.VocabProjection(num_heads, tau_init=0.7)
  z = jax.random.normal(jax.random.key(1), (2, 5, num_heads, head_dim))
  table = jax.random.normal(jax.random.key(2), (vocab, num_heads * head_dim))
  variables = randomize(shapes_of(module, z, table), 4)
  out, state = module.apply(variables, z, table, mutable=['intermediates'])
  alpha = np.asarray(names.flat(state['intermediates'])['ffn.mixture'])
  chex.assert_shape(alpha, (2, 5, num_heads, vocab))
  tau = np.exp(f64(variables['params']['log_tau']))
  for h in range(num_heads):
    e_h = f64(table)[:, h * head_dim:(h + 1) * head_dim]
    want, want_alpha = ref.vocab_projection(f64(z)[..., h, :], e_h, tau[h])
    assert ref.rel_err(out[..., h, :], want) <= TOL
    assert ref.rel_err(alpha[..., h, :], want_alpha) <= TOL
    # The output is exactly α_h E^(h) with α_h a probability vector (eq. 23).
    np.testing.assert_allclose(out[..., h, :], alpha[..., h, :] @ e_h, rtol=1e-5, atol=1e-6)
  assert (alpha >= 0).all()
  np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-6)


def test_nonnegative_vocab_projection_matches_its_transcription_and_has_free_mass():
  """ffn_mixture='nonnegative' (opt-in): α = softplus(z E^(h)ᵀ / τ_h) / |V|, output α E^(h); every weight
  positive, padding rows zero, and the mass Σ α not fixed at 1."""
  num_heads, head_dim, vocab, valid = 3, 4, 11, 9
  module = symbolic.VocabProjection(num_heads, tau_init=0.7, num_valid=valid, weights='nonnegative')
  z = jax.random.normal(jax.random.key(1), (2, 5, num_heads, head_dim))
  table = jax.random.normal(jax.random.key(2), (vocab, num_heads * head_dim))
  variables = randomize(shapes_of(module, z, table), 4)
  out, state = module.apply(variables, z, table, mutable=['intermediates'])
  alpha = f64(names.flat(state['intermediates'])['ffn.mixture'])
  tau = np.exp(f64(variables['params']['log_tau']))
  for h in range(num_heads):
    e_h = f64(table)[:valid, h * head_dim:(h + 1) * head_dim]
    logits = f64(z)[..., h, :] @ e_h.T / tau[h]
    want_alpha = np.logaddexp(0.0, logits) / valid          # softplus, written independently
    assert ref.rel_err(alpha[..., h, :valid], want_alpha) <= TOL
    assert ref.rel_err(out[..., h, :], want_alpha @ e_h) <= TOL
  assert (alpha[..., :valid] > 0).all() and (alpha[..., valid:] == 0).all()
  assert alpha.sum(-1).std() > 0.01                         # the mass varies from token to token
  with pytest.raises(ValueError, match="direct projection only"):
    bad = symbolic.VocabProjection(num_heads, impl='streamed', weights='nonnegative')
    bad.init(jax.random.key(0), z, table)
  with pytest.raises(ValueError, match="model.ffn_mixture must be one of"):
    bad = symbolic.VocabProjection(num_heads, weights='signed')
    bad.init(jax.random.key(0), z, table)


def test_vocab_ffn_matches_eqs_19_22():
  num_heads, head_dim, ff, vocab = 3, 4, 5, 9
  module = symbolic.VocabFFN(num_heads, ff, tau_init=1.3)
  x = jax.random.normal(jax.random.key(1), (2, 6, num_heads * head_dim))
  table = jax.random.normal(jax.random.key(2), (vocab, num_heads * head_dim))
  variables = randomize(shapes_of(module, x, table), 5)
  p = jax.tree.map(f64, variables['params'])
  out, state = module.apply(variables, x, table, mutable=['intermediates'])
  want, want_alphas = ref.vocab_ffn(f64(x), p['w1'], p['b1'], p['w2'], p['b2'], f64(table),
                                    np.exp(p['projection']['log_tau']), num_heads)
  assert ref.rel_err(out, want) <= TOL
  alpha = names.flat(state['intermediates'])['ffn.mixture']
  for h in range(num_heads):
    assert ref.rel_err(alpha[..., h, :], want_alphas[h]) <= TOL


@pytest.mark.parametrize('causal', [True, False])
def test_factored_attention_matches_eq_11(causal):
  """Q, K from the given input, values supplied, ALiBi with learned slopes, no output projection."""
  num_heads, head_dim, t = 3, 4, 6
  d = num_heads * head_dim
  module = attn.Attention(num_heads, head_dim, mask=masks.causal if causal else masks.full)
  x = jax.random.normal(jax.random.key(1), (2, t, d))
  v = jax.random.normal(jax.random.key(2), (2, t, num_heads, head_dim))
  variables = randomize(shapes_of(module, x, v), 6)
  p = jax.tree.map(f64, variables['params'])
  assert set(p) == {'query', 'key', 'alibi'}  # no value or output projection
  out, state = module.apply(variables, x, v, mutable=['intermediates'])
  w = names.flat(state['intermediates'])['attn.pattern']
  for b in range(2):
    want, want_w = ref.attention(f64(x[b]) @ p['query']['kernel'].reshape(d, d),
                                 f64(x[b]) @ p['key']['kernel'].reshape(d, d),
                                 f64(v[b]).reshape(t, d), np.exp(p['alibi']['log_slope']), num_heads,
                                 causal)
    assert ref.rel_err(out[b], want) <= TOL
    assert ref.rel_err(w[b], want_w) <= TOL


@pytest.mark.slow
def test_attention_key_mask_removes_padding_keys():
  module = attn.Attention(2, 4, mask=masks.full)
  x = jax.random.normal(jax.random.key(1), (1, 5, 8))
  variables = module.init(jax.random.key(0), x)
  key_mask = jnp.array([[True, True, True, False, False]])
  _, state = module.apply(variables, x, key_mask=key_mask, mutable=['intermediates'])
  w = np.asarray(names.flat(state['intermediates'])['attn.pattern'])
  np.testing.assert_array_equal(w[..., 3:], 0.0)
  np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_parameters():
  module = symbolic.VocabFFN(2, 4, dtype=jnp.bfloat16)
  x = jnp.ones((1, 3, 8), jnp.bfloat16)
  table = jax.random.normal(jax.random.key(0), (5, 8))
  variables = module.init(jax.random.key(0), x, table)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(variables))
  assert module.apply(variables, x, table).dtype == jnp.bfloat16


def test_module_arguments_are_validated():
  x = jnp.ones((1, 2, 4))
  with pytest.raises(ValueError, match="init must be one of"):
    symbolic.KroneckerValue(2, 'orthogonal').init(jax.random.key(0), x)
  with pytest.raises(ValueError, match="scale must be 'vector' or 'scalar'"):
    symbolic.ChannelLayerNorm(2, 'matrix').init(jax.random.key(0), x)
  with pytest.raises(ValueError, match='vocab_projection must be one of'):
    symbolic.VocabProjection(2, impl='fast').init(jax.random.key(0), x.reshape(1, 2, 2, 2), x[0])


def test_dense_bias_gradient_from_the_product_equals_autodiffs():
  """x W + b with [dW; db] = [x, 1]ᵀ dy as one product: the gradients of the textbook layer, float32
  and bfloat16 (in the compute dtype), and on the CPU backend the layer's own backward pass is this one."""
  keys = jax.random.split(jax.random.key(0), 4)
  x, w, b = (jax.random.normal(k, s) for k, s in zip(keys, [(3, 7, 5), (5, 6), (6,)]))
  cot = jax.random.normal(keys[3], (3, 7, 6))
  grads = lambda f, *args: jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * cot), argnums=(0, 1, 2))(*args)
  want = [f64(g) for g in grads(lambda x, w, b: x @ w + b, x, w, b)]
  np.testing.assert_allclose(f64(cot).sum((0, 1)), want[2], rtol=1e-6)  # db is the column sum
  for got, expected in zip(grads(dense.bias_gradient_in_product, x, w, b), want):
    assert ref.rel_err(got, expected) <= TOL
  low = grads(dense.bias_gradient_in_product, *(a.astype(jnp.bfloat16) for a in (x, w, b)))
  for got, expected in zip(low, want):
    assert got.dtype == jnp.bfloat16 and ref.rel_err(f64(got), expected) <= 3e-2
  assert ref.rel_err(dense.bias_gradient_in_product(x, w, b), f64(x) @ f64(w) + f64(b)) <= TOL
  uses_product = 'custom_vjp' in str(jax.make_jaxpr(dense.biased_dense)(x, w, b))
  assert uses_product == (jax.default_backend() == 'cpu')


def test_plain_operand_product_gradients_are_the_textbook_ones():
  """x W whose backward pass reads copies of Wᵀ and xᵀ: dx = dy Wᵀ and dW = xᵀ dy against float64 NumPy,
  float32 and bfloat16; on the CPU backend ``product`` uses it, and every product of its compiled backward
  pass contracts a row-major operand's rows with a column-major one's columns (no transpose folded in)."""
  keys = jax.random.split(jax.random.key(3), 3)
  x, w, cot = (jax.random.normal(k, s) for k, s in zip(keys, [(3, 7, 5), (5, 6), (3, 7, 6)]))
  dx_want = np.einsum('btn,kn->btk', f64(cot), f64(w))
  dw_want = np.einsum('btk,btn->kn', f64(x), f64(cot))
  grads = lambda *args: jax.grad(lambda x, w: jnp.sum(dense.plain_operand_product(x, w).astype(jnp.float32) * cot),
                                 argnums=(0, 1))(*args)
  dx, dw = grads(x, w)
  assert ref.rel_err(dx, dx_want) <= TOL and ref.rel_err(dw, dw_want) <= TOL
  assert ref.rel_err(dense.plain_operand_product(x, w), f64(x) @ f64(w)) <= TOL
  low = grads(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
  assert all(g.dtype == jnp.bfloat16 for g in low)
  assert ref.rel_err(f64(low[0]), dx_want) <= 3e-2 and ref.rel_err(f64(low[1]), dw_want) <= 3e-2
  assert ('custom_vjp' in str(jax.make_jaxpr(dense.product)(x, w))) == (jax.default_backend() == 'cpu')
  if jax.default_backend() == 'cpu':
    hlo = jax.jit(grads).lower(x, w).compile().as_text()
    dims = re.findall(r'lhs_contracting_dims=\{(\d+)\}, rhs_contracting_dims=\{(\d+)\}', hlo)
    assert dims and all(d == ('1', '0') for d in dims), dims


def test_projection_is_dense_general_without_bias():
  """Attention's projections keep nn.DenseGeneral's parameter (name, shape, logical axes, initial values)
  and compute what it computes, values and gradients: [..., d] -> heads, and heads -> [..., d]."""
  init = nn.with_logical_partitioning(nn.initializers.normal(0.02), ('embed', 'heads', 'head_dim'))
  x = jax.random.normal(jax.random.key(4), (2, 5, 8))
  for ours, theirs, inputs in [
      (attn.Projection((2, 4), kernel_init=init), nn.DenseGeneral((2, 4), use_bias=False, kernel_init=init), x),
      (attn.Projection(8, in_axes=2, kernel_init=init),
       nn.DenseGeneral(8, axis=(-2, -1), use_bias=False, kernel_init=init), x.reshape(2, 5, 2, 4))]:
    p, q = ours.init(jax.random.key(5), inputs), theirs.init(jax.random.key(5), inputs)
    assert p['params']['kernel'].names == q['params']['kernel'].names
    chex.assert_trees_all_equal(nn.meta.unbox(p), nn.meta.unbox(q))
    loss = lambda m: lambda params, h: jnp.sum(jnp.sin(m.apply(params, h)))
    assert ref.rel_err(ours.apply(p, inputs), f64(theirs.apply(q, inputs))) <= TOL
    for got, want in zip(jax.tree.leaves(jax.grad(loss(ours), argnums=(0, 1))(p, inputs)),
                         jax.tree.leaves(jax.grad(loss(theirs), argnums=(0, 1))(q, inputs))):
      assert ref.rel_err(got, f64(want)) <= TOL


def test_projection_pads_read_and_write_zeros_and_keep_the_parameter():
  """in_pad / out_pad widen the product, not the parameter: the padded output's extra widths are zero,
  the extra input widths are not read, and values and gradients are the unpadded projection's."""
  x = jax.random.normal(jax.random.key(4), (2, 5, 8))
  narrow, out_wide = attn.Projection((2, 4)), attn.Projection((2, 4), out_pad=3)
  p = randomize(shapes_of(narrow, x), 3)
  assert jax.tree.map(jnp.shape, out_wide.init(jax.random.key(5), x)) == jax.tree.map(jnp.shape, p)
  got, want = out_wide.apply(p, x), narrow.apply(p, x)
  assert got.shape == (2, 5, 2, 7) and not np.any(np.asarray(got[..., 4:]))
  assert ref.rel_err(got[..., :4], f64(want)) <= TOL
  h = jax.random.normal(jax.random.key(6), (2, 5, 2, 4))
  h_wide = jnp.concatenate([h, jax.random.normal(jax.random.key(7), (2, 5, 2, 3))], -1)  # never read
  reader, in_wide = attn.Projection(8, in_axes=2), attn.Projection(8, in_axes=2, in_pad=3)
  r = randomize(shapes_of(reader, h), 3)
  assert ref.rel_err(in_wide.apply(r, h_wide), f64(reader.apply(r, h))) <= TOL
  loss = lambda m, cut: lambda params, a: jnp.sum(jnp.sin(m.apply(params, a)[..., :cut]))
  for got, want in [(jax.grad(loss(out_wide, 4))(p, x), jax.grad(loss(narrow, 4))(p, x)),
                    (jax.grad(loss(in_wide, 8))(r, h_wide), jax.grad(loss(reader, 8))(r, h))]:
    assert ref.rel_err(got['params']['kernel'], f64(want['params']['kernel'])) <= TOL


def test_mlp_dense_layers_have_flax_dense_parameters():
  """The MLP's layers keep nn.Dense's parameter names, shapes and initial values (checkpoints and every
  reader of 'wi' / 'wo' see the same tree) and compute x W + b."""
  x = jax.random.normal(jax.random.key(1), (2, 4, 8))
  ours, flax_dense = Dense(16, name='wi'), nn.Dense(16, name='wi')
  p_ours, p_flax = ours.init(jax.random.key(2), x), flax_dense.init(jax.random.key(2), x)
  chex.assert_trees_all_equal(p_ours, p_flax)
  p = randomize(p_flax, 3)
  np.testing.assert_allclose(f64(ours.apply(p, x)), f64(flax_dense.apply(p, x)), rtol=1e-5, atol=1e-6)
