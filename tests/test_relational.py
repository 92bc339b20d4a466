"""Attention masks from configs, blocked (mask-sparse) attention, relational attention and the graph task,
each against an independent NumPy transcription."""


import jax
import jax.numpy as jnp
import numpy as np
import paper_reference as ref
import pytest
import scipy.sparse.csgraph
from helpers import f64, randomize, shapes_of, tiny_config

import symjax.configs as configs
from symjax import tasks
from symjax.model import ModelConfig, Transformer, masks, relational
from symjax.model import attention as attn
from symjax.model import intermediates as names
from symjax.ops import attention as attention_ops
from symjax.tasks import graph
from symjax.train import trainer as train

SMALL = ModelConfig.of(kind='standard', vocab_size=12, num_layers=2, num_heads=4, head_dim=8, ff_dim=32,
                    ff_dim_per_head=8, max_len=40, causal=False)


def np_mask(text, num_heads, t):
  """The mask expression evaluated by hand on index grids: an independent reading of the grammar."""
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  names = {'full': np.ones((t, t), bool), 'causal': j <= i}
  fns = {'window': lambda n: np.abs(i - j) < n, 'stride': lambda n: (i - j) % n == 0}
  parts = text.split(';')
  per = [eval(p.strip().replace('~', ' ~'), {'__builtins__': {}}, {**names, **fns}) for p in parts]  # noqa: S307
  return np.stack([per[h // (num_heads // len(parts))] for h in range(num_heads)])


@pytest.mark.parametrize('text', ['causal & window(3)', 'causal & (window(4) | stride(4))', '~causal | window(2)',
                                  'causal & window(2); causal & stride(3)', 'full; causal; window(2); stride(2)'])
def test_mask_expressions_mean_what_they_say(text):
  got = masks.head_mask_matrix(masks.parse_head_masks(text, 4), 11, 11)
  np.testing.assert_array_equal(np.broadcast_to(got, (4, 11, 11)), np_mask(text, 4, 11))


@pytest.mark.parametrize('text,message', [
    ('causal & foo', "unknown mask 'foo'"), ('window(0)', 'takes one integer >= 1'),
    ('window(2.5)', 'takes one integer >= 1'), ('__import__("os")', 'unknown mask function'),
    ('causal +', 'not an expression'), ('causal; ; full', 'empty mask'),
    ('causal; full; causal', 'must divide model.num_heads = 4')])
def test_bad_mask_is_a_clear_error(text, message):
  with pytest.raises(ValueError, match=message) as e:
    SMALL.replace(causal=True, mask=text).validate()
  assert 'model.mask' in str(e.value)


def test_a_causal_task_refuses_a_mask_that_reads_the_future():
  with pytest.raises(ValueError, match="add 'causal &'"):
    SMALL.replace(causal=True, mask='window(4)').validate()
  with pytest.raises(ValueError, match="add 'causal &'"):   # reads ahead only 80 positions on: checked to max_len
    SMALL.replace(causal=True, max_len=100, mask='causal | stride(80)').validate()
  with pytest.raises(ValueError, match='both set'):
    SMALL.replace(causal=True, mask='causal', window=3).validate()
  SMALL.replace(causal=True, mask='causal & window(4); causal & stride(4)').validate()


@pytest.mark.slow
def test_blocked_attention_equals_dense_and_scores_only_needed_blocks():
  """Output, weights and gradients of the blocked path equal the dense path's (with ALiBi, padding keys
  and per-head masks), and a local mask scores a fraction of the blocks."""
  rng = np.random.default_rng(0)
  b, t, h, d = 2, 37, 4, 8
  q, k, v = (jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32) for _ in range(3))
  key_mask = jnp.asarray(rng.random((b, t)) > 0.2)
  slopes = jnp.asarray(ref.alibi_slopes(h), jnp.float32)
  for text, fraction in [('causal & window(5)', 0.4), ('window(3); stride(7)', 1.0)]:
    static = masks.head_mask_matrix(masks.parse_head_masks(text, h), t, t)
    plan = attention_ops.block_plan(static, 8)
    assert plan.scored_fraction == pytest.approx(fraction)
    bias = -slopes[:, None, None] * np.abs(np.arange(t)[:, None] - np.arange(t)[None]).astype(np.float32)

    def dense(q, k, v):
      return attention_ops.dot_product_attention(q, k, v, bias, jnp.asarray(static)[None] & key_mask[:, None, None])

    def blocked(q, k, v):
      out, w = attention_ops.blocked_attention(q, k, v, slopes, plan, key_mask)
      return out, attention_ops.scatter_weights(w, plan, t)

    (out_d, w_d), (out_b, w_b) = dense(q, k, v), blocked(q, k, v)
    assert ref.rel_err(out_b, out_d) < 1e-5 and ref.rel_err(w_b, w_d) < 1e-5
    loss = lambda f: lambda *a: (f(*a)[0] ** 2).sum()
    for g_b, g_d in zip(jax.grad(loss(blocked), (0, 1, 2))(q, k, v), jax.grad(loss(dense), (0, 1, 2))(q, k, v)):
      assert ref.rel_err(g_b, g_d) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['standard', 'token_factored', 'symbolic'])
def test_models_with_blocked_attention_equal_dense_ones(kind):
  cfg = SMALL.replace(kind=kind, causal=True, mask='causal & window(3); causal & stride(5)')
  tokens = jax.random.randint(jax.random.key(1), (2, 37), 0, cfg.vocab_size)
  variables = randomize(shapes_of(Transformer(cfg), tokens), 1, scale=0.3)
  dense, blocked = Transformer(cfg), Transformer(cfg.replace(attention_block=8))
  run = lambda model: jax.jit(lambda v, t: model.apply(v, t, mutable=['intermediates']))  # masks are static
  out_d, inter_d = run(dense)(variables, tokens)
  out_b, inter_b = run(blocked)(variables, tokens)
  assert ref.rel_err(out_b, out_d) < 1e-5
  for l in range(cfg.num_layers):
    w_d, w_b = (names.flat(x['intermediates'])[f'blocks.{l}.attn.pattern'] for x in (inter_d, inter_b))
    assert ref.rel_err(w_b, w_d) < 1e-5


def np_relational(x, e, allowed, p, num_heads):
  """Relational attention pair by pair: q_ij = x_i Wq + e_ij Wqe, k_ij = x_j Wk + e_ij Wke,
  v_ij = x_j Wv + e_ij Wve; node i reads Σ_j softmax_j(q_ij·k_ij / √d) v_ij over allowed j; then Wo."""
  b, n, dm = x.shape
  hd = dm // num_heads
  w = {name: f64(p[name]['kernel']).reshape(dm, dm) for name in
       ('query', 'key', 'value', 'edge_query', 'edge_key', 'edge_value')}
  out = np.zeros((b, n, dm))
  for bb in range(b):
    for i in range(n):
      for hh in range(num_heads):
        cols = slice(hh * hd, (hh + 1) * hd)
        js = [j for j in range(n) if allowed[bb, i, j]]
        q = [x[bb, i] @ w['query'][:, cols] + e[bb, i, j] @ w['edge_query'][:, cols] for j in js]
        k = [x[bb, j] @ w['key'][:, cols] + e[bb, i, j] @ w['edge_key'][:, cols] for j in js]
        v = [x[bb, j] @ w['value'][:, cols] + e[bb, i, j] @ w['edge_value'][:, cols] for j in js]
        a = ref.softmax(np.array([qq @ kk for qq, kk in zip(q, k)]) / np.sqrt(hd))
        out[bb, i, cols] = sum(aa * vv for aa, vv in zip(a, v))
  return out @ f64(p['out']['kernel']).reshape(dm, dm)


def random_graph_batch(rng, b, n, vocab):
  adjacency = rng.random((b, n, n)) < 0.3
  edges = np.where(adjacency, rng.integers(1, vocab, (b, n, n)), -1)
  edges[:, np.arange(n), np.arange(n)] = 1
  return jnp.asarray(edges, jnp.int32)


@pytest.mark.slow
def test_relational_attention_matches_the_pairwise_transcription():
  rng = np.random.default_rng(3)
  b, n, d, vocab = 2, 6, SMALL.d_model, 5
  x = jnp.asarray(rng.normal(size=(b, n, d)), jnp.float32)
  table = jnp.asarray(rng.normal(size=(vocab, d)), jnp.float32)
  ids = random_graph_batch(rng, b, n, vocab)
  allowed = np.asarray(ids) >= 0
  e = np.where(allowed[..., None], f64(table)[np.maximum(np.asarray(ids), 0)], 0.0)   # e_ij, pair by pair
  module = attn.Attention(SMALL.num_heads, SMALL.head_dim, mask=masks.full, output_projection=True)
  edges = relational.Edges(ids, table)
  params = randomize(shapes_of(module, x, edges=edges), 2, scale=0.3)['params']
  out = module.apply({'params': params}, x, edges=edges)
  assert ref.rel_err(out, np_relational(f64(x), e, allowed, params, SMALL.num_heads)) < 1e-5
  # Without edges the same module is ordinary attention: the edge terms change the output.
  plain = attn.Attention(SMALL.num_heads, SMALL.head_dim, mask=masks.full, output_projection=True, alibi=False)
  assert ref.rel_err(plain.apply({'params': params}, x), out) > 1e-2


@pytest.mark.slow
def test_symbolic_relational_values_stay_convex_token_mixtures():
  """Every attention update of X_t is Σ_j a_ij ½(α_j E + α_ij E): rebuilt from the sown weights and the
  two sown mixtures (node values, then one per edge token), X_t stays a sum of convex mixtures of token
  rows."""
  cfg = SMALL.replace(kind='symbolic', relational=True)
  rng = np.random.default_rng(4)
  b, n = 2, 7
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, n)), jnp.int32)
  edges = random_graph_batch(rng, b, n, cfg.vocab_size)
  model = Transformer(cfg)
  variables = randomize(shapes_of(model, tokens, edges=edges), 1, scale=0.5)
  _, state = model.apply(variables, tokens, edges=edges, mutable=['intermediates'])
  inter = names.flat(state['intermediates'])
  table = f64(variables['params']['embed']['embedding'])
  hd, nh = cfg.head_dim, cfg.num_heads
  w_t = np.repeat(np.eye(cfg.vocab_size)[np.asarray(tokens)][:, :, None, :], nh, axis=2)
  for l in range(cfg.num_layers):
    a = f64(inter[f'blocks.{l}.attn.pattern'])                                 # [b, h, i, j]
    # The projection is met twice, for the nodes and for the edge tokens: the sown tuple holds both.
    sown = state['intermediates'][f'layer_{l}']['value_projection'][f'{names.SOWN_PREFIX}blocks.{l}.attn.v_mixture']
    alpha_node, alpha_tokens = (f64(m) for m in sown)
    alpha_edge = alpha_tokens[np.maximum(np.asarray(edges), 0)]              # [b, i, j, h, v]; a_ij = 0 off edges
    w_t = w_t + 0.5 * (np.einsum('bhij,bjhv->bihv', a, alpha_node) + np.einsum('bhij,bijhv->bihv', a, alpha_edge))
    assert (w_t >= 0).all()
    np.testing.assert_allclose(w_t.sum(-1), l + 2, rtol=1e-5)
    rebuilt = np.concatenate([w_t[:, :, h] @ table[:, h * hd:(h + 1) * hd] for h in range(nh)], axis=-1)
    assert ref.rel_err(inter[f'blocks.{l}.x_t'], rebuilt) <= 1e-5
  # Nodes attend only along edges.
  assert (np.asarray(inter['blocks.0.attn.pattern'])[np.broadcast_to(
      (np.asarray(edges) < 0)[:, None], (b, nh, n, n))] == 0).all()


@pytest.mark.parametrize('kind', ['standard', 'token_factored', 'symbolic'])
def test_relational_models_read_the_graph(kind):
  cfg = SMALL.replace(kind=kind, relational=True)
  rng = np.random.default_rng(5)
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 7)), jnp.int32)
  edges = random_graph_batch(rng, 2, 7, cfg.vocab_size)
  model = Transformer(cfg)
  variables = randomize(shapes_of(model, tokens, edges=edges), 1, scale=0.3)
  other = edges.at[:, 0, 1:].set(-1)
  assert ref.rel_err(model.apply(variables, tokens, edges=other), model.apply(variables, tokens, edges=edges)) > 1e-3
  with pytest.raises(ValueError, match='model.relational needs edges of shape'):
    model.apply(variables, tokens)


def test_graph_task_distances_are_shortest_paths():
  task = graph.GraphDistanceTask(num_graphs=300)
  batch = next(task.eval_batches('test', 64, 0))
  d0, far = task.vocab.id('d0'), task.vocab.id('far')
  real = batch['weights'].sum(1) > 0
  assert real.sum() == task.split_size('test') == 30
  for inputs, targets, edges in zip(batch['inputs'][real], batch['targets'][real], batch['edges'][real]):
    adjacency = (edges == task.vocab.id('edge')).astype(float)
    assert (adjacency == adjacency.T).all() and (np.diag(edges) == task.vocab.id('self')).all()
    source = int(np.flatnonzero(inputs == task.vocab.id('src'))[0])
    hops = scipy.sparse.csgraph.shortest_path(adjacency, unweighted=True, indices=source)
    expected = np.where(np.isfinite(hops) & (hops < 4), d0 + np.nan_to_num(hops, posinf=0), far)
    np.testing.assert_array_equal(targets, expected)
  # The last evaluation batch is padded with graphs that have no edges and no scored node.
  *_, last = task.eval_batches('test', 64, 0)
  pad_rows = last['weights'].sum(1) == 0
  assert pad_rows.any() and (last['edges'][pad_rows] == graph.NO_EDGE).all()
  # Every class occurs, and the nearest ones are not all.
  counts = np.bincount(task.data.targets['train'].ravel() - d0, minlength=5)
  assert (counts > 0).all() and counts.max() < 0.6 * counts.sum()


def test_relational_config_needs_a_graph_task(tmp_path):
  config = tiny_config()
  config.model.relational = True
  with pytest.raises(ValueError, match="needs a graph task"):
    train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run' / 'checkpoints').exists()


@pytest.mark.slow
def test_graph_config_trains_with_and_without_edges(tmp_path):
  for edges in ('true', 'false'):
    config = configs.from_file(f'configs/graph.py:model=symbolic,relational={edges},runlocal=true')
    final = train.train_and_evaluate(config, str(tmp_path / edges))
    assert np.isfinite(final['test']['loss'])
  assert tasks.get_task(config).has_edges


@pytest.mark.slow
def test_a_config_mask_trains_through_the_trainer(tmp_path):
  config = tiny_config()
  config.model.mask = 'causal & window(4)'
  config.model.attention_block = 4
  final = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert np.isfinite(final['test']['loss'])
  config.model.mask = 'window(4)'   # reads the future on a causal task: refused before anything is written
  with pytest.raises(ValueError, match="add 'causal &'"):
    train.train_and_evaluate(config, str(tmp_path / 'refused'))
  assert not (tmp_path / 'refused' / 'checkpoints').exists()
