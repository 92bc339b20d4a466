"""The dual-stream family (``configs/dual_stream.py``, the ``streams`` group of the model config): every
variant against the independent NumPy transcription in ``dual_stream_reference``, the recipe's names, the
per-layer supervision loss, and the errors for names the papers do not define."""

import itertools
import subprocess
import sys
import textwrap

import dual_stream_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import optax
import paper_reference as paper
import pytest
from helpers import (
  EPS,
  KILLED_AT_STEP_25,
  REPO,
  assert_trees_equal,
  dual_stream_tiny,
  f64,
  params_of,
  randomize,
  shapes_of,
)

import symjax
import symjax.configs as configs
from symjax import interpret
from symjax.interpret import core, decomposition
from symjax.model import ModelConfig, Transformer
from symjax.model import intermediates as names
from symjax.system.errors import InputError
from symjax.train import trainer

TOL = 1e-5
ATTENTION = ('dns', 'ind', 'kron')
FFN = ('dns', 'ind')
STREAMS = ('T', 'C', 'S')
GATES = ('', '_G', '_Gs')
# Every combination of the recipe's four parts, by its name.
VARIANTS = [f'{a}-{f}_{s}{g}' for a, f, s, g in itertools.product(ATTENTION, FFN, STREAMS, GATES)]


def variant_config(variant: str, **extra) -> ModelConfig:
  """The recipe's model fields for ``variant``, at a size small enough to transcribe."""
  fields = configs.from_file(f'dual_stream:variant={variant},runlocal=true').model
  flat = {k: v for k, v in fields.items() if k in ModelConfig.defaults()}
  return ModelConfig.from_dict({**flat, 'vocab_size': 11, 'num_layers': 2, 'num_heads': 3, 'head_dim': 4,
                                'ff_dim': 12, 'max_len': 16, 'layer_norm_epsilon': EPS, **extra})


def reference_params(cfg: ModelConfig, p) -> dict:
  """symjax's parameters in the transcription's names, float64."""
  d = cfg.d_model
  out = {'embedding': f64(p['embed']['embedding']), 'lnf_g': f64(p['norm_final']['scale']),
         'lnf_b': f64(p['norm_final']['bias']), 'layers': []}
  out['readout'] = out['embedding'] if cfg.tie_embeddings else f64(p['readout'])
  for l in range(cfg.num_layers):
    lp, a = p[f'layer_{l}'], p[f'layer_{l}']['attention']
    layer = {'w_q': f64(a['query']['kernel']).reshape(d, d), 'w_k': f64(a['key']['kernel']).reshape(d, d),
             'ln1_g': f64(lp['norm_attn']['scale']), 'ln1_b': f64(lp['norm_attn']['bias']),
             'ln2_g': f64(lp['norm_ffn']['scale']), 'ln2_b': f64(lp['norm_ffn']['bias'])}
    vm = lp['value_map']
    layer['w_v'] = f64(vm['w_head'] if 'w_head' in vm else vm['kernel'])
    if layer['w_v'].ndim == 3 and layer['w_v'].shape[0] == d:   # dense: [d_model, heads, head_dim]
      layer['w_v'] = layer['w_v'].reshape(d, d)
    if 'alibi' in a:
      layer['slopes'] = np.exp(f64(a['alibi']['log_slope']))
    if 'gate' in a:
      layer['w_gate'] = f64(a['gate'])
    if 'norm_gate' in lp:
      layer['lng_g'], layer['lng_b'] = f64(lp['norm_gate']['scale']), f64(lp['norm_gate']['bias'])
    if 'head_mix' in a:
      w = a['head_mix']
      layer['w_o'] = f64(w['w_head'] if 'w_head' in w else w['kernel'])
      layer['w_o'] = layer['w_o'].reshape(d, d) if layer['w_o'].shape[0] == d else layer['w_o']
    f = lp['ffn']
    if 'wi' in f and isinstance(f['wi'], dict):                  # the dense MLP
      layer.update(w1=f64(f['wi']['kernel']), b1=f64(f['wi']['bias']), w2=f64(f['wo']['kernel']),
                   b2=f64(f['wo']['bias']))
    else:                                                         # one MLP per channel
      layer.update(w1=f64(f['wi']), b1=f64(f['bi']), w2=f64(f['wo']), b2=f64(f['bo']))
    out['layers'].append(layer)
  return out


def options(cfg: ModelConfig) -> dict:
  s = cfg.streams
  value = cfg.symbolic.value_map
  return dict(num_heads=cfg.num_heads, eps=cfg.layer_norm_epsilon, causal=cfg.causal, stream=s.stream,
              cascade_norm=s.cascade_norm, value_mixing='kronecker' if value.startswith('kronecker') else value,
              head_mixing=s.head_mixing, ffn_mixing=s.ffn_mixing, gate=s.gate,
              rope=cfg.attention.positions == 'rope', pls_source=s.pls_source, channel_norm=cfg.channel_norms)


TOKENS = np.random.default_rng(0).integers(0, 11, (2, 7))


@pytest.mark.parametrize('variant', VARIANTS)
def test_every_variant_matches_the_transcription(variant):
  """Every combination of mixings, stream and gate, alternately with RoPE and ALiBi and with CASCADE's
  normalised token stream; per-layer logits through the ``pls.logits`` sites."""
  index = VARIANTS.index(variant)
  extra = {'positions': ('rope', 'alibi')[index % 2], 'pls_weight': 0.5,
           'pls_source': ('x', 'x_e')[index // 2 % 2], 'tie_embeddings': index % 3 == 0}
  if '_C' in variant and index % 4 < 2:
    extra['cascade_norm'] = True
  cfg = variant_config(variant, **extra)
  model = Transformer(cfg)
  # Away from the initial identities and zero gates, so that every map is exercised.
  params = randomize(shapes_of(model, jnp.asarray(TOKENS))['params'], index, scale=0.4)
  # Run eagerly: each primitive compiles once for all 54 variants, where a compiled pass per variant would
  # cost seconds each. The hook session keeps the per-layer logits, as run_with_cache's does.
  with names.session({}, lambda name: name.endswith('pls.logits')):
    logits, state = model.apply({'params': params}, jnp.asarray(TOKENS), mutable=[names.COLLECTION])
  cache = names.flat(state[names.COLLECTION])
  p, o = reference_params(cfg, params), options(cfg)
  for b in range(TOKENS.shape[0]):
    want, want_layers = ref.model(TOKENS[b], p, o)
    assert paper.rel_err(np.asarray(logits)[b], want) <= TOL
    for l in range(cfg.num_layers):
      assert paper.rel_err(np.asarray(cache[f'blocks.{l}.pls.logits'])[b], want_layers[l]) <= TOL


@pytest.mark.parametrize('variant, attention_writes', [('kron-dns_C_G', 'x_e'), ('dns-ind_S_Gs', 'x_t'),
                                                      ('ind-dns_T', 'x_t')])
def test_the_decomposition_sums_to_the_logits_and_heads_to_their_update(variant, attention_writes):
  """The residual stream taken apart: the blocks' terms through the frozen final norm give the logits, each
  term labelled with the stream it is added to (CASCADE's attention writes X_e), and each head's terms
  through the output map sum to its block's attention update."""
  cfg = variant_config(variant)
  model = Transformer(cfg)
  params = randomize(shapes_of(model, jnp.asarray(TOKENS))['params'], 3, scale=0.4)
  logits, cache = interpret.run_with_cache(model, params, TOKENS)
  terms = decomposition.block_terms(cfg, cache)
  assert terms[1][0] == f'0_attn_out.{attention_writes}'
  a, beta = decomposition.frozen_norm(cfg, params, cache)
  stack = np.stack([term for _, term in terms])
  recomposed = ((a * core.centre(cfg, stack)).sum(0) + beta) @ core.readout_table(cfg, params).T
  assert paper.rel_err(recomposed, np.asarray(logits)) <= TOL
  for l in range(cfg.num_layers):
    heads = decomposition.head_terms(cfg, params, cache, l)
    assert paper.rel_err(heads.sum(0), np.asarray(cache[f'blocks.{l}.attn.out'])) <= TOL


def test_pls_loss_is_the_final_loss_plus_the_weighted_layer_losses():
  cfg = variant_config('kron-dns_T_pls', pls_weight=0.7, pls_decay='linear_final', pls_final_weight=0.3,
                       num_layers=3)
  model = Transformer(cfg)
  params = randomize(shapes_of(model, jnp.asarray(TOKENS))['params'], 5, scale=0.4)
  batch = {'inputs': jnp.asarray(TOKENS), 'targets': jnp.asarray(np.roll(TOKENS, -1, 1)),
           'weights': jnp.ones(TOKENS.shape), 'key_mask': jnp.ones(TOKENS.shape, bool)}
  total, ce, extra = _loss(model, params, batch)
  p, o = reference_params(cfg, params), options(cfg)
  shares = ref.pls_shares('linear_final', 3, 0.3)
  want_ce, want_layers = 0.0, np.zeros(3)
  for b in range(TOKENS.shape[0]):
    logits, layers = ref.model(TOKENS[b], p, o)
    want_ce += ref.cross_entropy(logits, np.asarray(batch['targets'])[b]) / TOKENS.shape[0]
    want_layers += [ref.cross_entropy(layers[l], np.asarray(batch['targets'])[b]) / TOKENS.shape[0] for l in range(3)]
  assert abs(float(ce) - want_ce) <= 1e-5 * want_ce
  np.testing.assert_allclose([float(extra[f'pls/layer_{l}']) for l in range(3)], want_layers, rtol=1e-5)
  assert abs(float(total) - (want_ce + 0.7 * np.dot(shares, want_layers))) <= 1e-5 * want_ce


def _loss(model, params, batch):
  """(the loss minimised, the logged cross-entropy, the logged metrics) of the trainer's step at step 0, with
  an optimiser that changes nothing."""
  tx = optax.sgd(0.0)
  train_step, _ = trainer.make_steps(model, tx, trainer.StepOptions(), None)
  state = trainer.TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params))
  _, metrics = jax.jit(train_step)(state, batch, jax.random.key(0))
  return metrics['objective'], metrics['loss'], metrics


@pytest.mark.parametrize('decay, want', [
    ('linear', [1 / 10, 2 / 10, 3 / 10, 4 / 10]),
    ('exponential', [1 / 15, 2 / 15, 4 / 15, 8 / 15]),
    ('uniform', [1 / 4] * 4),
    ('linear_final', [0.6 * 1 / 6, 0.6 * 2 / 6, 0.6 * 3 / 6, 0.4]),
])
def test_pls_decays_are_the_notes_weights(decay, want):
  cfg = ModelConfig.of(kind='token_factored', num_layers=4, pls_weight=0.5, pls_decay=decay, pls_final_weight=0.4)
  np.testing.assert_allclose(cfg.pls_weights(), 0.5 * np.asarray(want), rtol=1e-12)
  np.testing.assert_allclose(ref.pls_shares(decay, 4, 0.4), want, rtol=1e-12)


@pytest.mark.parametrize('variant, want', [
    ('kron-dns_T', dict(value_map='kronecker_identity', head_mixing='kronecker', ffn_mixing='dense',
                        stream='token_factored', gate='none', pls_weight=0.0)),
    ('ind-ind_C_Gs', dict(value_map='independent', head_mixing='independent', ffn_mixing='independent',
                          stream='cascade', gate='symbolic')),
    # The family's own example combines S and cascade: read as the CASCADE stream (docs/dual_stream.md).
    ('dns-dns_S_G_cascade_pls_xe', dict(value_map='dense', head_mixing='dense', stream='cascade', gate='combined',
                                        pls_weight=0.5, pls_source='x_e')),
])
def test_recipe_names_set_the_fields(variant, want):
  model = configs.from_file(f'dual_stream:variant={variant}').model
  assert {k: model[k] for k in want} == want


@pytest.mark.parametrize('variant, message', [
    ('kron-dns', r'the stream \(T, C or S\) is missing'),
    ('full-dns_T', r"the mixing part 'full-dns'"),
    ('kron-dns_T_cascade', 'contradict'),
    ('kron-dns_T_G2', r"'G2' is not a part of the grammar"),
])
def test_unknown_variant_names_say_the_grammar(variant, message):
  with pytest.raises(InputError, match=message):
    configs.from_file(f'dual_stream:variant={variant}')


@pytest.mark.parametrize('change, message', [
    (dict(head_mixing='shared'), r"model.head_mixing must be one of \['independent', 'kronecker', 'dense'\]"),
    (dict(ffn_mixing='kronecker'), r"model.ffn_mixing must be one of \['dense', 'independent'\]"),
    (dict(pls_decay='cosine'), r"model.pls_decay must be one of \['linear', 'exponential', 'uniform', 'linear_"),
    (dict(pls_weight=1.5), r'model.pls_weight must be a number in \[0, 1\]'),
    (dict(stream='triple'), r"model.stream must be one of \['token_factored', 'cascade', 'single'\]"),
    (dict(kind='standard', stream='cascade'), "for the factored kinds"),
    (dict(kind='symbolic', head_mixing='dense'), 'no mixture of E'),
    (dict(cascade_norm=True), "model.stream = 'cascade'"),
    (dict(positions='learned'), "factored kinds take 'alibi' or 'rope'"),
    (dict(kind='standard', pls_weight=0.5, pls_source='x_e'), 'has one stream'),
])
def test_undefined_options_name_the_allowed_ones(change, message):
  with pytest.raises(InputError, match=message):
    ModelConfig.of(**{'kind': 'token_factored', **change})


@pytest.mark.slow
def test_a_killed_variant_resumes_to_the_uninterrupted_parameters(tmp_path):
  """The option-densest variant (Kronecker attention, per-channel FFN, CASCADE, the symbolic gate, PLS on X_e)
  trains, is killed outright at step 25, and the same command resumes it to the uninterrupted run's
  parameters bit for bit; the resumed run reads through the interpretability API with its new sites.
  ``benchmarks/suites/dual_stream_check.py`` does the same for every variant."""
  variant = 'kron-ind_C_Gs_pls_xe'
  whole, killed = str(tmp_path / 'whole'), str(tmp_path / 'killed')
  trainer.train_and_evaluate(dual_stream_tiny(variant), whole)
  driver = KILLED_AT_STEP_25 + textwrap.dedent(f"""
      from symjax.train import trainer
      from tests.helpers import dual_stream_tiny
      trainer.train_and_evaluate(dual_stream_tiny({variant!r}), {killed!r})
  """)
  proc = subprocess.run([sys.executable, '-c', driver], cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == -9, proc.stderr[-2000:]
  trainer.train_and_evaluate(dual_stream_tiny(variant), killed)  # the same command again
  assert_trees_equal(params_of(killed), params_of(whole))
  run = symjax.load(killed)
  _, cache_ = interpret.run_with_cache(run.model, run.params, run.batches('validation', n=1)[0]['inputs'])
  assert {'blocks.0.attn.gate', 'blocks.1.pls.logits'} <= set(cache_.keys())


def test_the_gate_and_layer_logits_are_sites_to_hook_and_patch():
  """Zeroing head h's gate zeroes its output: the same logits as zeroing its ``attn.z``. Patching the gate of
  one head from a clean run equals the hook that writes the clean gate there. A hook at a layer's PLS logits
  is a read-out branch: it leaves the model's logits unchanged."""
  cfg = variant_config('kron-dns_T_Gs_pls')
  model = Transformer(cfg)
  params = randomize(shapes_of(model, jnp.asarray(TOKENS))['params'], 11, scale=0.4)
  gate_off = interpret.run_with_hooks(model, params, TOKENS, {'blocks.1.attn.gate': interpret.zero_head(2)})
  z_off = interpret.run_with_hooks(model, params, TOKENS, {'blocks.1.attn.z': interpret.zero_head(2)})
  assert paper.rel_err(gate_off, z_off) <= TOL
  clean, corrupt = TOKENS[:1], TOKENS[1:]
  _, clean_cache = interpret.run_with_cache(model, params, clean)
  written = np.asarray(clean_cache['blocks.1.attn.gate'])

  def write_clean(value, name):
    return value.at[:, :, 2].set(written[:, :, 2])
  patched = interpret.patch(model, params, clean, corrupt, 'blocks.1.attn.gate', heads=[2])
  hooked = interpret.run_with_hooks(model, params, corrupt, {'blocks.1.attn.gate': write_clean})
  assert paper.rel_err(patched, hooked) <= TOL
  plain = interpret.run_with_hooks(model, params, TOKENS, {})
  assert np.abs(gate_off - plain).max() > 1e-3 and np.abs(patched - plain[1:]).max() > 1e-3  # both changed something
  assert np.array_equal(interpret.run_with_hooks(model, params, TOKENS, {'blocks.0.pls.logits': lambda v, n: v * 0}),
                        plain)
