"""Whole blocks and models: against the paper's equations, and the structure the paper promises."""


import jax
import jax.numpy as jnp
import numpy as np
import paper_reference as ref
import pytest
from helpers import EPS, KINDS, SMALL, f64, randomize, shapes_of, small

from symjax import model as model_lib
from symjax.interpret import mixtures as symjax_mixtures
from symjax.model import FactoredBlock, ModelConfig, StandardBlock, Transformer
from symjax.model import intermediates as names
from symjax.system.errors import InputError

TOL = 1e-5
def streams(seed, t=6, batch=2, cfg=SMALL):
  keys = jax.random.split(jax.random.key(seed), 3)
  x_t = jax.random.normal(keys[0], (batch, t, cfg.d_model))
  x_e = jax.random.normal(keys[1], (batch, t, cfg.d_model))
  table = jax.random.normal(keys[2], (cfg.vocab_size, cfg.d_model))
  return x_t, x_e, table


def factored_params(p, symbolic):
  d = SMALL.d_model
  out = {'w_q': f64(p['attention']['query']['kernel']).reshape(d, d),
         'w_k': f64(p['attention']['key']['kernel']).reshape(d, d),
         'w_head': f64(p['value_map']['w_head']),
         'slopes': np.exp(f64(p['attention']['alibi']['log_slope']))}
  if symbolic:
    out.update(cln1_g=f64(p['norm_attn']['scale']), cln1_b=f64(p['norm_attn']['bias']),
               cln2_g=f64(p['norm_ffn']['scale']), cln2_b=f64(p['norm_ffn']['bias']),
               tau_v=np.exp(f64(p['value_projection']['log_tau'])),
               tau_f=np.exp(f64(p['ffn']['projection']['log_tau'])),
               f_w1=f64(p['ffn']['w1']), f_b1=f64(p['ffn']['b1']),
               f_w2=f64(p['ffn']['w2']), f_b2=f64(p['ffn']['b2']))
  else:
    out.update(ln1_g=f64(p['norm_attn']['scale']), ln1_b=f64(p['norm_attn']['bias']),
               ln2_g=f64(p['norm_ffn']['scale']), ln2_b=f64(p['norm_ffn']['bias']),
               w1=f64(p['ffn']['wi']['kernel']), b1=f64(p['ffn']['wi']['bias']),
               w2=f64(p['ffn']['wo']['kernel']), b2=f64(p['ffn']['wo']['bias']))
  return out


@pytest.mark.slow
@pytest.mark.parametrize('causal', [True, False])
def test_token_factored_block_matches_eqs_6_to_15(causal):
  cfg = small(kind='token_factored', causal=causal)
  x_t, x_e, table = streams(1)
  block = FactoredBlock(cfg, symbolic=False)
  variables = randomize(shapes_of(block, x_t, x_e, table), 7, scale=0.3)
  (y_t, y_e), state = block.apply(variables, x_t, x_e, table, mutable=['intermediates'])
  p = factored_params(variables['params'], symbolic=False)
  for b in range(x_t.shape[0]):
    want_t, want_e, want_w = ref.token_factored_block(f64(x_t[b]), f64(x_e[b]), p, cfg.num_heads,
                                                      causal, EPS)
    assert ref.rel_err(y_t[b], want_t) <= TOL
    assert ref.rel_err(y_e[b], want_e) <= TOL
    assert ref.rel_err(names.flat(state['intermediates'])['attn.pattern'][b], want_w) <= TOL


@pytest.mark.parametrize('causal,vocab_ffn,qk_positions', [(True, 'channel', False), (False, 'channel', False),
                                                           (True, 'dense', False), (False, 'channel', True)])
@pytest.mark.slow
def test_symbolic_block_matches_algorithm_1(causal, vocab_ffn, qk_positions):
  """Algorithm 1; with vocab_ffn='dense' line 7's FFN reads the whole state, with qk_positions line 2's
  queries and keys read a learned position embedding too (the opt-in variants)."""
  cfg = small(kind='symbolic', causal=causal, vocab_ffn=vocab_ffn, qk_positions=qk_positions)
  x_t, x_e, table = streams(2)
  block = FactoredBlock(cfg, symbolic=True)
  variables = randomize(shapes_of(block, x_t, x_e, table), 8, scale=0.3)
  (y_t, y_e), state = block.apply(variables, x_t, x_e, table, mutable=['intermediates'])
  inter = names.flat(state['intermediates'])
  p = factored_params(variables['params'], symbolic=True)
  p['f_dense'] = vocab_ffn == 'dense'
  assert ('qk_position' in variables['params']) == qk_positions
  if qk_positions:
    p['qk_position'] = f64(variables['params']['qk_position'])[:x_t.shape[1]]
  if p['f_dense']:   # one d_model -> ff_dim -> d_model MLP, not one per channel
    assert p['f_w1'].shape == (cfg.d_model, cfg.ff_dim) and p['f_w2'].shape == (cfg.ff_dim, cfg.d_model)
  for b in range(x_t.shape[0]):
    want_t, want_e, want_w, want_va, want_fa = ref.symbolic_block(
        f64(x_t[b]), f64(x_e[b]), f64(table), p, cfg.num_heads, causal, EPS)
    assert ref.rel_err(y_t[b], want_t) <= TOL
    assert ref.rel_err(y_e[b], want_e) <= TOL
    assert ref.rel_err(inter['attn.pattern'][b], want_w) <= TOL
    for h in range(cfg.num_heads):
      assert ref.rel_err(inter['attn.v_mixture'][b, :, h], want_va[h]) <= TOL
      assert ref.rel_err(inter['ffn.mixture'][b, :, h], want_fa[h]) <= TOL


@pytest.mark.parametrize('positions', ['alibi', 'learned'])
def test_standard_block_matches_pre_layernorm_transformer(positions):
  cfg = small(kind='standard', positions=positions)
  x, _, _ = streams(3)
  block = StandardBlock(cfg)
  variables = randomize(shapes_of(block, x), 9, scale=0.3)
  p, d = variables['params'], cfg.d_model
  rp = {'w_q': f64(p['attention']['query']['kernel']).reshape(d, d),
        'w_k': f64(p['attention']['key']['kernel']).reshape(d, d),
        'w_v': f64(p['attention']['value']['kernel']).reshape(d, d),
        'w_o': f64(p['attention']['out']['kernel']).reshape(d, d),
        'slopes': np.exp(f64(p['attention']['alibi']['log_slope'])) if positions == 'alibi' else None,
        'ln1_g': f64(p['norm_attn']['scale']), 'ln1_b': f64(p['norm_attn']['bias']),
        'ln2_g': f64(p['norm_ffn']['scale']), 'ln2_b': f64(p['norm_ffn']['bias']),
        'w1': f64(p['ffn']['wi']['kernel']), 'b1': f64(p['ffn']['wi']['bias']),
        'w2': f64(p['ffn']['wo']['kernel']), 'b2': f64(p['ffn']['wo']['bias'])}
  assert ('alibi' in p['attention']) == (positions == 'alibi')
  y = block.apply(variables, x)
  for b in range(x.shape[0]):
    want, _ = ref.standard_block(f64(x[b]), rp, cfg.num_heads, True, EPS, alibi=positions == 'alibi')
    assert ref.rel_err(y[b], want) <= TOL


@pytest.mark.slow
def test_whole_symbolic_model_matches_composed_reference():
  cfg = small(kind='symbolic')
  tokens = jax.random.randint(jax.random.key(4), (2, 7), 0, cfg.vocab_size)
  model = Transformer(cfg)
  variables = randomize(shapes_of(model, tokens), 10, scale=0.3)
  p = variables['params']
  table = f64(p['embed']['embedding'])
  logits = model.apply(variables, tokens)
  for b in range(2):
    x_t, x_e = table[np.asarray(tokens[b])], np.zeros((7, cfg.d_model))
    for l in range(cfg.num_layers):
      x_t, x_e, *_ = ref.symbolic_block(x_t, x_e, table, factored_params(p[f'layer_{l}'], True),
                                        cfg.num_heads, True, EPS)
    h = ref.channel_layer_norm(x_t + x_e, f64(p['norm_final']['scale']), f64(p['norm_final']['bias']),
                               cfg.num_heads, EPS)
    assert ref.rel_err(logits[b], h @ table.T) <= TOL


# ------------------------------------------------------------------------------------------------------
# Structure
# ------------------------------------------------------------------------------------------------------
def embedding_reading(cfg, tokens, params):
  """(w_t, w_e, reconstruct): the token weights [batch, time, heads, vocab] of X_t⁰ (one-hot) and X_e⁰
  (zero), and the map from such weights to a stream through each channel's embedding rows."""
  table = f64(params['embed']['embedding'])
  hd, nh = cfg.head_dim, cfg.num_heads
  w_t = np.repeat(np.eye(cfg.vocab_size)[np.asarray(tokens)][:, :, None, :], nh, axis=2)

  def reconstruct(w):
    return np.concatenate([w[:, :, h] @ table[:, h * hd:(h + 1) * hd] for h in range(nh)], axis=-1)
  return w_t, np.zeros_like(w_t), reconstruct


def run_with_intermediates(cfg, seed=0, t=8, batch=2, scale=0.3):
  tokens = jax.random.randint(jax.random.key(seed + 100), (batch, t), 0, cfg.vocab_size)
  model = Transformer(cfg)
  variables = randomize(shapes_of(model, tokens), seed + 1, scale=scale)
  logits, state = model.apply(variables, tokens, mutable=['intermediates'])
  return tokens, variables, logits, names.flat(state['intermediates'])


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['token_factored', 'symbolic'])
def test_attention_updates_only_x_t_and_ffn_only_x_e(kind):
  cfg = small(kind=kind, num_layers=3)
  _, _, _, inter = run_with_intermediates(cfg)
  x_t, x_e = inter['embed'], np.zeros_like(inter['embed'])  # X_e^0 = 0
  for l in range(cfg.num_layers):
    assert not np.allclose(inter[f'blocks.{l}.x_t_mid'], x_t)          # attention changed X_t ...
    np.testing.assert_array_equal(inter[f'blocks.{l}.x_e_mid'], x_e)   # ... and left X_e alone
    np.testing.assert_array_equal(inter[f'blocks.{l}.x_t'], inter[f'blocks.{l}.x_t_mid'])  # FFN left X_t alone
    assert not np.allclose(inter[f'blocks.{l}.x_e'], x_e)           # ... and changed X_e
    x_t, x_e = inter[f'blocks.{l}.x_t'], inter[f'blocks.{l}.x_e']


def test_x_t_0_is_the_token_embedding():
  tokens, variables, _, inter = run_with_intermediates(small(kind='token_factored'))
  table = variables['params']['embed']['embedding']
  np.testing.assert_array_equal(inter['embed'], table[tokens])


@pytest.mark.slow
@pytest.mark.parametrize('kind', KINDS)
def test_causal_model_does_not_look_ahead(kind):
  cfg = small(kind=kind, num_layers=2)
  model = Transformer(cfg)
  tokens = jax.random.randint(jax.random.key(5), (1, 9), 0, cfg.vocab_size)
  variables = randomize(shapes_of(model, tokens), 11, scale=0.3)
  j = 5
  changed = tokens.at[0, j].set((tokens[0, j] + 1) % cfg.vocab_size)
  a, sa = model.apply(variables, tokens, mutable=['intermediates'])
  b, sb = model.apply(variables, changed, mutable=['intermediates'])
  np.testing.assert_allclose(a[:, :j], b[:, :j], rtol=0, atol=1e-6)
  assert not np.allclose(a[:, j:], b[:, j:])
  flat_a = jax.tree_util.tree_flatten_with_path(sa['intermediates'])[0]
  flat_b = jax.tree.leaves(sb['intermediates'])
  for (path, x), y in zip(flat_a, flat_b):
    name = jax.tree_util.keystr(path)
    if 'pattern' in name:     # [batch, heads, query, key]
      np.testing.assert_allclose(x[:, :, :j], y[:, :, :j], atol=1e-6, err_msg=name)
    else:                     # [batch, time, ...]
      np.testing.assert_allclose(x[:, :j], y[:, :j], atol=1e-6, err_msg=name)


@pytest.mark.parametrize('kind,qk_positions', [('standard', False), ('token_factored', True), ('symbolic', False)])
def test_a_suffix_pass_over_kept_keys_and_values_equals_the_whole_pass(kind, qk_positions):
  """Blocks l… over positions P… reading the first P positions' keys and values give the whole pass's
  logits at positions P…: ALiBi, the causal mask and learned positions count from P."""
  cfg = small(kind=kind, num_layers=3, qk_positions=qk_positions,
              positions='learned' if kind == 'standard' else 'alibi')
  tokens, variables, logits, _ = run_with_intermediates(cfg, t=9)
  with names.session({}, lambda name: True):
    _, state = Transformer(cfg).apply(variables, tokens, mutable=['intermediates'])
  inter = names.flat(state['intermediates'])
  for first in range(cfg.num_layers):
    for kept in (0, 4, 8):
      prefix = {l: (inter[f'blocks.{l}.attn.k'][:, :kept], inter[f'blocks.{l}.attn.values'][:, :kept])
                for l in range(first, cfg.num_layers)}
      b = f'blocks.{first - 1}.'
      if kind == 'standard':
        entering = (inter['embed'] if first == 0 else inter[b + 'resid'])[:, kept:]
      else:
        entering = ((inter['embed'], np.zeros_like(inter['embed'])) if first == 0 else
                    (inter[b + 'x_t'], inter[b + 'x_e']))
        entering = tuple(x[:, kept:] for x in entering)
      out = model_lib.Suffix(cfg, first).apply(variables, entering, prefix)
      assert out.shape == (tokens.shape[0], tokens.shape[1] - kept, cfg.vocab_size)
      np.testing.assert_allclose(out, logits[:, kept:], rtol=0, atol=2e-5, err_msg=f'first={first} kept={kept}')


@pytest.mark.slow
def test_bidirectional_model_does_look_ahead():
  cfg = small(kind='token_factored', causal=False)
  model = Transformer(cfg)
  tokens = jnp.arange(8)[None] % cfg.vocab_size
  variables = model.init(jax.random.key(0), tokens)
  a = model.apply(variables, tokens)
  b = model.apply(variables, tokens.at[0, 7].set(0))
  assert not np.allclose(a[:, 0], b[:, 0])


@pytest.mark.parametrize('kind', ['token_factored', 'symbolic'])
def test_value_map_has_exactly_h_squared_parameters_and_no_value_projection(kind):
  cfg = small(kind=kind)
  params = model_lib.param_shapes(cfg)
  for l in range(cfg.num_layers):
    layer = params[f'layer_{l}']
    assert layer['value_map']['w_head'].shape == (cfg.num_heads, cfg.num_heads)
    assert set(layer['attention']) == {'query', 'key', 'alibi'}
  none = model_lib.param_shapes(small(kind=kind, value_map='none'))
  assert 'value_map' not in none['layer_0']


@pytest.mark.parametrize('tie,vocab_ffn,qk_positions', [(True, 'channel', False), (False, 'channel', False),
                                                        (False, 'dense', False), (False, 'channel', True)])
def test_all_symbolic_streams_are_sums_of_convex_token_mixtures(tie, vocab_ffn, qk_positions):
  """Theorem 6.4 as it holds: after l layers each channel of X_t is a sum of l+1 convex mixtures of that
  channel's embedding rows (the input token plus one per attention update) and X_e a sum of l.

  The coefficients are rebuilt here from the sown attention weights and mixtures α: the attention output
  at (i, h) is Σ_s A[h, i, s] V[s, h] and V[s, h] = α_v[s, h] E^(h), so its coefficients are A α_v. It
  holds as well with a readout table of its own and with the dense FFN, and the exact trace reads them.
  """
  cfg = small(kind='symbolic', num_layers=3, tie_embeddings=tie, vocab_ffn=vocab_ffn, qk_positions=qk_positions)
  assert cfg.exact_mixtures and cfg.paper_symbolic == (vocab_ffn == 'channel' and not qk_positions)
  tokens, variables, _, inter = run_with_intermediates(cfg, scale=0.5)
  w_t, w_e, reconstruct = embedding_reading(cfg, tokens, variables['params'])

  for l in range(cfg.num_layers):
    a = f64(inter[f'blocks.{l}.attn.pattern'])                         # [b, h, i, s]
    alpha_v = f64(inter[f'blocks.{l}.attn.v_mixture'])            # [b, s, h, v]
    w_t = w_t + np.einsum('bhis,bshv->bihv', a, alpha_v)
    w_e = w_e + f64(inter[f'blocks.{l}.ffn.mixture'])
    for w, mass, x in ((w_t, l + 2, inter[f'blocks.{l}.x_t']), (w_e, l + 1, inter[f'blocks.{l}.x_e'])):
      assert (w >= 0).all()
      np.testing.assert_allclose(w.sum(-1), mass, rtol=1e-5)
      assert ref.rel_err(x, reconstruct(w)) <= 1e-5
  trace = symjax_mixtures.mixture_trace(Transformer(cfg), variables['params'], tokens)
  np.testing.assert_allclose(trace.x_t[-1], w_t, atol=1e-5)
  np.testing.assert_allclose(trace.x_e[-1], w_e, atol=1e-5)


@pytest.mark.parametrize('sites,gain', [('values', False), ('ffn', False), ('both', True), ('values', True)])
def test_symbolic_variants_keep_an_exact_token_reading_where_they_project(sites, gain):
  """Opt-in variants: a projected site's every update is g_h times a convex mixture of that channel's
  embedding rows (g_h = 1 without gain), rebuilt from the sown α, attention weights and gains alone; the
  stream whose site is not projected is not such a sum, and its projection parameters do not exist."""
  cfg = small(kind='symbolic', num_layers=2, symbolic_sites=sites, projection_gain=gain)
  tokens, variables, _, inter = run_with_intermediates(cfg, scale=0.5)
  params = variables['params']
  nh = cfg.num_heads
  w_t, w_e, reconstruct = embedding_reading(cfg, tokens, params)
  mass_t, mass_e = np.ones(nh), np.zeros(nh)

  def gain_of(p):
    assert ('log_gain' in p) == gain
    return np.exp(f64(p['log_gain'])) if gain else np.ones(nh)

  for l in range(cfg.num_layers):
    p = params[f'layer_{l}']
    assert ('value_projection' in p) == (sites != 'ffn') and ('projection' in p['ffn']) == (sites != 'values')
    if sites != 'ffn':
      g = gain_of(p['value_projection'])
      a = f64(inter[f'blocks.{l}.attn.pattern'])
      w_t = w_t + np.einsum('bhis,bshv,h->bihv', a, f64(inter[f'blocks.{l}.attn.v_mixture']), g)
      mass_t = mass_t + g
    if sites != 'values':
      g = gain_of(p['ffn']['projection'])
      w_e = w_e + f64(inter[f'blocks.{l}.ffn.mixture']) * g[:, None]
      mass_e = mass_e + g
    for w, mass, x, projected in ((w_t, mass_t, inter[f'blocks.{l}.x_t'], sites != 'ffn'),
                                  (w_e, mass_e, inter[f'blocks.{l}.x_e'], sites != 'values')):
      if projected:
        assert (w >= 0).all()
        np.testing.assert_allclose(w.sum(-1), np.broadcast_to(mass, w.shape[:-1]), rtol=1e-5)
        assert ref.rel_err(x, reconstruct(w)) <= 1e-5
      else:
        assert ref.rel_err(x, reconstruct(w)) > 1e-2
  if gain:
    assert not cfg.paper_symbolic
    with pytest.raises(ValueError, match='projection_gain'):
      symjax_mixtures.mixture_trace(Transformer(cfg), params, tokens)


@pytest.mark.parametrize('vocab_ffn', ['channel', 'dense'])
def test_nonnegative_ffn_mixtures_keep_an_exact_nonnegative_token_reading(vocab_ffn):
  """ffn_mixture='nonnegative': X_e after every layer is rebuilt from the sown FFN weights alone, every
  weight non-negative, with a mass the model chose (not l + 1); X_t stays a convex mixture sum; the exact
  convex mixture trace refuses the model with a one-line reason."""
  cfg = small(kind='symbolic', num_layers=2, vocab_ffn=vocab_ffn, ffn_mixture='nonnegative')
  tokens, variables, _, inter = run_with_intermediates(cfg, scale=0.5)
  params = variables['params']
  w_t, w_e, reconstruct = embedding_reading(cfg, tokens, params)

  for l in range(cfg.num_layers):
    a = f64(inter[f'blocks.{l}.attn.pattern'])
    w_t = w_t + np.einsum('bhis,bshv->bihv', a, f64(inter[f'blocks.{l}.attn.v_mixture']))
    w_e = w_e + f64(inter[f'blocks.{l}.ffn.mixture'])
    np.testing.assert_allclose(w_t.sum(-1), l + 2, rtol=1e-5)
    assert (w_e >= 0).all()
    assert np.abs(w_e.sum(-1) - (l + 1)).max() > 1e-2
    for w, x in ((w_t, inter[f'blocks.{l}.x_t']), (w_e, inter[f'blocks.{l}.x_e'])):
      assert ref.rel_err(x, reconstruct(w)) <= 1e-5
  assert not cfg.exact_mixtures
  with pytest.raises(ValueError, match="ffn_mixture"):
    symjax_mixtures.mixture_trace(Transformer(cfg), params, tokens)


def test_symbolic_variant_fields_are_checked():
  with pytest.raises(ValueError, match="model.symbolic_sites must be one of"):
    small(kind='symbolic', symbolic_sites='keys').validate()
  with pytest.raises(ValueError, match="model.vocab_ffn must be one of"):
    small(kind='symbolic', vocab_ffn='wide').validate()
  with pytest.raises(ValueError, match="only for kind 'symbolic'"):
    small(kind='token_factored', vocab_ffn='dense').validate()
  with pytest.raises(ValueError, match="model.qk_positions is for the factored kinds"):
    small(kind='standard', qk_positions=True).validate()
  with pytest.raises(ValueError, match="only for kind 'symbolic'"):
    small(kind='token_factored', projection_gain=True).validate()
  with pytest.raises(ValueError, match="model.ffn_mixture must be one of"):
    small(kind='symbolic', ffn_mixture='signed').validate()
  with pytest.raises(ValueError, match="only for kind 'symbolic'"):
    small(kind='standard', ffn_mixture='nonnegative').validate()
  with pytest.raises(ValueError, match="direct projection only"):
    small(kind='symbolic', ffn_mixture='nonnegative', vocab_projection='streamed').validate()


def test_token_factored_streams_are_not_token_mixtures():
  """The same reconstruction fails for the Token-Factored model: its constraint is separation only."""
  cfg = small(kind='token_factored', num_layers=1)
  _, variables, _, inter = run_with_intermediates(cfg, scale=0.5)
  table = f64(variables['params']['embed']['embedding'])
  x_e = f64(inter['blocks.0.x_e']).reshape(-1, cfg.num_heads, cfg.head_dim)
  # Least-squares coefficients of channel 0 of X_e on E^(0): the residual is not zero in general, or the
  # coefficients are negative somewhere.
  e0 = table[:, :cfg.head_dim]
  coef, *_ = np.linalg.lstsq(e0.T, x_e[:, 0].T, rcond=None)
  assert (coef < -1e-6).any() or np.abs(e0.T @ coef - x_e[:, 0].T).max() > 1e-4


def test_selective_symbolic_layers():
  cfg = small(kind='symbolic', num_layers=3, symbolic_layers=(1,))
  assert cfg.layer_kinds() == ('token_factored', 'symbolic', 'token_factored')
  params = model_lib.param_shapes(cfg)
  assert 'value_projection' not in params['layer_0'] and 'value_projection' in params['layer_1']
  _, _, logits, inter = run_with_intermediates(cfg)
  assert 'blocks.1.attn.v_mixture' in inter and 'blocks.2.attn.v_mixture' not in inter
  assert np.isfinite(np.asarray(logits)).all()


@pytest.mark.slow
@pytest.mark.parametrize('kind', KINDS)
def test_bfloat16_compute_is_close_to_float32(kind):
  cfg = small(kind=kind)
  tokens = jax.random.randint(jax.random.key(6), (2, 8), 0, cfg.vocab_size)
  variables = Transformer(cfg).init(jax.random.key(0), tokens)
  f32 = Transformer(cfg).apply(variables, tokens)
  bf16 = Transformer(cfg.replace(dtype='bfloat16')).apply(variables, tokens)
  assert bf16.dtype == jnp.float32
  assert ref.rel_err(bf16, f32) < 5e-2


def test_untied_readout_and_learned_positions():
  cfg = small(kind='standard', positions='learned', tie_embeddings=False)
  params = model_lib.param_shapes(cfg)
  assert params['readout'].shape == (cfg.vocab_size, cfg.d_model)
  assert params['pos_embedding'].shape == (cfg.max_len, cfg.d_model)


@pytest.mark.slow
def test_dropout_is_active_only_when_not_deterministic():
  cfg = small(kind='symbolic', dropout_rate=0.5, attention_dropout_rate=0.5)
  tokens = jnp.arange(8)[None] % cfg.vocab_size
  model = Transformer(cfg)
  variables = model.init(jax.random.key(0), tokens)
  a = model.apply(variables, tokens)
  np.testing.assert_array_equal(a, model.apply(variables, tokens))
  b = model.apply(variables, tokens, deterministic=False, rngs={'dropout': jax.random.key(1)})
  assert not np.allclose(a, b)


def test_sequence_empty_or_longer_than_max_len_is_a_clear_error():
  cfg = small(max_len=8)
  with pytest.raises(ValueError, match=r'sequence length 9 exceeds model.max_len = 8'):
    Transformer(cfg).init(jax.random.key(0), jnp.zeros((1, 9), jnp.int32))
  with pytest.raises(InputError, match=r'sequence length 0: give at least one token'):
    Transformer(cfg).init(jax.random.key(0), jnp.zeros((1, 0), jnp.int32))


@pytest.mark.parametrize('change, message', [
    ({'kind': 'symbolc'},
     r"model.kind must be one of \['standard', 'token_factored', 'symbolic', 'lstm', 'program'\]"),
    ({'num_heads': 0}, r'model.num_heads must be > 0'),
    ({'value_map': 'full'}, r'model.value_map must be one of'),
    ({'dropout_rate': 1.5}, r'model.dropout_rate must be in \[0, 1\)'),
    ({'kind': 'token_factored', 'symbolic_layers': [0]}, r"symbolic_layers is only for kind 'symbolic'"),
    ({'symbolic_layers': [5]}, r'symbolic_layers \[5\] out of range: layers are 0..1'),
    ({'dtype': 'float16'}, r"model.dtype must be one of \['float32', 'bfloat16'\]"),
    ({'tau_init': -1.0}, r'model.tau_init must be > 0'),
    # NaN passes any comparison written as a test for the bad case (nan <= 0 is False).
    ({'tau_init': float('nan')}, r'model.tau_init must be a finite number, got nan'),
    ({'embed_init_std': float('inf')}, r'model.embed_init_std must be a finite number, got inf'),
    ({'heads': 4}, r"unknown model config field\(s\) \['heads'\]"),
])
def test_model_config_errors_name_the_field(change, message):
  d = SMALL.flat() | change
  with pytest.raises(ValueError, match=message):
    ModelConfig.from_dict(d)


def test_count_params_allocates_nothing_and_counts_the_value_map_as_h_squared():
  tf = small(kind='token_factored', value_map='none')
  with_map = small(kind='token_factored')
  assert model_lib.count_params(with_map) - model_lib.count_params(tf) == SMALL.num_layers * 9
