"""Fused attention and the attention-form vocabulary projection equal the explicit computations.

On any backend the fused path is checked through ``jax.nn.dot_product_attention``'s XLA implementation
(float32, tight tolerances): the same call the cuDNN path makes, so the masks, the ALiBi bias, the key mask,
the scale and τ are checked here. The cuDNN kernels themselves are checked on an NVIDIA GPU (bfloat16).
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import paper_reference as ref
import pytest
from helpers import randomize, shapes_of

from symjax.model import ModelConfig, Transformer, symbolic
from symjax.model import intermediates as names
from symjax.ops import attention, readout

TOL = 1e-5
CFG = ModelConfig.of(vocab_size=13, num_layers=2, num_heads=3, head_dim=4, ff_dim=10, ff_dim_per_head=5,
                  max_len=8)
on_gpu = pytest.mark.skipif(jax.default_backend() != 'gpu', reason='cuDNN kernels need an NVIDIA GPU')


def tokens_and_mask(batch=2, t=8):
  tokens = jax.random.randint(jax.random.key(3), (batch, t), 0, CFG.vocab_size)
  key_mask = jnp.ones((batch, t), bool).at[1, :3].set(False)  # row 1: three padding keys on the left
  return tokens, key_mask


@functools.partial(jax.jit, static_argnums=0)
def _logits_and_grads(cfg, variables, tokens, key_mask):
  model = Transformer(cfg)

  def loss(params):
    # Only real (non-padding) positions count: a padding query may read nothing in the explicit path.
    logits = model.apply({'params': params}, tokens, key_mask)
    return jnp.sum(jnp.where(key_mask[..., None], jnp.sin(logits), 0.0)), logits

  return jax.grad(loss, has_aux=True)(variables['params'])


@pytest.mark.parametrize('kind, change', [
    ('standard', {}),
    ('standard', {'positions': 'learned'}),
    ('token_factored', {}),
    ('symbolic', {}),
    ('token_factored', {'mask': 'causal & window(3)'}),
    ('standard', {'causal': False}),
])
@pytest.mark.slow
def test_fused_attention_equals_explicit_with_gradients(kind, change):
  cfg = CFG.replace(kind=kind, **change)
  tokens, key_mask = tokens_and_mask()
  variables = randomize(shapes_of(Transformer(cfg), tokens), 4, scale=0.4)
  grads, logits = _logits_and_grads(cfg, variables, tokens, key_mask)
  fused_grads, fused_logits = _logits_and_grads(cfg.replace(attention_impl='xla'), variables,
                                                tokens, key_mask)
  real = np.asarray(key_mask)
  assert ref.rel_err(np.asarray(fused_logits)[real], np.asarray(logits)[real]) <= TOL
  for g, f in zip(jax.tree.leaves(grads), jax.tree.leaves(fused_grads)):
    assert ref.rel_err(f, g) <= TOL


def _alibi_fused(q, k, v, slopes, dtype=jnp.float32):
  causal = np.tril(np.ones((1, q.shape[1], q.shape[1]), bool))
  cast = lambda x: x.astype(dtype)
  return attention.fused_attention(cast(q), cast(k), cast(v), None, causal, None, 'xla', slopes
                                   ).astype(jnp.float32)


def test_alibi_in_the_products_is_the_papers_attention():
  """Causal ALiBi carried by widened queries and keys (no bias tensor) against the paper's eq. 11, with
  key positions past one base-32 digit."""
  t, heads, d = 70, 2, 4
  q, k, v = (jax.random.normal(key, (1, t, heads, d)) for key in jax.random.split(jax.random.key(7), 3))
  slopes = jnp.array([0.5, 0.03])
  wide = attention.alibi_in_products(q, k, v, slopes)
  assert [x.shape[-1] for x in wide] == [attention.alibi_head_dim(d)] * 3 == [8] * 3
  want, _ = ref.attention(*(np.asarray(x[0], np.float64).reshape(t, heads * d) for x in (q, k, v)),
                          np.asarray(slopes, np.float64), heads, causal=True)
  got = _alibi_fused(q, k, v, slopes)
  assert got.shape == q.shape
  assert ref.rel_err(np.asarray(got[0]).reshape(t, heads * d), want) <= TOL


def test_values_as_wide_as_the_alibi_kernel_give_its_output_with_zeros_after():
  """Values already at the widened kernel's width (zeros after the heads' widths) give the output at that
  width: the narrow output, then zeros, so that an output projection can read it with zero rows. A width
  that is neither the heads' nor the kernel's is an error."""
  t, heads, d = 40, 2, 4
  q, k, v = (jax.random.normal(key, (1, t, heads, d)) for key in jax.random.split(jax.random.key(5), 3))
  slopes = jnp.array([0.4, 0.05])
  width = attention.kernel_width(np.tril(np.ones((1, t, t), bool)), t, d, 'xla', True)
  assert width == attention.alibi_head_dim(d) == 8
  assert attention.kernel_width(np.ones((1, t, t), bool), t, d, 'xla', True) == d  # keys after the query
  assert attention.kernel_width(np.tril(np.ones((1, t, t), bool)), t, d, 'xla', False) == d
  wide = _alibi_fused(q, k, jnp.pad(v, [(0, 0)] * 3 + [(0, width - d)]), slopes)
  assert wide.shape == (1, t, heads, width) and not np.any(np.asarray(wide[..., d:]))
  np.testing.assert_array_equal(wide[..., :d], _alibi_fused(q, k, v, slopes))
  with pytest.raises(ValueError, match='values 6 wide, but the queries are 4 and the kernel 8'):
    _alibi_fused(q, k, jnp.pad(v, [(0, 0)] * 3 + [(0, 2)]), slopes)


@pytest.mark.parametrize('kind, change, width', [
    ('standard', {}, 8),                          # ALiBi in the products: the kernel runs 8 wide
    ('standard', {'positions': 'learned'}, 4),
    ('token_factored', {}, 4),                     # values from X_t, no output projection
])
def test_the_standard_model_projects_values_and_output_at_the_fused_kernels_width(monkeypatch, kind, change,
                                                                                     width):
  """Where ALiBi rides in the products the standard model's value projection writes the kernel's width and
  its output projection reads it, so no pad or slice copies the values or the output between the products
  and the kernel; the parameters keep the heads' width."""
  seen, fused = [], attention.fused_attention

  def recorded(q, k, v, *args, **kw):
    out = fused(q, k, v, *args, **kw)
    seen.append((v.shape[-1], out.shape[-1]))
    return out

  monkeypatch.setattr(attention, 'fused_attention', recorded)
  cfg = CFG.replace(kind=kind, attention_impl='xla', num_layers=1, **change)
  tokens, key_mask = tokens_and_mask()
  params = Transformer(cfg).init(jax.random.key(0), tokens)['params']
  explicit = Transformer(cfg.replace(attention_impl='explicit')).init(jax.random.key(0), tokens)
  chex.assert_trees_all_equal_shapes(params, explicit['params'])
  seen.clear()
  Transformer(cfg).apply({'params': params}, tokens, key_mask)
  assert seen == [(width, width)]


def test_alibi_in_the_products_gives_the_slopes_the_bias_gradient_of_any_score_gradient():
  """A fused kernel hands back dq' = dS k' / sqrt(d) from its score gradient dS, which it may have rounded
  (flash kernels round dS to 16 bits before that product), so a row of dS need not sum to zero. Through
  the widened queries the slopes must still get the bias's gradient -Σ_ij dS_ij |i - j|, not Σ_ij dS_ij j:
  with the row dimension's -m_h i they do, for any dS."""
  b, t, heads, d = 2, 300, 2, 8
  keys = jax.random.split(jax.random.key(9), 4)
  q, k, v = (jax.random.normal(key, (b, t, heads, d)) for key in keys[:3])
  ds = jnp.tril(jax.random.normal(keys[3], (b, heads, t, t)))  # rows far from summing to zero
  slopes = jnp.array([0.3, 0.01])
  wide_q, vjp = jax.vjp(lambda s: attention.alibi_in_products(q, k, v, s)[0], slopes)
  wide_k = attention.alibi_in_products(q, k, v, slopes)[1]
  assert wide_q.shape == wide_k.shape == (b, t, heads, attention.alibi_head_dim(d))
  (got,) = vjp(jnp.einsum('bhij,bjhe->bihe', ds, wide_k) / np.sqrt(d))
  distance = np.abs(np.arange(t)[:, None] - np.arange(t)[None, :])
  want = -np.einsum('bhij,ij->h', np.asarray(ds, np.float64), distance)
  assert ref.rel_err(got, want) <= TOL


@pytest.mark.slow
def test_alibi_in_the_products_is_as_close_as_a_bias_in_bfloat16():
  """Over 1024 positions (two base-32 digits) in bfloat16, the outputs and every gradient through the
  widened products are as close to float32 as through the bfloat16 bias."""
  t, heads, d = 1024, 2, 64
  keys = jax.random.split(jax.random.key(8), 4)
  q, k, v, cot = (jax.random.normal(key, (1, t, heads, d)) for key in keys)
  slopes = jnp.array([0.5, 0.02])
  causal = np.tril(np.ones((1, t, t), bool))
  distance = jnp.abs(jnp.arange(t)[:, None] - jnp.arange(t)[None, :]).astype(jnp.float32)

  def with_bias(q, k, v, slopes, dtype=jnp.float32):
    bias = -slopes[:, None, None] * distance[None]
    cast = lambda x: x.astype(dtype)
    return attention.fused_attention(cast(q), cast(k), cast(v), bias, causal, None, 'xla').astype(jnp.float32)

  def outputs_and_grads(f, **kw):
    out, vjp = jax.vjp(lambda *x: f(*x, **kw), q, k, v, slopes)
    return (out, *vjp(cot))

  want = outputs_and_grads(with_bias)
  assert ref.rel_err(outputs_and_grads(_alibi_fused)[4], want[4]) <= 1e-4  # a float32 sum over 1024² pairs
  biased, folded = outputs_and_grads(with_bias, dtype=jnp.bfloat16), outputs_and_grads(_alibi_fused,
                                                                                        dtype=jnp.bfloat16)
  for name, w, b, f in zip(('out', 'q', 'k', 'v', 'slopes'), want, biased, folded):
    assert ref.rel_err(f, w) <= max(1e-2, 2 * ref.rel_err(b, w)), name


def test_weights_are_read_explicitly_whatever_the_setting():
  cfg = CFG.replace(kind='token_factored', attention_impl='xla')
  tokens, key_mask = tokens_and_mask()
  model = Transformer(cfg)
  variables = model.init(jax.random.key(0), tokens)
  _, inter = model.apply(variables, tokens, key_mask, mutable=['intermediates'])
  weights = names.flat(inter['intermediates'])['blocks.0.attn.pattern']
  assert weights.shape == (2, 3, 8, 8)
  np.testing.assert_allclose(np.asarray(weights).sum(-1)[0], 1.0, rtol=1e-6)
  assert float(jnp.abs(jnp.triu(weights, 1)).max()) == 0.0  # causal


@pytest.mark.slow
@pytest.mark.parametrize('num_valid', [None, 9])
def test_attention_form_projection_equals_direct_with_all_gradients(num_valid):
  keys = jax.random.split(jax.random.key(0), 3)
  z = jax.random.normal(keys[0], (2, 5, 3, 8))
  table = jax.random.normal(keys[1], (11, 3, 8))
  tau = jnp.array([0.5, 1.0, 2.0])
  cot = jax.random.normal(keys[2], z.shape)

  def run(project):
    f = lambda z, table, tau: jnp.sum(project(z, table, tau, 0, num_valid)[0] * cot)
    return project(z, table, tau, 0, num_valid)[0], jax.grad(f, argnums=(0, 1, 2))(z, table, tau)

  out, grads = run(symbolic.direct_vocab_projection)
  out_a, grads_a = run(functools.partial(symbolic.attention_vocab_projection, implementation='xla'))
  assert ref.rel_err(out_a, out) <= TOL
  for g, a in zip(grads, grads_a):
    assert ref.rel_err(a, g) <= TOL
  if num_valid is not None:  # padding rows get no weight, so no gradient either
    np.testing.assert_array_equal(np.asarray(grads_a[1])[num_valid:], 0.0)


@pytest.mark.parametrize('change, message', [
    ({'attention_impl': 'flash'}, r"model.attention_impl must be one of \['explicit', 'xla', 'cudnn'\]"),
    ({'attention_impl': 'cudnn'}, r"model.attention_impl='cudnn' needs model.dtype='bfloat16'"),
    ({'vocab_projection': 'cudnn'}, r"model.vocab_projection='cudnn' needs model.dtype='bfloat16'"),
])
def test_implementation_fields_are_checked(change, message):
  with pytest.raises(ValueError, match=message):
    ModelConfig.from_dict(CFG.flat() | change)


@pytest.mark.skipif(jax.default_backend() == 'gpu', reason='the error is for backends without cuDNN')
def test_cudnn_without_a_gpu_is_a_clear_error():
  cfg = CFG.replace(kind='symbolic', dtype='bfloat16', attention_impl='cudnn')
  tokens, _ = tokens_and_mask()
  with pytest.raises(ValueError, match=r"model.attention_impl='cudnn' needs an NVIDIA GPU .* backend is 'cpu'; "
                                       r"the portable choices are \['explicit', 'xla'\]"):
    Transformer(cfg).init(jax.random.key(0), tokens)
  cfg = cfg.replace(attention_impl='explicit', vocab_projection='cudnn')
  with pytest.raises(ValueError, match=r"model.vocab_projection='cudnn' needs an NVIDIA GPU .* "
                                       r"the portable choices are \['direct', 'streamed'\]"):
    Transformer(cfg).init(jax.random.key(0), tokens)


@pytest.mark.slow
def test_a_cudnn_model_is_read_with_portable_kernels_off_the_gpu():
  from symjax import model as model_lib
  cfg = CFG.replace(kind='symbolic', dtype='bfloat16', attention_impl='cudnn',
                            vocab_projection='cudnn')
  assert model_lib.for_backend(cfg, 'gpu') == cfg
  portable = model_lib.for_backend(cfg, 'cpu')
  assert (portable.kernels.attention_impl, portable.kernels.vocab_projection) == ('explicit', 'streamed')
  assert portable.replace(attention_impl='cudnn', vocab_projection='cudnn') == cfg
  tokens, key_mask = tokens_and_mask()
  variables = Transformer(portable).init(jax.random.key(0), tokens)  # runs here, on any backend
  assert np.isfinite(np.asarray(Transformer(portable).apply(variables, tokens, key_mask))).all()


# --- On an NVIDIA GPU: the cuDNN kernels against the explicit computations -------------------------------
# Both bfloat16 paths are compared with the float32 explicit model: the fused one must be about as close to
# it as the explicit bfloat16 computation is. A parameter whose gradient sums one number per head over every
# position or pair (the ALiBi slopes, τ) is a sum of many terms that largely cancel, so bfloat16 rounding of
# its terms weighs far more in it: cuDNN returns the bias gradient and dq in bfloat16. Measured on an H100:
# slope gradient 7.3% from float32 (the explicit bfloat16 model: 2.0%), τ gradient 7.5% and 8.3% from the
# direct projection's, everything else within 3%. Those sums are checked against the sum of their terms'
# sizes (the projection) or at 0.15 (the slopes).
BF16_TOL = 3e-2
SUMMED_TOL = 0.15


@on_gpu
@pytest.mark.parametrize('kind', ['standard', 'token_factored', 'symbolic'])
def test_cudnn_attention_equals_explicit_on_gpu(kind):
  cfg = CFG.replace(kind=kind, num_heads=2, head_dim=64, max_len=128)
  tokens = jax.random.randint(jax.random.key(3), (2, 128), 0, cfg.vocab_size)
  key_mask = jnp.ones((2, 128), bool).at[1, :5].set(False)
  variables = randomize(shapes_of(Transformer(cfg), tokens), 4, scale=0.1)
  grads, logits = _logits_and_grads(cfg, variables, tokens, key_mask)
  bf16 = cfg.replace(dtype='bfloat16')
  grads_b, logits_b = _logits_and_grads(bf16, variables, tokens, key_mask)
  grads_c, logits_c = _logits_and_grads(bf16.replace(attention_impl='cudnn'), variables,
                                        tokens, key_mask)
  real = np.asarray(key_mask)
  bound = lambda explicit: max(BF16_TOL, 2 * explicit)
  want, got_b, got_c = (np.asarray(x)[real] for x in (logits, logits_b, logits_c))
  assert ref.rel_err(got_c, want) <= bound(ref.rel_err(got_b, want))
  flat = jax.tree_util.tree_flatten_with_path(grads)[0]
  for (path, g), b, c in zip(flat, jax.tree.leaves(grads_b), jax.tree.leaves(grads_c)):
    summed = str(getattr(path[-1], 'key', '')) == 'log_slope'
    assert ref.rel_err(c, g) <= (SUMMED_TOL if summed else bound(ref.rel_err(b, g)))


@pytest.mark.slow
def test_readout_logits_gradient_is_autodiff_in_float32_and_close_in_bfloat16():
  keys = jax.random.split(jax.random.key(1), 3)
  h, table = jax.random.normal(keys[0], (6, 8)), jax.random.normal(keys[1], (11, 8))
  cot = jax.random.normal(keys[2], (6, 11))
  plain = jax.grad(lambda h, t: jnp.sum(jnp.einsum('nd,vd->nv', h, t) * cot), argnums=(0, 1))(h, table)
  custom = jax.grad(lambda h, t: jnp.sum(readout.readout_logits(h, t) * cot), argnums=(0, 1))
  for p, c in zip(plain, custom(h, table)):
    assert ref.rel_err(c, p) <= TOL
  for p, c in zip(plain, custom(h.astype(jnp.bfloat16), table.astype(jnp.bfloat16))):
    assert c.dtype == jnp.bfloat16 and ref.rel_err(c.astype(jnp.float32), p) <= 3e-2


@pytest.mark.slow
@pytest.mark.parametrize('num_valid', [None, 37])
def test_direct_loss_gradient_is_written_in_the_compute_dtype(num_valid):
  """The direct readout's own backward pass: autodiff's gradient of the textbook cross-entropy in
  float32, and in bfloat16 gradients of the compute dtype as close to it as bfloat16 allows."""
  keys = jax.random.split(jax.random.key(4), 4)
  h, table = jax.random.normal(keys[0], (24, 16)), jax.random.normal(keys[1], (40, 16))
  targets = jax.random.randint(keys[2], (24,), 0, num_valid or 40)
  weights = jax.random.uniform(keys[3], (24,))

  def textbook(h, table):
    logits = (h @ table.T)[:, :num_valid or 40]
    return jnp.sum((jax.nn.logsumexp(logits, -1) - logits[jnp.arange(24), targets]) * weights)

  custom = jax.grad(lambda h, t: jnp.sum(readout.direct_readout_stats(h, t, targets, num_valid)[0] * weights),
                    argnums=(0, 1))
  want = jax.grad(textbook, argnums=(0, 1))(h, table)
  for w, c in zip(want, custom(h, table)):
    assert ref.rel_err(c, w) <= TOL
  for w, c in zip(want, custom(h.astype(jnp.bfloat16), table.astype(jnp.bfloat16))):
    assert c.dtype == jnp.bfloat16 and ref.rel_err(c.astype(jnp.float32), w) <= BF16_TOL
  if num_valid is not None:  # padding rows: no probability, so no gradient
    np.testing.assert_array_equal(np.asarray(custom(h, table)[1])[num_valid:], 0.0)


@on_gpu
@pytest.mark.parametrize('num_valid', [None, 1000])
def test_cudnn_projection_equals_direct_on_gpu(num_valid):
  check_projection_against_float32(symbolic.cudnn_vocab_projection, num_valid)


def check_projection_against_float32(project, num_valid):
  """``project`` on bfloat16 inputs against the direct projection in float32, no farther than the direct
  projection on the same bfloat16 inputs is (twice that, or 3%); τ's gradient per channel against the
  root-sum-square of its terms -z·dz/τ (a sum of 65,536 terms that largely cancel: measured on an H100,
  7.5-8.3% relative from the bfloat16 direct one, and the bfloat16 direct one itself can have the wrong
  sign for a channel whose sum is small)."""
  keys = jax.random.split(jax.random.key(0), 3)
  z = jax.random.normal(keys[0], (4, 256, 4, 64), jnp.bfloat16)
  table = (0.3 * jax.random.normal(keys[1], (1031, 4, 64))).astype(jnp.bfloat16)
  tau = jnp.array([0.5, 1.0, 2.0, 4.0])
  cot = jax.random.normal(keys[2], z.shape, jnp.float32)

  def run(project, z, table):
    f = lambda z, table, tau: jnp.sum(project(z, table, tau, 0, num_valid)[0].astype(jnp.float32) * cot)
    out = jax.jit(lambda *a: project(*a, 0, num_valid)[0])(z, table, tau)
    return [np.asarray(x, np.float32) for x in (out, *jax.jit(jax.grad(f, argnums=(0, 1, 2)))(z, table, tau))]

  want = run(symbolic.direct_vocab_projection, z.astype(jnp.float32), table.astype(jnp.float32))
  direct = run(symbolic.direct_vocab_projection, z, table)
  got = run(project, z, table)
  for w, d, g in zip(want[:3], direct[:3], got[:3]):  # the output, dz and the table's gradient
    assert ref.rel_err(g, w) <= max(BF16_TOL, 2 * ref.rel_err(d, w))
  rms = np.sqrt(np.square(np.asarray(z, np.float32) * want[1]).sum(axis=(0, 1, 3))) / np.asarray(tau)
  assert np.all(np.abs(got[3] - want[3]) <= 4 * np.maximum(np.abs(direct[3] - want[3]), 0.02 * rms))


@pytest.mark.slow
@pytest.mark.parametrize('num_valid', [None, 1000])
def test_attention_form_projection_in_bfloat16_is_as_close_as_direct(num_valid):
  """The same check, on any backend, for the attention-form projection through XLA (the call cuDNN's runs)."""
  check_projection_against_float32(
      functools.partial(symbolic.attention_vocab_projection, implementation='xla'), num_valid)
