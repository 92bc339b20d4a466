"""The interpretability tools: exact mixture trace, lenses, direct logit attribution, interventions,
token importance and its ground truth, head scores, the program view, and the HTML report and CLI."""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import paper_reference as ref
import pytest
from helpers import EPS, KINDS, randomize, shapes_of, small

import symjax.configs as configs
from symjax import interpret
from symjax.cli import interpret as cli
from symjax.interpret import attribution, circuits, core, hooks, induction, interventions, mixtures, tracing
from symjax.model import Transformer
from symjax.tasks import induction as induction_task
from symjax.train import config as config_lib
from symjax.train import metrics
from symjax.train import trainer as train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module', params=KINDS)
def model_and_params(request):
  cfg = small(kind=request.param)
  tokens = jax.random.randint(jax.random.key(3), (2, 7), 0, cfg.vocab_size)
  model = Transformer(cfg)
  params = randomize(shapes_of(model, tokens), 5, scale=0.5)['params']
  return model, params, np.asarray(tokens)


@pytest.fixture(scope='module')
def symbolic_model():
  cfg = small(kind='symbolic', num_layers=3)
  tokens = np.asarray(jax.random.randint(jax.random.key(7), (2, 8), 0, cfg.vocab_size))
  model = Transformer(cfg)
  params = randomize(shapes_of(model, tokens), 8, scale=0.5)['params']
  return model, params, tokens


# --- Exact mixture trace (Property 5.6) ---------------------------------------------------------------

def test_mixture_trace_is_exact_non_negative_and_every_term_has_mass_one(symbolic_model):
  model, params, tokens = symbolic_model
  cfg = model.config
  trace = mixtures.mixture_trace(model, params, tokens)
  assert len(trace.x_t) == len(trace.x_e) == cfg.num_layers + 1
  for term in trace.attention_terms + trace.ffn_terms:
    assert (term >= 0).all()
    np.testing.assert_allclose(term.sum(-1), 1.0, rtol=1e-6)
  for l, (w_t, w_e) in enumerate(zip(trace.x_t, trace.x_e)):
    assert (w_t >= 0).all() and (w_e >= 0).all()
    np.testing.assert_allclose(w_t.sum(-1), l + 1, rtol=1e-6)
    np.testing.assert_allclose(w_e.sum(-1), l, rtol=1e-6)
  errors = mixtures.reconstruction_errors(trace, params['embed']['embedding'], cfg.num_heads)
  assert max(max(v) for v in errors.values()) <= 1e-4
  # The check can fail: perturbing one coefficient breaks the reconstruction.
  trace.x_t[-1][0, 0, 0, 0] += 0.5
  assert mixtures.reconstruction_error(trace, params['embed']['embedding'], cfg.num_heads) > 1e-3


def test_mixture_trace_of_a_streamed_model_equals_the_direct_one(symbolic_model):
  model, params, tokens = symbolic_model
  streamed = Transformer(model.config.replace(vocab_projection='streamed', vocab_chunk_size=4))
  a, b = mixtures.mixture_trace(model, params, tokens), mixtures.mixture_trace(streamed, params, tokens)
  for x, y in zip(a.x_t + a.x_e, b.x_t + b.x_e):
    np.testing.assert_allclose(x, y, atol=1e-6)


def test_mixture_trace_refuses_models_that_are_not_all_symbolic(symbolic_model):
  _, params, tokens = symbolic_model
  with pytest.raises(ValueError, match='needs every layer symbolic'):
    mixtures.mixture_trace(Transformer(small(kind='symbolic', num_layers=3, symbolic_layers=(1,))), params, tokens)
  with pytest.raises(ValueError, match="model.kind 'lstm' has neither"):
    interpret.trace(Transformer(small(kind='lstm')), params, tokens)


# --- Trace and lenses -----------------------------------------------------------------------------------

def test_channel_lens_is_the_models_own_vocabulary_projection(symbolic_model):
  """The lens of W_head X_t with the layer's τ reproduces the α the value projection sowed (eqs. 21-22)."""
  model, params, tokens = symbolic_model
  cfg = model.config
  tr = interpret.trace(model, params, tokens)
  table = np.asarray(params['embed']['embedding'], np.float64)
  for l in range(cfg.num_layers):
    w_head = np.asarray(params[f'layer_{l}']['value_map']['w_head'], np.float64)
    z = ref.kronecker_value(tr.streams[l]['x_t'], w_head, cfg.head_dim)
    tau = tr.heads.tau_value[l]
    lens = core.channel_lens(z, table, cfg.num_heads, cfg.vocab_size, tau)
    d = cfg.head_dim
    for h in range(cfg.num_heads):
      _, alpha = ref.vocab_projection(z[..., h * d:(h + 1) * d], table[:, h * d:(h + 1) * d], tau[h])
      assert ref.rel_err(lens[..., h, :], alpha) <= 1e-5
      assert ref.rel_err(tr.value_mixtures[l][..., h, :], alpha) <= 1e-4


def test_trace_holds_every_layer_stream_and_head(model_and_params):
  model, params, tokens = model_and_params
  cfg = model.config
  tr = interpret.trace(model, params, tokens, with_cone=False)
  b, t = tokens.shape
  assert len(tr.streams) == len(tr.lens) == len(tr.logit_lens) == cfg.num_layers + 1
  assert tr.attention.shape == (cfg.num_layers, b, cfg.num_heads, t, t)
  for layer in tr.lens:
    assert set(layer) == set(core.stream_names(cfg))
    for probs in layer.values():
      assert probs.shape == (b, t, cfg.num_heads, cfg.vocab_size)
      np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-9)
  # The logit lens of the last layer is the model's output.
  assert ref.rel_err(tr.logit_lens[-1], tr.logits) <= 1e-5
  ids, probs = tr.top_tokens(cfg.num_layers, 'x', k=2)
  assert ids.shape == (b, t, cfg.num_heads, 2) and (probs[..., 0] >= probs[..., 1]).all()


def test_cone_cosine_is_one_inside_the_cone_and_less_outside():
  table = np.array([[1.0, 0.0], [0.0, 1.0]])                   # one head, E = the standard basis
  x = np.array([[1.0, 1.0], [1.0, -1.0], [-1.0, 0.0]])
  np.testing.assert_allclose(interpret.cone(x, table, 1, 2)[:, 0], [1.0, 1 / np.sqrt(2), 0.0], atol=1e-9)


@pytest.mark.slow
def test_symbolic_streams_lie_in_their_cones_and_token_factored_streams_need_not(symbolic_model):
  model, params, tokens = symbolic_model
  tr = interpret.trace(model, params, tokens[:1])
  table = params['embed']['embedding']
  for states in tr.streams[1:]:
    assert interpret.cone(states['x_t'], table, model.config.num_heads, model.config.vocab_size).min() > 0.999
  # Channels wider than the vocabulary, so the cone is a proper subset of each channel's space.
  tf = Transformer(small(kind='token_factored', head_dim=16))
  tf_params = randomize(shapes_of(tf, tokens), 9, scale=0.5)['params']
  tr = interpret.trace(tf, tf_params, tokens[:1])
  assert len(tr.cone_cosine) == tf.config.num_layers + 1
  assert tr.cone_cosine[-1]['x_e'].min() < 0.99


# --- Direct logit attribution ---------------------------------------------------------------------------

def test_stream_attribution_sums_to_the_logits(model_and_params):
  model, params, tokens = model_and_params
  cfg = model.config
  parts = attribution.stream_attribution(model, params, tokens)
  assert set(parts) == {'embedding', 'bias'} | {f'{s}_{l}' for s in ('attention', 'ffn')
                                                 for l in range(cfg.num_layers)}
  logits = np.asarray(model.apply({'params': params}, jnp.asarray(tokens)), np.float64)
  assert ref.rel_err(sum(parts.values()), logits) <= 1e-5
  grouped = attribution.group_attribution(parts, cfg.kind != 'standard')
  assert ref.rel_err(sum(grouped.values()), logits) <= 1e-5


def test_final_norm_transcription_matches_the_paper_equations(model_and_params):
  """core.readout (used by the lenses and the attribution) against eq. 18 / standard LayerNorm."""
  model, params, tokens = model_and_params
  cfg = model.config
  tr = interpret.trace(model, params, tokens, with_cone=False)
  x = tr.streams[-1]['x']
  p = params['norm_final']
  gamma, beta = np.asarray(p['scale'], np.float64), np.asarray(p['bias'], np.float64)
  if cfg.kind == 'symbolic':
    h = ref.channel_layer_norm(x, gamma, beta, cfg.num_heads, EPS)
  else:
    h = ref.layer_norm(x, gamma, beta, EPS)
  expected = h @ np.asarray(params['embed']['embedding'], np.float64).T
  assert ref.rel_err(core.readout(cfg, params, x), expected) <= 1e-9


# --- Interventions --------------------------------------------------------------------------------------

def test_no_intervention_changes_nothing_and_ablating_a_stream_update_removes_it(model_and_params):
  model, params, tokens = model_and_params
  cfg = model.config
  clean, inter = core.run(model, params, tokens)
  same, _ = interventions.run_with(model, params, tokens, [])
  np.testing.assert_allclose(clean, same, rtol=1e-6, atol=1e-6)  # compiled against core.run's eager pass
  _, hit = interventions.run_with(model, params, tokens, [interventions.Ablation('attention', 1)])
  _, hit_ffn = interventions.run_with(model, params, tokens, [interventions.Ablation('ffn', 0)])
  if cfg.kind == 'standard':
    np.testing.assert_allclose(hit['blocks.1.resid_mid'], hit['blocks.0.resid'], atol=1e-6)
    np.testing.assert_allclose(hit_ffn['blocks.0.resid'], hit_ffn['blocks.0.resid_mid'], atol=1e-6)
  else:   # layer 1's attention no longer writes X_t; layer 0's FFN no longer writes X_e
    np.testing.assert_allclose(hit['blocks.1.x_t_mid'], hit['blocks.0.x_t'], atol=1e-6)
    np.testing.assert_allclose(hit_ffn['blocks.0.x_e'], 0.0, atol=1e-7)
  state = 'blocks.0.resid' if cfg.kind == 'standard' else 'blocks.0.x_t'
  np.testing.assert_allclose(hit[state], inter[state], rtol=1e-6, atol=1e-6)


def test_knocking_out_every_head_equals_ablating_the_attention(model_and_params):
  model, params, tokens = model_and_params
  H = model.config.num_heads
  heads, _ = interventions.run_with(model, params, tokens,
                                    [interventions.Ablation('head', 0, h) for h in range(H)])
  whole, _ = interventions.run_with(model, params, tokens, [interventions.Ablation('attention', 0)])
  clean, _ = core.run(model, params, tokens)
  np.testing.assert_allclose(heads, whole, atol=1e-5)
  assert np.abs(heads - clean).max() > 1e-3
  one, _ = interventions.run_with(model, params, tokens, [interventions.Ablation('head', 0, 1)])
  assert np.abs(one - clean).max() > 1e-4 and np.abs(one - whole).max() > 1e-4


def test_mean_and_patch_ablations_use_the_right_values(model_and_params, monkeypatch):
  model, params, tokens = model_and_params
  km = np.ones(tokens.shape, bool)
  km[1, -2:] = False
  site = interventions.Ablation('head', 1, 2, mode='mean')
  captured = interventions.capture(model, params, tokens, [site], km)[0]
  after = _capture_after(monkeypatch, model, params, tokens, site, km, reference='prompt')
  np.testing.assert_allclose(after, np.broadcast_to(captured[km].mean(0), after.shape), atol=1e-5)
  # By default the mean comes from a reference batch one gives, never silently from the prompt itself.
  reference = (tokens + 3) % model.config.vocab_size
  from_reference = interventions.capture(model, params, reference, [site])[0]
  after = _capture_after(monkeypatch, model, params, tokens, site, km, reference=reference)
  np.testing.assert_allclose(after, np.broadcast_to(from_reference.reshape(-1, from_reference.shape[-1]).mean(0),
                                                    after.shape), atol=1e-5)
  with pytest.raises(ValueError, match="a 'mean' ablation needs reference="):
    interventions.run_with(model, params, tokens, [site])
  source = (tokens + 1) % model.config.vocab_size
  patch = interventions.Ablation('head', 1, 2, mode='patch')
  after = _capture_after(monkeypatch, model, params, tokens, patch, None, source=source)
  np.testing.assert_allclose(after, interventions.capture(model, params, source, [patch])[0], atol=1e-5)
  assert np.abs(after - interventions.capture(model, params, tokens, [patch])[0]).max() > 1e-3
  with pytest.raises(ValueError, match='needs source='):
    interventions.run_with(model, params, tokens, [patch])
  with pytest.raises(ValueError, match='same shape'):
    interventions.run_with(model, params, tokens, [patch], source=source[:, :3])


def _capture_after(monkeypatch, model, params, tokens, ablation, key_mask, **kw):
  """The site's value as the rest of the model sees it with the ablation in place: ``run_with``'s own pass,
  made to keep the sites it hooks (a hooked site is kept as its hook leaves it)."""
  apply = hooks._apply
  also = lambda keep, fns: keep | frozenset(fns) if isinstance(keep, frozenset) else keep
  monkeypatch.setattr(hooks, '_apply', lambda m, p, t, km, fns, keep, mutable: apply(m, p, t, km, fns, also(keep, fns),
                                                                                      mutable))
  _, inter = interventions.run_with(model, params, tokens, [ablation], key_mask, **kw)
  monkeypatch.setattr(hooks, '_apply', apply)
  return interventions._part(model.config, ablation, inter[interventions._site(model.config, ablation)])


@pytest.mark.parametrize('ablation, message', [
    (interventions.Ablation('mlp', 0), r"site must be one of \['attention', 'ffn', 'head'\]"),
    (interventions.Ablation('head', 0, 7), r'head ablation needs head in 0..2'),
    (interventions.Ablation('attention', 5), r'layer 5 out of range: layers are 0..1'),
    (interventions.Ablation('ffn', 0, 1), r"only site 'head' takes a head"),
    (interventions.Ablation('ffn', 0, mode='noise'), r"mode must be one of \['zero', 'mean', 'patch'\]"),
])
def test_bad_ablations_are_clear_errors(symbolic_model, ablation, message):
  model, params, tokens = symbolic_model
  with pytest.raises(ValueError, match=message):
    interventions.run_with(Transformer(small(kind='symbolic')), params, tokens, [ablation])


# --- Token importance -----------------------------------------------------------------------------------

def test_native_importance_rows_are_distributions_over_readable_positions(model_and_params):
  model, params, tokens = model_and_params
  blocks = attribution.native_importance(model, params, tokens)
  L, b, t = model.config.num_layers, *tokens.shape
  assert blocks.shape == (L, b, t, t)
  assert (blocks >= 0).all()
  np.testing.assert_allclose(blocks.sum(-1), 1.0, rtol=1e-6)             # float32 attention weights
  np.testing.assert_allclose(np.triu(blocks, 1), 0.0, atol=1e-12)       # causal: no future position


def test_native_importance_follows_a_hand_built_flow():
  """Layer 0 attends to the previous position, layer 1 to position 0. By hand, position 3 holds itself
  with weight ½·½, position 2 (via layer 0) ½·½, and position 0 (via layer 1, where position 0 holds only
  itself) ½."""
  t = 4
  prev = np.zeros((t, t)); prev[0, 0] = 1; prev[np.arange(1, t), np.arange(t - 1)] = 1
  first = np.zeros((t, t)); first[:, 0] = 1
  attention = np.stack([prev, first])[:, None, None]                      # [layers, b, heads, t, t]
  flow = attribution.attention_flow(attention, np.ones((2, 1, 1)))
  np.testing.assert_allclose(flow[0, 0, 3], [0.0, 0.0, 0.5, 0.5])
  np.testing.assert_allclose(flow[1, 0, 3], [0.5, 0.0, 0.25, 0.25])
  # Two channels, head 0 reading only channel 1 (W_head = swap) and attending to position 0; head 1
  # attending to itself. After layer 1, channel 0 of position 3 holds half of what channel 1 held at
  # position 0 after layer 0.
  swap = np.array([[0.0, 1.0], [1.0, 0.0]])
  two = np.stack([np.stack([prev, np.eye(t)]), np.stack([first, np.eye(t)])])[:, None]
  flow = attribution.attention_flow(two, np.stack([np.eye(2), swap]))
  # layer 0: channel 0 row 3 = [0,0,.5,.5], channel 1 = I; layer 1: channel 0 row 3 = ½[0,0,.5,.5] + ½ e0
  # (channel 1 at position 0), channel 1 row 3 = ½ e3 + ½ (channel 0 at 3 after layer 0) = [0,0,.25,.75].
  np.testing.assert_allclose(flow[1, 0, 3], 0.5 * (np.array([0.5, 0, 0.25, 0.25]) + np.array([0, 0, 0.25, 0.75])))


@pytest.mark.slow
def test_integrated_gradients_is_complete_and_input_x_gradient_is_its_one_step_cousin(model_and_params):
  model, params, tokens = model_and_params
  targets = (tokens * 3 + 1) % model.config.vocab_size
  ig = attribution.gradient_importance(model, params, tokens, targets, None, 'integrated_gradients', 256,
                                       signed=True)
  gap = attribution.target_logprob(model, params, tokens, targets) - attribution.target_logprob(
      model, params, tokens, targets, baseline='mean')
  np.testing.assert_allclose(ig.sum(-1), gap, atol=2e-3 * max(1.0, np.abs(gap).max()))
  assert np.abs(gap).max() > 0.1
  ixg = attribution.gradient_importance(model, params, tokens, targets, None, 'input_x_gradient', signed=True)
  if model.config.causal:
    np.testing.assert_allclose(np.triu(ixg, 1), 0.0, atol=1e-7)
  assert np.abs(ixg).max() > 0
  with pytest.raises(ValueError, match="method must be 'input_x_gradient' or 'integrated_gradients'"):
    attribution.gradient_importance(model, params, tokens, targets, method='saliency')


def test_ground_truth_and_precision_at_k_on_hand_made_sequences():
  vocab = induction_task.vocab()
  seq = vocab.encode('<s> a 1 b 2 a 1 b'.split())[None]
  truth, queries = attribution.induction_truth(seq, vocab)
  assert np.nonzero(queries[0])[0].tolist() == [5, 7]
  assert np.nonzero(truth[0, 5])[0].tolist() == [1, 2]
  assert np.nonzero(truth[0, 7])[0].tolist() == [3, 4]
  cands = attribution.candidates(seq, None, causal=True)
  scores = np.zeros((1, 8, 8))
  scores[0, 5, 2] = 1.0        # right at position 5
  scores[0, 7, 6] = 1.0        # wrong at position 7
  assert attribution.precision_at_k(scores, truth, cands, queries, 1) == 0.5
  assert attribution.random_precision_at_k(truth, cands, queries) == pytest.approx((2 / 5 + 2 / 7) / 2)
  from symjax.tasks import rasp
  rv = rasp.RaspTask('reverse').vocab
  seq = rv.encode('<s> 1 2 3 4 </s> <pad> <pad>'.split())[None]
  truth, queries = attribution.reverse_truth(seq, rv)
  assert [int(np.nonzero(truth[0, i])[0][0]) for i in range(1, 5)] == [4, 3, 2, 1]
  seq = rv.encode('<s> 1 2 3 </s>'.split())[None]
  assert attribution.reverse_truth(seq, rv)[1][0].tolist() == [False, True, False, True, False]


# --- Heads and the program view -------------------------------------------------------------------------

def test_head_scores_on_hand_built_attention():
  t = 6
  tokens = np.array([[0, 5, 6, 7, 5, 6]])
  prev = np.zeros((t, t)); prev[0, 0] = 1; prev[np.arange(1, t), np.arange(t - 1)] = 1
  ind = np.eye(t); ind[4] = 0; ind[4, 2] = 1; ind[5] = 0; ind[5, 3] = 1   # 5 -> after the earlier 5, etc.
  attention = np.stack([prev[None, None], ind[None, None]])                # [layers, b, heads, t, t]
  np.testing.assert_allclose(circuits.previous_token_scores(attention)[:, 0], [1.0, 0.0])
  np.testing.assert_allclose(circuits.induction_scores(attention, tokens)[:, 0], [0.0, 1.0])


def test_a_previous_token_head_does_not_score_as_induction_where_a_token_repeats_two_positions_on():
  """In ``a b a b``, the key after the earlier ``a`` is the query's previous position: a previous-token head
  reads it whatever the tokens, so it is no induction target; the key after an earlier, farther copy is."""
  tokens = np.array([[3, 4, 3, 4, 9, 3]])
  targets = circuits.induction_targets(tokens)[0]
  assert np.argwhere(targets).tolist() == [[5, 1], [5, 3]]       # the last 3 only: s = 1 and 3, not s = i − 1
  t = tokens.shape[1]
  prev = np.zeros((t, t)); prev[0, 0] = 1; prev[np.arange(1, t), np.arange(t - 1)] = 1
  np.testing.assert_allclose(circuits.induction_scores(prev[None, None, None], tokens), [[0.0]])


def test_program_view_reads_the_heads_writes_from_the_mixture_trace(symbolic_model):
  model, params, tokens = symbolic_model
  cfg = model.config
  steps = interpret.program(model, params, tokens[0])
  assert len(steps) == cfg.num_layers * cfg.num_heads * tokens.shape[1]
  trace = mixtures.mixture_trace(model, params, tokens[:1])
  attention = circuits.attention_stack(model, params, tokens[:1])
  for s in steps:
    assert s.writes == int(np.argmax(trace.attention_terms[s.layer][0, s.position, s.head]))
    assert s.attends == int(np.argmax(attention[s.layer, 0, s.head, s.position])) and s.attends <= s.position
  text = interpret.format_program(steps, tokens[0], lambda ids: f't{ids[0]}')
  assert text.count('\n') + 1 == len(steps) + cfg.num_layers * cfg.num_heads
  assert re.search(r"L1\.H2  @3 +'t\d+' +attends @\d", text)


def test_head_writes_are_distributions_and_standard_heads_add_up_to_the_attention(model_and_params):
  model, params, tokens = model_and_params
  writes, attention = circuits.head_writes(model, params, tokens)
  cfg = model.config
  assert writes.shape == (cfg.num_layers, *tokens.shape, cfg.num_heads, cfg.vocab_size)
  np.testing.assert_allclose(writes.sum(-1), 1.0, rtol=1e-6)
  if cfg.kind == 'standard':
    _, inter = core.run(model, params, tokens)
    per_head = circuits._standard_head_outputs(cfg, params, 1, tokens, None, core.analysis_model(model))
    assert ref.rel_err(per_head.sum(2), core.components(cfg, inter)['attention_1']) <= 1e-5


# --- A trained checkpoint: circuit, stream ablations, report and CLI ------------------------------------

@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
  config = config_lib.default_config(kind='symbolic', shape=configs.shape('tiny'))
  config.total_steps = 30
  config.warmup_steps = 5
  config.batch_size = 16
  config.eval_every_steps = 30
  config.progress_bar = False
  workdir = str(tmp_path_factory.mktemp('interp') / 'work')
  train.train_and_evaluate(config, workdir)
  import symjax
  from symjax import tasks
  loaded = symjax.load(workdir)
  task = tasks.get_task(loaded.config)
  batch = next(task.eval_batches('test', 64, 0))
  return workdir, loaded, task, batch


@pytest.mark.slow
def test_induction_tools_run_on_a_trained_checkpoint(tiny_run):
  _, run, task, batch = tiny_run
  circuit = induction.find_circuit(run.model, run.params, batch, task.vocab)
  (il, ih), (pl, ph) = circuit.induction_head, circuit.previous_token_head
  assert circuit.induction_scores[il, ih] == circuit.induction_scores.max()
  assert il == 0 or pl < il
  earlier = circuit.previous_token_scores[:il] if il else circuit.previous_token_scores
  assert circuit.previous_token_scores[pl, ph] == earlier.max()
  assert circuit.induction_head in circuit.induction_heads
  for mode in induction.KNOCKOUT_MODES:
    table = induction.knockouts(run.model, run.params, batch, task.vocab, circuit, mode)
    assert list(table)[0] == 'none' and len(table) == 4
    assert all(0.0 <= r['accuracy'] <= 1.0 and r['queries'] == table['none']['queries'] for r in table.values())
  with pytest.raises(ValueError, match=r"knockout mode must be one of \['mean', 'zero', 'resample'\]"):
    induction.knockouts(run.model, run.params, batch, task.vocab, circuit, 'noise')
  assert 0.0 <= induction.context_guess_accuracy(batch, task.vocab) <= 1.0
  streams = attribution.stream_ablations(run.model, run.params, [batch])
  logits, _ = core.run(run.model, run.params, batch['inputs'], batch['key_mask'])
  assert streams['none'] == pytest.approx(metrics.token_metrics(logits, batch['targets'], batch['weights'])['accuracy'])
  assert set(streams) == {'none', 'readout_without_x_e', 'readout_without_x_t', 'x_e_mean', 'x_t_mean'}
  r = attribution.evaluate_importance(run.model, run.params, [batch], 'induction', task.vocab, True, steps=8)
  assert r['queries'] > 0 and all(0.0 <= r[m] <= 1.0 for m in attribution.METHODS)


@pytest.mark.slow
def test_report_cli_writes_a_self_contained_html_report(tiny_run):
  workdir, _, _, _ = tiny_run
  out = subprocess.run([sys.executable, '-m', 'symjax.report', f'--workdir={workdir}',
                        '--input=<s> a 1 b 2 c 3 d 0 a', '--ig_steps=8'],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  path = os.path.join(workdir, 'interpret', 'report.html')
  assert f'report: {path}' in out.stdout
  text = open(path, encoding='utf-8').read()
  for section in ('Input and prediction', 'Heads', 'Attention', 'Program view', 'Per-head parameters',
                  'Channel lens', 'Exact mixture trace', 'Stream attribution', 'Token importance'):
    assert f'<h2>{section}</h2>' in text
  assert len(re.findall(r'<img src="data:image/png;base64,', text)) == 5
  assert not re.search(r'(src|href)="(http|/|file:)', text)                # nothing outside the file
  assert re.search(r'induction head L\d\.H\d', text)


@pytest.mark.slow
def test_report_cli_rejects_bad_input(tiny_run):
  workdir, run, _, _ = tiny_run
  with pytest.raises(ValueError, match=r"could not be tokenised for task 'induction'.*not in the vocabulary"):
    cli.encode(run, '<s> a 1 zebra')
  with pytest.raises(ValueError, match='at most model.max_len = 64'):
    cli.encode(run, ' '.join(['a'] * 65))
  with pytest.raises(ValueError, match=r'--position 12 is outside the input of 10 tokens \(allowed: -10..9\)'):
    cli.check_position(list(range(10)), 12)
  out = subprocess.run([sys.executable, '-m', 'symjax.report', f'--workdir={workdir}', '--input=<s> q'],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  assert out.returncode == 2 and 'error: --input could not be tokenised' in out.stderr


def test_token_ids_outside_the_vocabulary_are_an_error_not_nan(tiny_run):
  """An embedding lookup out of range gives NaN in JAX; every tool checks the ids first."""
  _, run, _, _ = tiny_run
  v = run.model_config.vocab_size
  for bad in ([1, 2, v], [-1, 2]):
    with pytest.raises(ValueError, match=rf'token ids must be in \[0, {v}\) \(the model.s vocabulary\), got '
                                         rf'\[{bad[-1] if bad[-1] == v else -1}\]'):
      tracing.trace(run.model, run.params, bad)
  with pytest.raises(ValueError, match=r'token ids must be in'):
    attribution.target_logprob(run.model, run.params, [[1, v + 5]], [[1, 2]])


def test_report_is_not_written_over_a_folder_and_leaves_no_temporary_file(tmp_path):
  from symjax.interpret import report
  (tmp_path / 'reports').mkdir()
  with pytest.raises(ValueError, match=r"is a folder; give a file path such as '.*reports/report.html'"):
    report.write_report(str(tmp_path / 'reports'), '<html></html>')
  (tmp_path / 'old.html').write_text('kept')
  with pytest.raises(TypeError):  # a failed write (here: not text) keeps the old report
    report.write_report(str(tmp_path / 'old.html'), None)
  assert (tmp_path / 'old.html').read_text() == 'kept'
  assert sorted(p.name for p in tmp_path.iterdir()) == ['old.html', 'reports']


def test_the_report_shows_invisible_tokens_exact_mixtures_and_names_heads_only_on_evidence():
  """A space or a line end is a token: the report shows it (␣, ⏎), never a blank cell; its mixtures are the
  exact weights; with no repeated token it names no induction head; and a channel whose embeddings span its
  space is said to make the cone check uninformative."""
  from symjax.interpret import report
  chars = ['a', 'b', ' ', '\n', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k']
  cfg = small(kind='symbolic')
  model = Transformer(cfg)
  tokens = np.array([0, 2, 1, 3, 4, 5, 6])                    # 'a b⏎cde': no token repeats
  params = randomize(shapes_of(model, tokens[None])['params'], 5)
  decode = lambda ids: ''.join(chars[int(i)] for i in ids)
  text = report.build_report(model, params, tokens, decode, ig_steps=4)
  assert '␣' in text and '⏎' in text
  assert not re.search(r'<td>\s*</td>', text)
  assert '<h2>Exact mixtures at position 6:' in text and 'not a lens' in text
  assert 'No head is named' in text and 'induction head L' not in text
  assert 'after block 1, x_e' in text and '<h3>layer 0' not in text  # block l, not the stream index
  assert report.induction_evidence(np.array([0, 1, 2, 0])) == 1 and report.induction_evidence(tokens) == 0
  wide = np.concatenate([np.eye(4), -np.eye(4)])               # ±e_i positively span R^4
  narrow = np.abs(wide)                                        # the positive orthant only
  one_channel = cfg.replace(num_heads=1, head_dim=4, vocab_size=8)
  assert report.spanning_channels(wide, one_channel) == [0] and report.spanning_channels(narrow, one_channel) == []
