"""Edge patching and circuit discovery on Transformer Programs whose circuits are known (``symjax.interpret.edges``),
and the true edges a decompiled program gives (``program_code.true_edges``)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_transformer_program import TOKENS, choose, config, every_input, hand_built, init

from symjax.interpret import edges
from symjax.model import ModelConfig, build
from symjax.model import transformer_program as tp
from symjax.proj import program_code
from symjax.system.errors import InputError

INDUCTION_TRUTH = {'positions->a0.h0<q>', 'positions->a0.h0<k>', 'tokens->a0.h0<v>', 'tokens->a1.h0<q>',
                   'a0.h0->a1.h0<k>', 'tokens->a1.h0<v>', 'a1.h0->logits'}
# The positions are the same in the clean and the corrupt run: no patch moves an edge from them.
FINDABLE = {e for e in INDUCTION_TRUTH if not e.startswith('positions->')}


def induction_program():
  """Head a0.h0 copies the previous position's token; head a1.h0 finds the closest earlier position whose previous
  token is the query's token and copies that position's token: the two-head induction circuit. Head a1.h1 reads
  the tokens too, and nothing reads it. The readout tags each position with a1.h0's token."""
  cfg = config(num_layers=2, num_heads=2, numerical_heads=0, mlps=0, causal=True, max_len=8)
  params = jax.tree.map(jnp.zeros_like, init(cfg))
  card = tp.cardinality(cfg)
  previous = np.full((card, card), -1.0)
  previous[np.arange(1, card), np.arange(card - 1)] = 1.0
  previous[0, card - 1] = 1.0                       # position 0 has no previous one: a value no key holds
  same = np.where(np.eye(card) > 0, 1.0, -1.0)
  params['attn_0_0'] = dict(select_query=choose(2, 1), select_key=choose(2, 1), select_value=choose(2, 0),
                            predicate=jnp.asarray(previous))
  params['attn_0_1'] = dict(select_query=choose(2, 0), select_key=choose(2, 0), select_value=choose(2, 1),
                            predicate=jnp.asarray(same))
  params['attn_1_0'] = dict(select_query=choose(4, 0), select_key=choose(4, 2), select_value=choose(4, 0),
                            predicate=jnp.asarray(same))
  params['attn_1_1'] = dict(select_query=choose(4, 0), select_key=choose(4, 3), select_value=choose(4, 1),
                            predicate=jnp.asarray(same))
  readout = np.zeros((cfg.vocab_size, 6 * card + 1))    # tokens, positions, a0.h0, a0.h1, a1.h0, a1.h1
  readout[np.arange(cfg.vocab_size), 4 * card + np.arange(cfg.vocab_size)] = 4.0
  params['readout'] = jnp.asarray(readout)
  return cfg, params


def induction_batch(n: int = 96, seed: int = 0):
  """Sequences of 8 symbols over 'a', 'b', 'c' (so that tokens repeat), and as many others for the corrupt run."""
  rng = np.random.default_rng(seed)
  return [np.asarray(rng.choice([2, 3, 4], size=(n, 8))) for _ in range(2)]


def copy_program():
  """One head, a0.h0, copies the previous position's token and the readout tags each position with it; head a0.h1
  reads the tokens too, and nothing reads it: the one-head copy circuit."""
  cfg, params = induction_program()
  card = tp.cardinality(cfg)
  readout = np.zeros((cfg.vocab_size, 6 * card + 1))
  readout[np.arange(cfg.vocab_size), 2 * card + np.arange(cfg.vocab_size)] = 4.0   # a0.h0's token
  params['readout'] = jnp.asarray(readout)
  return cfg, params


def test_every_method_ranks_the_one_head_copy_circuit_first():
  cfg, params = copy_program()
  clean, corrupt = induction_batch(seed=4)
  e = edges.Edges(build(cfg), params, clean, corrupt)
  truth = {'tokens->a0.h0<v>', 'a0.h0->logits'}                  # its query and key read positions
  assert set(program_code.true_edges(params, cfg, TOKENS, clean, np.full(len(clean), 8))) == truth | {
      'positions->a0.h0<q>', 'positions->a0.h0<k>'}
  mask = e.graph.mask(sorted(truth))
  for scores in (e.exact(), e.eap(), e.eap_ig(), e.atp_star(grad_drop=False), e.acdc(1e-3)[1]):
    assert np.abs(scores)[mask].min() > np.abs(scores)[~mask].max()
  assert {edge for edge, kept in zip(e.graph.edges, e.acdc(1e-3)[0]) if kept} == truth


@pytest.fixture(scope='module')
def induction():
  cfg, params = induction_program()
  clean, corrupt = induction_batch()
  return cfg, params, clean, corrupt, edges.Edges(build(cfg), params, clean, corrupt)


@pytest.fixture(scope='module')
def histogram():
  """The hand-built histogram program: a counting head the readout reads, a dead head and a dead MLP."""
  cfg = config()
  params = hand_built(cfg)
  x, lengths = every_input(4, cfg.max_len)
  rng = np.random.default_rng(1)
  corrupt = x.copy()
  for n in np.unique(lengths):                       # another input of the same length
    rows = np.nonzero(lengths == n)[0]
    corrupt[rows] = x[rng.permutation(rows)]
  return cfg, params, x, lengths, edges.Edges(build(cfg), params, x, corrupt, key_mask=x != 0)


def test_the_graph_has_an_edge_per_input_and_variable_written_before_it():
  cfg = config(num_layers=2, num_heads=2, numerical_heads=1, mlps=1)
  g = edges.graph_of(cfg)
  assert g.nodes == ('tokens', 'positions', 'a0.h0', 'a0.h1', 'm0.0', 'a1.h0', 'a1.h1', 'm1.0', 'logits')
  # Layer 0: a categorical head's 3 inputs and a numerical head's 2 read 2 variables; the MLP's 2 read 4. Layer 1:
  # 5 inputs read 5 variables, the MLP's 2 read 7; the readout reads all 8.
  assert len(g.edges) == 5 * 2 + 2 * 4 + 5 * 5 + 2 * 7 + 8
  assert {'tokens->a0.h0<q>', 'a0.h1->m0.0<second>', 'm0.0->a1.h1<k>', 'a1.h1->m1.0<first>', 'm1.0->logits'} \
      <= set(g.edges)
  assert 'a1.h0->a1.h1<q>' not in g.edges           # heads of one layer read the stream before it
  # Numerical heads kept from positions read one variable fewer, query and key alike.
  blind = edges.graph_of(config(num_layers=2, num_heads=2, numerical_heads=1, mlps=1, numerical_positions=False))
  assert set(g.edges) - set(blind.edges) == {'positions->a0.h1<q>', 'positions->a0.h1<k>', 'positions->a1.h1<q>',
                                             'positions->a1.h1<k>'}


@pytest.mark.parametrize('method', ['exact', 'eap', 'eap_ig', 'atp_star'])
def test_every_method_ranks_the_induction_circuit_first(induction, method):
  *_, e = induction
  scores = np.abs(e.atp_star(grad_drop=False) if method == 'atp_star' else getattr(e, method)())
  truth = e.graph.mask(sorted(FINDABLE))
  assert scores[truth].min() > scores[~truth].max()
  assert edges.auroc(scores, truth) == 1.0


def test_atp_star_reads_query_and_key_edges_through_the_pattern_and_drops_each_layer_in_turn(induction):
  *_, e = induction
  qk = np.array([edge.endswith(('<q>', '<k>')) for edge in e.graph.edges])
  fixed, plain = e.atp_star(grad_drop=False), np.abs(e.eap())
  np.testing.assert_allclose(fixed[~qk], plain[~qk], rtol=1e-6)
  # The previous-token head's output moves a1.h0's pattern; through the saturated softmax EAP sees a sliver of it.
  key = e.graph.index['a0.h0->a1.h0<k>']
  assert fixed[key] > 10 * plain[key]
  # GradDrop: every path from a layer-0 head runs through layer 1, so dropping layer 0 (its own) or layer 1 leaves
  # it nothing; an edge into layer 1 keeps its estimate when layer 0 is dropped; one into the logits keeps it twice.
  dropped = e.atp_star()
  reader_layer = np.array([e.graph.layer[r] for r in e.graph.ends[1]])
  assert (dropped[reader_layer == 0] == 0).all()
  np.testing.assert_allclose(dropped[reader_layer == 1], fixed[reader_layer == 1], rtol=1e-5)
  np.testing.assert_allclose(dropped[reader_layer == 2], 2 * fixed[reader_layer == 2], rtol=1e-5)


def test_acdc_keeps_the_induction_circuit_and_nothing_else(induction):
  *_, e = induction
  kept, _ = e.acdc(threshold=1e-3)
  assert {edge for edge, k in zip(e.graph.edges, kept) if k} == FINDABLE
  assert e.faithfulness(kept) == pytest.approx(1.0, abs=1e-6)


def test_the_decompiled_program_gives_the_circuit_it_computes(induction, histogram):
  cfg, params, clean, *_ = induction
  assert set(program_code.true_edges(params, cfg, TOKENS, clean, np.full(len(clean), 8))) == INDUCTION_TRUTH
  # The histogram's dead head and MLP, and the inputs its counting head's predicate does not read, are left out.
  cfg, params, x, lengths, _ = histogram
  assert program_code.true_edges(params, cfg, TOKENS, x, lengths) == [
      'a0.h1->logits', 'tokens->a0.h1<k>', 'tokens->a0.h1<q>']


def test_patching_an_edge_the_model_does_not_read_changes_nothing(histogram):
  cfg, params, x, lengths, e = histogram
  chosen = set(program_code.true_edges(params, cfg, TOKENS, x, lengths))
  # The selections: what each input reads, the dead head's and MLP's included.
  selected = chosen | {'tokens->a0.h0<v>', 'positions->a0.h0<q>', 'positions->a0.h0<k>', 'a0.h0->m0.0<first>',
                       'a0.h1->m0.0<second>'}
  into_logits = {edge for edge in e.graph.edges if edge.endswith('->logits')}
  assert {edge for edge, read in zip(e.graph.edges, e.read) if read} == selected | into_logits
  unread = [edge for edge in e.graph.edges if edge not in selected | into_logits]
  assert unread and max(abs(e.value([edge]) - e.value()) for edge in unread) <= 1e-6
  assert np.abs(e.logits(unread) - e.logits()).max() <= 1e-6


def test_every_edge_keeps_the_model_and_no_edge_gives_the_corrupt_run(histogram):
  cfg, params, x, _, e = histogram
  n = len(e.graph.edges)
  assert e.faithfulness(np.ones(n, bool)) == 1.0 and e.faithfulness(np.zeros(n, bool)) == 0.0
  corrupt = build(cfg).apply({'params': params}, e.corrupt, jnp.asarray(x != 0))
  assert np.abs(e.logits(np.ones(n, np.float32)) - np.asarray(corrupt)).max() <= 1e-6
  assert e.value(np.ones(n, np.float32)) == pytest.approx(float(e.metric(corrupt)), abs=1e-6)


def test_eap_is_the_exact_patch_for_a_metric_linear_in_the_edge(histogram):
  cfg, params, x, _, e = histogram
  weights = jnp.asarray(np.random.default_rng(0).normal(size=(*x.shape, cfg.vocab_size)), jnp.float32)
  linear = edges.Edges(build(cfg), params, x, e.corrupt, metric=lambda logits: (logits * weights).sum(),
                       key_mask=x != 0)
  # The readout is linear in every variable's one-hot: an edge into the logits moves the metric linearly.
  into_logits = np.array([edge.endswith('->logits') for edge in linear.graph.edges])
  np.testing.assert_allclose(linear.eap()[into_logits], linear.exact()[into_logits], rtol=1e-4, atol=1e-3)


def test_resample_pairs_match_lengths_and_never_an_input_with_itself():
  mask = np.arange(6)[None, :] < np.array([3, 4, 3, 5, 3, 4])[:, None]
  rows, partners = edges.resample_pairs(mask, seed=1)
  assert sorted(rows) == [0, 1, 2, 4, 5]                          # length 5 is held by one input: left out
  assert (mask[rows].sum(1) == mask[partners].sum(1)).all() and (rows != partners).all()
  with pytest.raises(InputError, match='no two inputs of the batch have the same length'):
    edges.resample_pairs(np.arange(4)[None, :] < np.array([1, 2, 3])[:, None])


def test_bad_input_is_refused_in_one_line(histogram):
  cfg, params, x, lengths, e = histogram
  with pytest.raises(InputError, match="'a9.h9->logits' is not an edge"):
    e.value(['a9.h9->logits'])
  with pytest.raises(InputError, match='threshold must be a number >= 0'):
    e.acdc(-1.0)
  with pytest.raises(InputError, match='steps must be a positive integer'):
    e.eap_ig(0)
  with pytest.raises(InputError, match='of one shape'):
    edges.Edges(build(cfg), params, x, x[:, :-1])
  standard = ModelConfig.of(kind='standard', vocab_size=10, num_layers=1, num_heads=2, head_dim=4, max_len=8)
  with pytest.raises(InputError, match="come from a program: a Transformer Program.s code"):
    program_code.true_edges({}, standard, TOKENS, x, lengths)


# ---------------------------------------------------------------------------------------------------------
# Residual models: the standard, Token-Factored and Symbolic Transformers.
# ---------------------------------------------------------------------------------------------------------
def residual_model(kind: str):
  cfg = ModelConfig.of(kind=kind, vocab_size=11, num_layers=2, num_heads=2, head_dim=4, max_len=8)
  model = build(cfg)
  params = model.init(jax.random.PRNGKey(1), jnp.zeros((1, 8), jnp.int32))['params']
  # Larger weights than the initialisation's, so that patches move the logits well above rounding.
  params = jax.tree.map(lambda x: x * 5 if x.ndim >= 2 else x, nn.meta.unbox(params))
  rng = np.random.default_rng(2)
  clean, corrupt = rng.integers(0, 11, (4, 8)), rng.integers(0, 11, (4, 8))
  return cfg, model, params, clean, corrupt


@pytest.fixture(scope='module', params=['standard', 'token_factored', 'symbolic'])
def residual(request):
  cfg, model, params, clean, corrupt = residual_model(request.param)
  return cfg, model, params, clean, corrupt, edges.Edges(model, params, clean, corrupt)


def test_a_residual_model_with_no_edge_patched_is_the_clean_run_and_with_every_edge_the_corrupt_one(residual):
  cfg, model, params, clean, corrupt, e = residual
  n = len(e.graph.edges)
  run = lambda tokens: np.asarray(model.apply({'params': params}, jnp.asarray(tokens)))
  np.testing.assert_allclose(e.logits(np.zeros(n, np.float32)), run(clean), atol=1e-5)
  np.testing.assert_allclose(e.logits(np.ones(n, np.float32)), run(corrupt), atol=1e-5)
  # EAP-IG is complete: its scores sum to the change from clean to corrupt, up to the midpoint rule.
  assert e.eap_ig(16).sum() == pytest.approx(e.value(np.ones(n, np.float32)) - e.value(), rel=0.02)


def test_the_two_stream_values_read_x_t_alone():
  standard = edges.graph_of(residual_model('standard')[0])
  factored = edges.graph_of(residual_model('token_factored')[0])
  assert 'm0->a1.h0<v>' in standard.edges and 'm0->a1.h0<v>' not in factored.edges
  assert {'embed->a1.h0<v>', 'a0.h1->a1.h0<v>', 'm0->a1.h0<q>', 'm0->logits'} <= set(factored.edges)
  # 2 layers of 2 heads: layer 0's 6 inputs read embed; the MLP 3 nodes; layer 1's queries and keys 4, its
  # values 4 (standard) or 3 (two-stream); the MLP 6; the logits 7.
  assert len(standard.edges) == 6 + 3 + 2 * 2 * 4 + 2 * 4 + 6 + 7
  assert len(factored.edges) == len(standard.edges) - 2
  stream = dict(zip(factored.edges, factored.streams))
  assert (stream['embed->a1.h0<v>'], stream['a0.h1->m0'], stream['m0->a1.h0<k>']) == ('x_t', 'x_t', 'x_e')
  assert set(standard.streams) == {'resid'}


def _layer_norm(x, p, eps):
  x = x.astype(np.float64)
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * np.asarray(p['scale']) + np.asarray(p['bias'])


def test_a_query_edge_is_the_heads_query_computed_from_the_input_with_that_edge_corrupt():
  """Independently of the edge code: the standard model's head a1.h0 gets the query LN(x) W_Q of its block's input
  x with the embedding's term taken from the corrupt run, every other head its own query."""
  cfg, model, params, clean, corrupt = residual_model('standard')
  e = edges.Edges(model, params, clean, corrupt)
  from symjax.interpret import hooks
  sites = ['embed', 'blocks.0.resid']
  _, ours = hooks.run_with_cache(model, params, clean, sites)
  _, theirs = hooks.run_with_cache(model, params, corrupt, ['embed'])
  x = ours['blocks.0.resid'] - ours['embed'] + theirs['embed']
  p = params['layer_1']
  q0 = _layer_norm(x, p['norm_attn'], cfg.layer_norm_epsilon) @ np.asarray(p['attention']['query']['kernel'])[:, 0]
  want = hooks.run_with_hooks(model, params, clean,
                              {'blocks.1.attn.q': lambda q, name: q.at[:, :, 0].set(q0.astype(q.dtype))})
  np.testing.assert_allclose(e.logits(['embed->a1.h0<q>']), want, atol=2e-6)
  assert np.abs(want - e.logits()).max() > 1e-3                    # the patch did something


def test_a_value_edge_of_the_two_stream_model_maps_x_t_with_that_edge_corrupt():
  """Token-Factored: head a1.h0's value is (W_head ⊗ I) X_t (eq. 8) of the X_t entering block 1 with head a0.h1's
  channel from the corrupt run."""
  cfg, model, params, clean, corrupt = residual_model('token_factored')
  # W_head mixes channels (it starts as the identity): head 0's value reads head a0.h1's channel too.
  params['layer_1']['value_map']['w_head'] = jnp.asarray(np.random.default_rng(3).normal(size=(2, 2)), jnp.float32)
  e = edges.Edges(model, params, clean, corrupt)
  from symjax.interpret import hooks
  _, ours = hooks.run_with_cache(model, params, clean, ['blocks.0.attn.z', 'blocks.0.x_t'])
  _, theirs = hooks.run_with_cache(model, params, corrupt, ['blocks.0.attn.z'])
  x_t = ours['blocks.0.x_t'].reshape(4, 8, 2, 4).astype(np.float64)
  x_t[:, :, 1] += theirs['blocks.0.attn.z'][:, :, 1] - ours['blocks.0.attn.z'][:, :, 1]
  w_head = np.asarray(params['layer_1']['value_map']['w_head'])
  v0 = np.einsum('g,btgd->btd', w_head[0], x_t)
  want = hooks.run_with_hooks(model, params, clean,
                              {'blocks.1.attn.values': lambda v, name: v.at[:, :, 0].set(v0.astype(v.dtype))})
  np.testing.assert_allclose(e.logits(['a0.h1->a1.h0<v>']), want, atol=2e-6)
  assert np.abs(want - e.logits()).max() > 1e-3


def test_a_node_sweep_patches_a_heads_output_at_one_position():
  """Exact: the head's output at that position from the corrupt run (a hook on attn.z), everything after it
  recomputed; the gradient sweeps estimate the same grid."""
  cfg, model, params, clean, corrupt = residual_model('standard')
  e = edges.Edges(model, params, clean, corrupt)
  from symjax.interpret import hooks
  exact = e.node_sweep('exact')                                   # [heads, positions]
  assert exact.shape == (4, 8)
  _, theirs = hooks.run_with_cache(model, params, corrupt, ['blocks.1.attn.z'])
  for head, position in ((2, 3), (3, 7)):                         # a1.h0 and a1.h1
    z = theirs['blocks.1.attn.z'][:, position, head - 2]
    hook = lambda v, name, p=position, h=head - 2, z=z: v.at[:, p, h].set(z)
    patched = hooks.run_with_hooks(model, params, clean, {'blocks.1.attn.z': hook})
    assert exact[head, position] == pytest.approx(float(e.metric(jnp.asarray(patched))) - e.value(), abs=1e-6)
    # The same patch as [edges, time] weights: every edge out of the head, at that position alone.
    out = np.zeros((len(e.graph.edges), 8), np.float32)
    out[[i for i, edge in enumerate(e.graph.edges) if edge.startswith(f'a1.h{head - 2}->')], position] = 1.0
    assert e.value(out) - e.value() == pytest.approx(exact[head, position], abs=1e-6)
  atp = e.node_sweep('atp')
  assert np.corrcoef(exact.ravel(), atp.ravel())[0, 1] > 0.5      # an estimate of the same grid
  assert (e.node_sweep('atp_star') >= 0).all()
  with pytest.raises(InputError, match="unknown node method 'acdc'"):
    e.node_sweep('acdc')
  with pytest.raises(InputError, match="'logits' is not a node with outputs"):
    e.node_sweep('exact', nodes=['logits'])


# ---------------------------------------------------------------------------------------------------------
# A program-trained Symbolic Transformer: the circuit its program computes (``decompile.true_edges``).
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('options', [{}, {'value_map': 'none', 'causal': False, 'qk_positions': True}],
                         ids=['causal', 'identity_values-bidirectional-qk_positions'])
def test_a_symbolic_programs_circuit_alone_tags_every_pair_as_the_clean_run(options):
  from helpers import PROGRAM, every_sequence, randomize, shapes_of

  from symjax.proj import decompile
  cfg = PROGRAM.replace(hard=True, **options)
  model = build(cfg)
  params = randomize(shapes_of(model, jnp.zeros((1, 4), jnp.int32))['params'], 4)
  x = np.concatenate([np.pad(every_sequence(n), ((0, 0), (0, 5 - n))) for n in (4, 5)])
  truth = program_code.true_edges(params, cfg, [], x, (x != 0).sum(1))
  graph = edges.graph_of(cfg)
  assert set(truth) < set(graph.edges)
  rows, partners = edges.resample_pairs(x != 0, 0)
  real = (x != 0)[rows]
  e = edges.Edges(model, params, x[rows], x[partners], key_mask=real)
  clean = np.asarray(e.clean_logits).argmax(-1)[real]
  outside = ~graph.mask(truth)
  np.testing.assert_array_equal(np.asarray(e.logits(outside)).argmax(-1)[real], clean)
  assert (np.asarray(e.logits(np.ones(len(graph.edges), bool))).argmax(-1)[real] != clean).mean() > 0.01
  if cfg.symbolic.value_map == 'none':  # V = X_t: head h's value reads channel h, which head g ≠ h never writes
    crossed = [t for t in truth if t.endswith('<v>') and t.startswith('a')
               and t.split('->')[0].split('.h')[1] != t.split('->')[1].split('.h')[1][:-3]]
    assert not crossed and any(t.endswith('<v>') and t.startswith('a') for t in truth)
  with pytest.raises(InputError, match=r'hard selections \(model.hard = True\)'):
    decompile.true_edges(params, cfg.replace(hard=False), x, (x != 0).sum(1))
  with pytest.raises(InputError, match='model.numerical_heads'):
    decompile.true_edges(params, cfg.replace(numerical_heads=1), x, (x != 0).sum(1))


def test_a_second_object_of_the_same_shapes_runs_the_first_ones_compiled_programs(histogram):
  cfg, params, x, lengths, _ = histogram
  traced = []

  def metric(logits):  # runs once a trace: a list in its closure keys it on itself
    traced.append(1)
    return jax.nn.log_softmax(logits, -1).max(-1).mean()
  rows, partners = edges.resample_pairs(x != 0, 0)
  first = edges.Edges(build(cfg), params, x[rows], x[partners], metric=metric, key_mask=x[rows] != 0)
  second = edges.Edges(build(cfg), params, x[partners], x[rows], metric=metric, key_mask=x[partners] != 0)
  a = first.eap()
  count = len(traced)
  b = second.eap()
  assert len(traced) == count  # no new trace: the data are the program's arguments
  assert not np.allclose(a, b)
  np.testing.assert_allclose(second.exact(), [second.value([e]) - second.value() for e in second.graph.edges],
                             atol=1e-5)
