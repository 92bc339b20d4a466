"""The Transformer Program kind and its decompiled code: variable selection, predicates, pruning, exactness."""

import dataclasses
import itertools
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import predict_with_numpy_alone

from symjax.model import ModelConfig, build
from symjax.model import transformer_program as tp
from symjax.proj import program_code
from symjax.system.errors import InputError

TOKENS = ['<pad>', '<s>', 'a', 'b', 'c', '#1', '#2', '#3', '#4', '#5']
PAD, BOS = 0, 1
SYMBOLS = [2, 3, 4]


def config(**kw):
  base = dict(kind='program', vocab_size=len(TOKENS), num_layers=1, num_heads=2, numerical_heads=1, mlps=1,
              mlp_hidden=8, max_len=6, causal=False)
  return ModelConfig.of(**{**base, **kw})


def every_input(max_content: int, width: int):
  """Every ``<s>`` + content of 1..max_content symbols, right-padded to ``width``, and its lengths."""
  rows = [[BOS, *c] + [PAD] * (width - 1 - len(c)) for n in range(1, max_content + 1)
          for c in itertools.product(SYMBOLS, repeat=n)]
  x = np.array(rows)
  return x, (x != PAD).sum(1)


def init(cfg, seed=0):
  return build(cfg).init(jax.random.PRNGKey(seed), jnp.zeros((1, cfg.max_len), jnp.int32))['params']


def tags(cfg, params, x, lengths):
  mask = np.arange(x.shape[1])[None, :] < lengths[:, None]
  logits = build(cfg).apply({'params': params}, jnp.asarray(x), jnp.asarray(mask))
  return np.where(mask, np.asarray(logits).argmax(-1), 0)


def choose(n: int, which: int, strength: float = 5.0):
  return jnp.asarray(np.eye(n)[which] * strength)


def hand_built(cfg):
  """Head 0 reads the previous position's token; head 1 counts the keys holding the query's token (RASP's
  histogram); the MLP reads nothing the readout needs; the readout tags each position with head 1's count."""
  params = jax.tree.map(jnp.zeros_like, init(cfg))
  card = tp.cardinality(cfg)
  prev = np.full((card, card), -1.0)
  for q in range(card):
    prev[q, max(q - 1, 0) if q else card - 1] = 1.0
  params['attn_0_0'] = dict(select_query=choose(2, 1), select_key=choose(2, 1), select_value=choose(2, 0),
                            predicate=jnp.asarray(prev))
  params['attn_0_1'] = dict(select_query=choose(2, 0), select_key=choose(2, 0),
                            predicate=jnp.asarray(np.where(np.eye(card) > 0, 1.0, -1.0)))
  params['mlp_0_0'] = {**params['mlp_0_0'], 'select_first': choose(4, 2), 'select_second': choose(4, 3)}
  readout = np.zeros((cfg.vocab_size, 5 * card + 1))   # tokens, positions, attn_0_0, attn_0_1, mlp_0_0
  count_rows = slice(3 * card, 4 * card)           # the variable attn_0_1 (tokens, positions, attn_0_0, attn_0_1)
  for n in range(1, 6):
    readout[TOKENS.index(f'#{n}'), count_rows.start + n] = 1.0
  params['readout'] = jnp.asarray(readout)
  return params


def test_variable_selection_reads_the_chosen_variables():
  cfg = config()
  params = hand_built(cfg)
  x, lengths = every_input(5, cfg.max_len)
  _, state = build(cfg).apply({'params': params}, jnp.asarray(x), jnp.asarray(x != PAD),
                              mutable=['intermediates'])
  pattern = np.asarray(state['intermediates']['attn_0_0']['pattern'][0])
  # A real position i > 0 reads i - 1; position 0 matches nothing and reads position 0.
  read = pattern.argmax(-1)
  real = np.arange(cfg.max_len)[None, :] < lengths[:, None]
  assert (read[real] == np.maximum(np.arange(cfg.max_len) - 1, 0)[None].repeat(len(x), 0)[real]).all()
  assert set(np.unique(pattern)) == {0.0, 1.0}
  got = tags(cfg, params, x, lengths)
  for row, n, tag in zip(x, lengths, got):
    content = list(row[1:n])
    want = [TOKENS.index(f'#{content.count(t)}') for t in content]
    assert list(tag[1:n]) == want


def test_decompiled_hand_built_program_is_known_code_and_pruned():
  cfg = config()
  params = hand_built(cfg)
  x, lengths = every_input(5, cfg.max_len)
  program = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True)
  text = program.source
  assert 'return k_token == q_token' in text                  # head 1's predicate, as a comparison
  # Head 1 counts the keys holding the query's token: its name says so, and its comment names the head.
  assert program.names['attn_0_1'] == 'count_same_token'
  assert 'count_same_token = aggregate_sum(select(tokens, tokens, predicate_count_same_token))' in text
  assert '    # `count_same_token` (attn_0_1) counts the keys where `k_token == q_token`.' in text
  # Nothing the readout keeps reads head 0 or the MLP: both are dropped, and so are their classifier rows.
  assert '(attn_0_0)' not in text and '(mlp_0_0)' not in text and 'mlp_0_0 =' not in text
  # The classifier reads the count alone, whose reachable values are 1..5, each naming its tag: in the code,
  # the count as the tag (one leaf), and no data file.
  assert "DECIDES = ('count_same_token',)" in text
  assert "    return f'#{count_same_token}'\n" in text
  assert program.tables == {} and program.entries == 1
  loaded = program_code._load(text, program.tables, 'program.npz')
  assert [loaded.decide(n) for n in range(1, 6)] == ['#1', '#2', '#3', '#4', '#5']
  assert (loaded.predict_ids(x, lengths) == tags(cfg, params, x, lengths)).all()


def _tested(node, out=None):
  """(column, value) of every value a decision tree's tests write."""
  out = set() if out is None else out
  if isinstance(node, program_code.Split):
    for values, child in node.branches:
      out |= {(node.column, v) for v in values}
      _tested(child, out)
    _tested(node.default, out)
  return out


def test_the_inline_classifier_decides_exactly_the_reachable_values_and_a_large_one_stays_a_file():
  """The decisions are the tags of the combinations of the kept variables' values that the inputs reach —
  found by running the program on them — and no other; above DECISION_LIMIT combinations, and on inputs that
  are not the task's every input, the classifier stays the data file."""
  cfg = config()
  params = hand_built(cfg)
  x, lengths = every_input(5, cfg.max_len)
  program = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True)
  # Reachable counts by brute force: how often each position's token occurs in its sequence. Each names its
  # tag, so the decisions are one leaf that returns the tag the count names.
  reached = {list(row[:n]).count(t) for row, n in zip(x, lengths) for t in row[:n]}
  assert program.decisions.tree == program_code.Leaf(copy=0) and program.decisions.numbered == {
      'count_same_token': ('#', 0)}
  decide = program_code._load(program.source, program.tables, 'program.npz').decide
  assert {decide(count) for count in reached} == {f'#{count}' for count in reached}
  card = tp.cardinality(cfg)
  partial = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=False)
  assert set(partial.tables) == {'bias', 'tags', 'count_same_token', 'count_same_token.values'}
  assert 'def decide' not in partial.source and len(partial.tables['tags']) == cfg.vocab_size  # every tag kept
  # Tags from the token and the count together: 3 symbols (and <s>) × 5 counts reach more than 16 pairs.
  readout = np.asarray(params['readout']).copy()
  readout[:, 0:card] = np.random.default_rng(0).normal(size=(readout.shape[0], card))
  big = {**params, 'readout': jnp.asarray(readout)}
  old = program_code.DECISION_LIMIT
  try:
    program_code.DECISION_LIMIT = 4
    table = program_code.build(big, cfg, TOKENS, x, lengths, exhaustive=True)
  finally:
    program_code.DECISION_LIMIT = old
  assert 'tokens' in table.tables and 'def decide' not in table.source
  # The data file holds a row per value each variable can hold, over the tags some position of an input gets.
  want = tags(cfg, big, x, lengths)
  assert list(table.tables['tokens.values']) == [BOS, *SYMBOLS]
  assert list(table.tables['tags']) == sorted(set(want[x != PAD].tolist()))
  assert table.tables['tokens'].shape == (len(SYMBOLS) + 1, len(table.tables['tags']))
  assert table.entries == sum(v.size for v in table.tables.values()) < (2 * card + 1) * cfg.vocab_size
  assert (program_code._load(table.source, table.tables, 'program.npz').predict_ids(x, lengths) == want).all()
  inline = program_code.build(big, cfg, TOKENS, x, lengths, exhaustive=True)
  both = program_code._load(inline.source, inline.tables, 'program.npz')
  assert inline.tables == {} and inline.entries > 4 and both.DECIDES == ('tokens', 'count_same_token')
  # It tests only values that the reached (token, count) pairs hold, in fewer entries than listing each pair.
  pairs = {(t, list(row[:n]).count(t)) for row, n in zip(x, lengths) for t in row[:n]}
  assert _tested(inline.decisions.tree) <= {(c, pair[c]) for pair in pairs for c in (0, 1)}
  assert inline.entries < 3 * len(pairs)
  assert (both.predict_ids(x, lengths) == tags(cfg, big, x, lengths)).all()


def test_heads_exact_only_where_the_task_tags_lose_their_case_for_bos_and_merge():
  """Two heads count the keys holding the query's token; at the query '<s>' one counts 'a' instead, the other
  'b', and the classifier sums both counts' rows (the first's weighing more: at '<s>' both decide). On a task
  that tags no '<s>' (``untagged``), what a head does at '<s>' reaches no tag: the two are one head,
  ``k_token == q_token`` without a case for '<s>', and the tag a lookup of its count. Where '<s>' is tagged,
  both stay."""
  cfg = config(numerical_heads=2)
  card = tp.cardinality(cfg)
  params = jax.tree.map(jnp.zeros_like, init(cfg))
  for name, counted in (('attn_0_0', 'a'), ('attn_0_1', 'b')):
    predicate = np.where(np.eye(card) > 0, 1.0, -1.0)
    predicate[BOS] = np.where(np.arange(card) == TOKENS.index(counted), 1.0, -1.0)
    params[name] = dict(select_query=choose(2, 0), select_key=choose(2, 0), predicate=jnp.asarray(predicate))
  readout = np.zeros((cfg.vocab_size, 5 * card + 1))   # tokens, positions, attn_0_0, attn_0_1, mlp_0_0
  for n in range(1, 6):
    readout[TOKENS.index(f'#{n}'), [2 * card + n, 3 * card + n]] = 2.0, 1.0
  params['readout'] = jnp.asarray(readout)
  x, lengths = every_input(5, cfg.max_len)
  want = tags(cfg, params, x, lengths)
  both = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True)
  assert '(attn_0_0)' in both.source and '(attn_0_1)' in both.source and "q_token == '<s>'" in both.source
  one = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True, untagged=(BOS,))
  assert one.source.count('= aggregate_sum(') == 1 and "'<s>'" not in one.source.split('def run(')[1]
  assert 'return k_token == q_token' in one.source and "UNTAGGED = ['<s>']" in one.source
  assert "    return f'#{count_same_token}'\n" in one.source
  assert one.left == {'constant': [], 'never': [], 'duplicate': []}
  got = program_code._load(one.source, one.tables, 'program.npz').predict_ids(x, lengths)
  assert (got[x != BOS] == want[x != BOS]).all() and (got[x == BOS] == 0).all()
  assert (want[x == BOS] != 0).any()  # the model tags '<s>'; the program does not
  # On inputs that are not the task's every input, what holds on every input: a head reading the token as its
  # query is exact on the tokens other than '<s>', and two equal there are one; the classifier stays a table.
  partial = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=False, untagged=(BOS,))
  assert partial.source.count('= aggregate_sum(') == 1 and 'count_same_token' in partial.tables
  got = program_code._load(partial.source, partial.tables, 'program.npz').predict_ids(x, lengths)
  assert (got[x != BOS] == want[x != BOS]).all()


@pytest.mark.parametrize('with_bos', ['every query', 'a and c'])
def test_a_count_that_takes_in_bos_counts_without_it_and_the_decisions_read_it_so(with_bos):
  """A head counts the keys holding the query's token and '<s>' too (for every query, or for 'a' and 'c'
  alone); the classifier takes the '<s>' off again (for 'a' and 'c' by preferring the lower of the two tags a
  count votes for). '<s>' is at position 0 of every input and nowhere else, so the program counts without it,
  ``k_token == q_token``, and its decisions read that count: the tag is the count, with no case per token."""
  cfg = config()
  card = tp.cardinality(cfg)
  params = hand_built(cfg)
  predicate = np.where(np.eye(card) > 0, 1.0, -1.0)
  with_it = SYMBOLS if with_bos == 'every query' else [TOKENS.index('a'), TOKENS.index('c')]
  predicate[with_it, BOS] = 1.0
  params['attn_0_1'] = {**params['attn_0_1'], 'predicate': jnp.asarray(predicate)}
  readout = np.zeros((cfg.vocab_size, 5 * card + 1))   # tokens, positions, attn_0_0, attn_0_1, mlp_0_0
  for n in range(1, 7):
    for m in (n - 1, n):
      if 1 <= m <= 5:
        readout[TOKENS.index(f'#{m}'), 3 * card + n] = 10.0
  for t in SYMBOLS:   # the lower of the two tags where the count took '<s>' in, else the higher
    for m in range(1, 6):
      readout[TOKENS.index(f'#{m}'), t] = 0.01 * m * (-1 if t in with_it else 1)
  params['readout'] = jnp.asarray(readout)
  x, lengths = every_input(5, cfg.max_len)
  want = tags(cfg, params, x, lengths)
  content = x != BOS
  assert (want[content & (x != PAD)] == [TOKENS.index(f'#{list(r[:n]).count(t)}') for r, n in zip(x, lengths)
                                        for t in r[1:n]]).all()   # the model tags the histogram
  program = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True, untagged=(BOS,))
  assert "'<s>'" not in program.source.split('def run(')[1].split('def decide(')[0]
  assert 'return k_token == q_token' in program.source and program.decisions.reads == ['count_same_token']
  assert "    return f'#{count_same_token}'\n" in program.source
  assert any("leaves out the key '<s>' holds" in note for note in program.notes)
  got = program_code._load(program.source, program.tables, 'program.npz').predict_ids(x, lengths)
  assert (got[content] == want[content]).all()


def sorting(cfg, with_bos: bool = False):
  """Sort by counting: head 0 counts the keys holding 'a', head 1 those holding 'a' or 'b' (whatever the query);
  the readout scores tag t by the sum over the symbols s before it of (position − count of symbols ≤ s − ½), so
  a position takes the first symbol whose count reaches it: the readout is linear in the position and the counts,
  a row per value that a table holds and a tree would test value by value. ``with_bos``: head 0 counts '<s>' too
  where the query holds 'b', and the readout takes that one off again by the query's token."""
  params = hand_built(cfg)
  card = tp.cardinality(cfg)
  a, b, c = SYMBOLS
  for head, held in (('attn_0_0', [a]), ('attn_0_1', [a, b])):
    predicate = -np.ones((card, card))
    predicate[:, held] = 1.0
    if with_bos and head == 'attn_0_0':
      predicate[b, BOS] = 1.0
    params[head] = dict(select_query=choose(2, 0), select_key=choose(2, 0), predicate=jnp.asarray(predicate))
  readout = np.zeros((cfg.vocab_size, 5 * card + 1))   # tokens, positions, attn_0_0, attn_0_1, mlp_0_0
  if with_bos:   # tags b and c weigh head 0's count by −1: one more at the query 'b' is made up by its token
    readout[b, b] = readout[c, b] = 1.0
  values = np.arange(card)
  readout[b, card:2 * card], readout[c, card:2 * card] = values, 2 * values
  readout[b, 2 * card:3 * card], readout[c, 2 * card:3 * card] = -values, -values
  readout[c, 3 * card:4 * card] = -values
  readout[:, -1] = -100.0   # no other token is a tag
  readout[a, -1], readout[b, -1], readout[c, -1] = 0.0, -0.5, -1.0
  params['readout'] = jnp.asarray(readout)
  return params


@pytest.mark.parametrize('with_bos', [False, True])
def test_a_classifier_linear_in_counts_is_scores_in_the_code(monkeypatch, with_bos):
  """Sorting's classifier compares the position with two counts: in the code it is a score per tag, a whole
  multiple of the position and of each count, exact on every input; no data file, no value tested one by one.
  A count that takes '<s>' in for some queries counts without it, and the scores read no token for it."""
  cfg = config(numerical_heads=2)
  params = sorting(cfg, with_bos)
  x, lengths = every_input(5, cfg.max_len)
  want = tags(cfg, params, x, lengths)
  content = (x != BOS) & (x != PAD)
  assert (want[content] == np.concatenate([sorted(r[1:n]) for r, n in zip(x, lengths)])).all()  # it sorts
  # A limit that no tree over these combinations meets and three scores of position and two counts do (with a
  # row for the token 'b' too, before the count leaves '<s>' out).
  limit = 15 if with_bos else 12
  monkeypatch.setattr(program_code, 'DECISION_LIMIT', limit)
  program = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True, untagged=(BOS,))
  scores = program.decisions.tree
  assert isinstance(scores, program_code.Scores) and program.tables == {} and program.entries <= 12
  assert set(program.decisions.reads) == {'positions', program.names['attn_0_0'], program.names['attn_0_1']}
  assert 'return max(scores, key=scores.get)' in program.source and 'DATA_FILE' not in program.source
  assert "'<s>'" not in program.source.split('def run(')[1] and 'tokens_score' not in program.source
  assert any("out the key '<s>' holds" in note for note in program.notes) == with_bos
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  got = loaded.predict_ids(x, lengths)
  assert (got[content] == want[content]).all()
  # Over the same combinations (the program's run, with the mask predict_ids set), a tree that tests values
  # needs more than the limit.
  values = loaded.run(loaded.Variable(x.astype(np.int32), True),
                      loaded.Variable(np.broadcast_to(np.arange(x.shape[1], dtype=np.int32), x.shape), False))
  held = np.stack([values[n].ids[content] for n in program.decisions.reads], -1).astype(np.int64)
  first = program_code._distinct_rows(held)[0]
  monkeypatch.setattr(program_code, 'DECISION_LIMIT', 10_000)
  tree = program_code.decision_tree(held[first], want[content][first], [False] * held.shape[1])
  assert program_code.entries_of(tree) > limit


def test_scores_moved_by_a_count_one_less_give_the_same_tags():
  """A count one less where it shifts: its weight moves into the bias (every query) or into the scores of the
  query's values that shift (a token the scores read by value), and every combination keeps its tag; a count
  the scores read by value, or a shift by a query they do not read, moves nothing."""
  scores = program_code.Scores(tags=(2, 3), bias=(0, 1), weights=((1, (2, -3)),), by_value=((0, ((2, (1, 0)),)),))
  decisions = program_code.Decisions(['tokens', 'count'], scores)
  rng = np.random.default_rng(0)
  held = np.column_stack([rng.integers(2, 5, 200), rng.integers(1, 9, 200)])

  def tags_of(d, held):
    s = d.tree
    total = np.array(s.bias)[None] + sum(held[:, [c]] * np.array(w)[None] for c, w in s.weights)
    for c, rows in s.by_value:
      table = dict(rows)
      total = total + np.array([table.get(int(v), (0, 0)) for v in held[:, c]])
    return total.argmax(-1)

  want = tags_of(decisions, held)
  for shift in (np.array([0, 0, 1, 1, 1]), np.array([0, 0, 0, 1, 1])):   # by token id; ids 2 to 4 reached
    moved = program_code._shifted(decisions, 'count', 'tokens', np.array([2, 3, 4]), shift)
    less = held.copy()
    less[:, 1] -= shift[held[:, 0]]
    assert (tags_of(moved, less) == want).all()
  assert program_code._shifted(decisions, 'count', 'tokens', np.array([2, 3, 4]), np.ones(5)).tree.bias == (2, -2)
  assert program_code._shifted(decisions, 'count', 'positions', np.array([2, 3]), np.array([0, 0, 1, 0])) is None
  by_value = program_code.Decisions(['tokens', 'count'], dataclasses.replace(scores, weights=()))
  assert program_code._shifted(by_value, 'count', 'tokens', np.array([2, 3, 4]), np.ones(5)) is None


def test_a_token_every_input_holds_once_is_found_anywhere_unless_causal():
  """``<s>`` at position 0 and an end token once at the end: a count of keys holding either is one at every
  query that reads every key; under a causal mask only position 0's token is."""
  end = 9
  x = np.array([[BOS, 2, 3, end, PAD], [BOS, 2, end, PAD, PAD], [BOS, 4, 4, 4, end]])
  lengths = (x != PAD).sum(1)
  found = lambda causal: program_code._held_once(types.SimpleNamespace(causal=causal), x, lengths)
  assert found(False) == [BOS, end] and found(True) == [BOS]
  twice = x.copy()
  twice[2, 2] = end
  assert program_code._held_once(types.SimpleNamespace(causal=False), twice, lengths) == [BOS]


def test_a_classifier_that_reads_nothing_is_one_tag_in_the_code():
  """No variable changes a tag (the readout is its bias alone): every tagged position gets that tag, from a
  ``decide`` that reads nothing."""
  cfg = config()
  params = hand_built(cfg)
  readout = np.zeros((cfg.vocab_size, 5 * tp.cardinality(cfg) + 1))
  readout[TOKENS.index('#3'), -1] = 1.0
  params['readout'] = jnp.asarray(readout)
  x, lengths = every_input(3, cfg.max_len)
  program = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True, untagged=(BOS,))
  assert program.decisions.reads == [] and program.tables == {} and "DECIDES = ()" in program.source
  got = program_code._load(program.source, program.tables, 'program.npz').predict_ids(x, lengths)
  real = np.arange(x.shape[1])[None] < lengths[:, None]
  assert (got[real & (x != BOS)] == TOKENS.index('#3')).all() and (got[~real | (x == BOS)] == 0).all()


def test_a_program_refuses_a_wrong_shape_a_too_long_input_and_wrong_lengths_in_one_line():
  cfg = config()
  x, lengths = every_input(1, cfg.max_len)
  program = program_code.build(hand_built(cfg), cfg, TOKENS, x, lengths, exhaustive=True, untagged=(BOS,))
  module = program_code._load(program.source, program.tables, 'program.npz')
  shape = r'ids must be one sequence \[n\] or a batch \[b, n\] of n <= 6, got shape '
  with pytest.raises(ValueError, match=shape + r'\(1, 1, 3\)$'):
    module.predict_ids(np.ones((1, 1, 3), int))
  with pytest.raises(ValueError, match=shape + r'\(7,\)$'):
    module.predict_ids(np.ones(7, int))
  with pytest.raises(ValueError, match=r'lengths must be one count in 0\.\.6 per sequence \(2\), got \[3 7\]$'):
    module.predict_ids(x[:2], [3, 7])
  assert module.predict_ids(np.zeros((0, 6), int)).shape == (0, 6)


def test_untagged_free_follows_reads_at_the_position_alone():
  """A module is free where everything reading it reads it at its own position (a query, an MLP, the
  classifier) and is free too; a key or a copied value is read at other positions."""
  M = program_code.Module
  truth = np.ones((4, 4), bool)
  plan = program_code.Plan(
      [M('a', 'numerical', ('tokens', 'tokens'), truth), M('b', 'categorical', ('tokens', 'a', 'tokens'),
                                                               np.arange(4)),
       M('c', 'numerical', ('b', 'tokens'), truth), M('d', 'mlp', ('c', 'c'), np.zeros((4, 4), int)),
       M('e', 'categorical', ('d', 'd', 'd'), np.arange(4)), M('f', 'mlp', ('e', 'tokens'), np.zeros((4, 4), int))],
      {}, [], 4, False, 4)
  # a is b's key, d is e's key: neither is free, nor c, read by d, nor b, read by c. e and f are.
  assert program_code.untagged_free(plan) == {'e', 'f'}
  plan.modules[4].reads = ('d', 'tokens', 'tokens')   # e reads d as its query alone: all but a are free
  assert program_code.untagged_free(plan) == {'b', 'c', 'd', 'e', 'f'}


def test_decision_tree_copies_a_token_shares_equal_branches_and_is_exact(monkeypatch):
  """The classifier's tree: a branch whose tag is a token column's own value is one leaf that copies it, values
  with equal subtrees share a branch, the branch of most values is the unwritten default, and on random tables
  every reached combination gets its tag."""
  Leaf, Split = program_code.Leaf, program_code.Split
  keys = np.array([(t, c) for t in range(5) for c in range(4) if (t, c) != (4, 3)])  # (token, count); one unreached
  tags = np.where(keys[:, 1] >= 2, keys[:, 0], np.where(keys[:, 1] == 0, 9, 8))
  tree = program_code.decision_tree(keys, tags, [True, False])
  assert tree == Split(1, (((0,), Leaf(tag=9)), ((1,), Leaf(tag=8))), Leaf(copy=0))
  assert program_code.entries_of(tree) == 2 * 2 + 1

  def tag_of(node, row):
    while isinstance(node, Split):
      node = next((child for values, child in node.branches if row[node.column] in values), node.default)
    return row[node.copy] if node.copy is not None else node.tag

  rng = np.random.default_rng(0)
  for _ in range(5):
    keys = np.unique(rng.integers(0, 4, size=(40, 3)), axis=0)
    tags = (keys[:, 0] * (keys[:, 1] > 1) + rng.integers(0, 2, len(keys)) * (keys[:, 2] == 3)) % 4
    tree = program_code.decision_tree(keys, tags, [True, False, True])
    assert [tag_of(tree, row) for row in keys] == list(tags)
    assert program_code.entries_of(tree) <= 2 * len(keys)
  # A search past its limit gives up (the classifier then stays a data file).
  monkeypatch.setattr(program_code, 'SEARCH_LIMIT', 3)
  assert program_code.decision_tree(keys, tags, [True, False, True]) is None


def test_copied_decisions_test_a_position_and_copy_the_head_or_count_that_holds_the_tag(monkeypatch):
  """Two heads each copy the right token on some positions, and at one position the tag is a count's number:
  the decisions test the position and return the head, or the count's tag (``f'#{count + 1}'``), that holds the
  tag, exactly on every row; a constant tag is one leaf; and tags that no two tested variables and no copy
  decide give none."""
  Leaf, Split, M = program_code.Leaf, program_code.Split, program_code.Module
  rng = np.random.default_rng(0)
  n = 400
  position, a, count, b = (rng.integers(0, 8, n), rng.choice(SYMBOLS, n), rng.integers(0, 5, n),
                           rng.choice(SYMBOLS, n))
  held = np.stack([position, a, count, b], -1)
  hash_of = lambda k: TOKENS.index(f'#{k}')
  tags = np.select([position < 3, position == 6, position == 7], [a, [hash_of(c + 1) for c in count], BOS], b)
  doms = {'positions': (tuple(range(8)), False), 'tok_0_0': (tuple(SYMBOLS), True),
          'count_0_1': (tuple(range(5)), False), 'tok_1_0': (tuple(SYMBOLS), True)}
  names = list(doms)
  plan = program_code.Plan([M('count_0_1', 'numerical', ('tokens', 'tokens'), np.ones((10, 10), bool))], {},
                           TOKENS, 8, False, 10)
  found = program_code.copied_decisions(plan, names, held, tags, doms)
  assert found.reads == names and found.numbered == {'count_0_1': ('#', 1)}
  assert found.tree == Split(0, (((0, 1, 2), Leaf(copy=1)), ((6,), Leaf(copy=2)), ((7,), Leaf(tag=BOS))),
                             Leaf(copy=3))
  assert program_code.entries_of(found.tree) == 5 + 4

  def tag_of(node, row):
    while isinstance(node, Split):
      node = next((child for values, child in node.branches if row[node.column] in values), node.default)
    if node.copy is None:
      return node.tag
    return hash_of(row[node.copy] + 1) if found.reads[node.copy] == 'count_0_1' else row[node.copy]

  assert [tag_of(found.tree, row) for row in held] == list(tags)
  source = program_code._decisions_source(found, doms, TOKENS)
  assert "        return f'#{count_0_1 + 1}'" in source and source[-1] == (
      "    return '<s>' if positions == 7 else tok_1_0")
  # A tag that depends on what no token holds and no pair of tests decides: no decisions.
  noise = np.where(rng.random(n) < 0.5, a, b) + 10 * (position % 2)
  assert program_code.copied_decisions(plan, names, held, noise, doms) is None
  # Searched on a sample of the rows first, the same decisions, and none again where none tags every row: a
  # tree that fails on the sample fails on them all, and one that holds there is checked on them all.
  monkeypatch.setattr(program_code, 'COPY_SAMPLE', 40)
  assert program_code.copied_decisions(plan, names, held, tags, doms) == found
  assert program_code.copied_decisions(plan, names, held, noise, doms) is None


def _predicate(module, doms):
  """The written predicate of ``module`` as a Python function, and its text."""
  lines = program_code.predicate_source(module, doms, TOKENS)
  namespace = {}
  exec('\n'.join(line[4:] for line in lines), namespace)
  return namespace[f'predicate_{module.name}'], lines


def test_predicates_read_a_reflection_a_lookup_and_a_last_case_without_its_test():
  card = 10
  positions = tuple(range(8))
  doms = {'positions': (positions, False), 'tokens': ((1, 2, 3, 4), True)}
  # k == 7 - q: reverse's pattern; q = 7 names position 0 alone, which matching nothing also reads.
  reflect = program_code.Module('attn_0_0', 'categorical', ('positions', 'positions', 'tokens'),
                                np.array([7 - q if q < 8 else 0 for q in range(card)]))
  _, text = _predicate(reflect, doms)
  assert text[-1] == '        return k_position == 7 - q_position'
  # One key a query, no arithmetic: a lookup (filled over two lines here), exact over every pair of the domains.
  keys = [3, 5, 1, 6, 2, 7, 4, 1]
  lookup = program_code.Module('attn_0_1', 'categorical', ('positions', 'positions', 'tokens'),
                               np.array(keys + [0, 0]))
  function, text = _predicate(lookup, doms)
  assert len(text) == 3 and text[1].startswith('        return k_position == {0: 3,') and (
      text[2].endswith('}.get(q_position)'))
  assert all(function(q, k) == (keys[q] == k) for q in positions for k in positions)
  # Key sets per query covering every query value: the last case is the fall-through, with no `return False`.
  table = np.zeros((card, card), bool)
  for q in positions:
    table[q, [2, 3] if q < 3 else [1] if q < 6 else [1, 3, 4]] = True
  count = program_code.Module('attn_0_2', 'numerical', ('positions', 'tokens'), table)
  function, text = _predicate(count, doms)
  assert 'return False' not in '\n'.join(text) and text[-1].startswith('        return token')
  assert all(function(q, TOKENS[t]) == table[q, t] for q in positions for t in (1, 2, 3, 4))
  # One case, and nothing for the other query values: both tests on one line.
  table[:] = False
  table[2:5, 2] = True
  function, text = _predicate(count, doms)
  assert text[1:] == ["        return 2 <= position <= 4 and token == 'a'"]
  assert all(function(q, TOKENS[t]) == table[q, t] for q in positions for t in (1, 2, 3, 4))


def test_a_long_set_fills_its_lines_aligned_with_its_first_item():
  items = [f"'{TOKENS[i % 10]}{i}'" for i in range(40)]
  lines = program_code._wrapped_set('if token in ', items, ':', '        ')
  assert 1 < len(lines) < 8 and all(len(line) <= program_code.WIDTH for line in lines)
  column = len('        if token in {')
  assert all(line[:column].isspace() and not line[column].isspace() for line in lines[1:])
  assert eval(' '.join(line.strip() for line in lines)[len('if token in '):-1]) == set(eval(f"[{', '.join(items)}]"))


def test_decide_folds_its_last_test_into_a_return_and_an_inner_test_meeting_the_default():
  """``if t: return a`` then ``return b`` is ``return a if t else b``; a branch whose one inner test fails to
  the same default as its own is one ``if v and w``; a test is its shortest on the domain; on every
  combination the text decides as the tree."""
  Leaf, Split = program_code.Leaf, program_code.Split
  tok = ['<pad>', '<s>', 'a', 'b', '#1', '#2', '#3', '#4', '#5', '#6']
  # count 1..5: '#count'; count 6: '#5' at 'b', else '#6'; any other count: '#6'.
  tree = Split(1, (((6,), Split(0, (((3,), Leaf(tag=8)),), Leaf(tag=9))),
                   *(((c,), Leaf(tag=3 + c)) for c in range(1, 6))), Leaf(tag=9))
  doms = {'token': ((2, 3), True), 'count': (tuple(range(8)), False)}
  lines = program_code._decisions_source(program_code.Decisions(['token', 'count'], tree), doms, tok)
  assert lines[-3:] == ["    if count == 6 and token == 'b':", "        return '#5'",
                       "    return f'#{count}' if 1 <= count <= 5 else '#6'"]
  # The inner default differs from the outer one: the branch stays nested, and its last test folds.
  other = Split(1, (((6,), Split(0, (((3,), Leaf(tag=8)),), Leaf(tag=7))),), Leaf(tag=9))
  assert program_code._decisions_source(program_code.Decisions(['token', 'count'], other), doms, tok)[-3:] == [
      '    if count == 6:', "        return '#5' if token == 'b' else '#4'", "    return '#6'"]
  # A test takes its shortest form on the variable's domain: counts 5 to 7 of 0..7 are `count >= 5`.
  upper = Split(1, (((5, 6, 7), Leaf(tag=9)),), Leaf(tag=4))
  assert program_code._decisions_source(program_code.Decisions(['token', 'count'], upper), doms, tok)[-1] == (
      "    return '#6' if count >= 5 else '#1'")
  # A default that is itself a conditional stays after the test: one conditional a line.
  chained = Split(1, (((4, 6), Leaf(tag=4)),), Split(0, (((3,), Leaf(tag=4)),), Leaf(tag=5)))
  assert program_code._decisions_source(program_code.Decisions(['token', 'count'], chained), doms, tok)[-3:] == [
      '    if count in {4, 6}:', "        return '#1'", "    return '#1' if token == 'b' else '#2'"]
  for written, node in ((lines, tree), (program_code._decisions_source(
      program_code.Decisions(['token', 'count'], other), doms, tok), other)):
    decide = {}
    exec('\n'.join(written), decide)
    for t, c in itertools.product((2, 3), range(8)):
      leaf = node
      while isinstance(leaf, Split):
        row = (t, c)
        leaf = next((child for values, child in leaf.branches if row[leaf.column] in values), leaf.default)
      assert decide['decide'](tok[t], c) == tok[leaf.tag]


def test_a_number_whose_tags_are_its_value_give_or_take_one_is_written_as_a_formula():
  tok = ['<pad>', '#1', '#2', '#3', '#4', 'x', '#10']
  assert program_code._formula('n', [(2, 1), (3, 2), (4, 3)], tok) == "f'#{n - 1}'"
  assert program_code._formula('n', [(1, 1), (2, 2), (3, 3)], tok) == "f'#{n}'"
  assert program_code._formula('n', [(1, 1), (2, 2)], tok) is None              # two values: a lookup reads as well
  assert program_code._formula('n', [(1, 1), (2, 2), (3, 4)], tok) is None      # #4 for 3: no one constant
  assert program_code._formula('n', [(1, 1), (2, 2), (3, 5)], tok) is None      # 'x' has no number
  assert program_code._formula('n', [(1, 1), (2, 2), (10, 6)], tok) == "f'#{n}'"      # '#10' is 10
  assert program_code._formula('n', [(1, 1), (2, 2), (9, 6)], tok) is None


def test_positions_predicate_is_written_as_arithmetic():
  cfg = config()
  params = hand_built(cfg)
  readout = np.zeros_like(np.asarray(params['readout']))
  card = tp.cardinality(cfg)
  for t in range(card):                             # tag = the previous token (attn_0_0), so head 0 is kept
    readout[t, 2 * card + t] = 1.0
  params['readout'] = jnp.asarray(readout)
  x, lengths = every_input(4, cfg.max_len)
  program = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True)
  assert 'return k_position == q_position - 1' in program.source
  assert program.names['attn_0_0'] == 'prev_token' and 'prev_token = aggregate(prev_token_pattern, tokens)' in (
      program.source)
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths) == tags(cfg, params, x, lengths)).all()


def test_reverse_for_every_length_is_a_counting_head_and_a_head_that_reads_its_count():
  """Trained reverse programs copy from positions laid out per input length; "Learning Transformer Programs"
  (Appendix C.3) finds its training misses the program for every length too. The kind can express that
  program: a numerical head counts the keys at or after the query (n − i for n real tokens), and a categorical
  head reads the position one below that count (n − 1 − i) and copies its token. Set by hand, it reverses every
  input of the task, and its decompiled code keeps exactly those two heads, each one comparison."""
  from symjax.tasks import base, rasp
  v = rasp.vocab('reverse', 8)
  x = rasp.all_inputs('reverse', 8, 8, v)
  lengths = (x != v.id(base.PAD)).sum(1)
  cfg = config(vocab_size=len(v), num_layers=2, max_len=8)
  card = tp.cardinality(cfg)
  q, k = np.indices((card, card))
  params = jax.tree.map(jnp.zeros_like, init(cfg))
  params['attn_0_1'] = dict(select_query=choose(2, 1), select_key=choose(2, 1),              # positions, positions
                            predicate=jnp.asarray(np.where(k >= q, 1.0, -1.0)))
  params['attn_1_0'] = dict(select_query=choose(5, 3), select_key=choose(5, 1), select_value=choose(5, 0),
                            predicate=jnp.asarray(np.where(k == q - 1, 1.0, -1.0)))    # attn_0_1, positions, tokens
  readout = np.zeros((cfg.vocab_size, 8 * card + 1))       # 8 variables: attn_1_0 is the sixth
  readout[np.arange(len(v)), 5 * card + np.arange(len(v))] = 1.0
  params['readout'] = jnp.asarray(readout)
  source = rasp.reverse_source_positions(x, v)              # [input, tagged position, the position it reverses]
  tagged = source.any(-1)
  want = np.einsum('nqt,nt->nq', source.astype(int), x)
  got = tags(cfg, params, x, lengths)
  assert len(x) == 19530 and (got[tagged] == want[tagged]).all()
  program = program_code.build(params, cfg, v.tokens, x, lengths, exhaustive=True)
  assert 'return k_position >= q_position' in program.source
  # Counts 0 and 1 name position 0, the key a query without a match reads: the predicate is one comparison.
  assert program.names['attn_0_1'] == 'count_0_1' and program.names['attn_1_0'] == 'tok_1_0'
  assert 'return position == count_0_1 - 1' in program.source
  assert 'tok_1_0 = aggregate(select_closest(positions, count_0_1, predicate_tok_1_0), tokens)' in program.source
  run = program.source[program.source.index('def run('):]
  assert run.count(' = aggregate') == 2 and 'mlp_' not in run                # the unused modules: dropped
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths)[tagged] == want[tagged]).all()


def test_a_head_whose_predicate_never_holds_is_folded_into_the_bias():
  # Head 0 matches no key, so it reads position 0, '<s>', on every input, although the variable it copies
  # (tokens) takes several values. Its classifier row for '<s>' offsets the bias: it goes into the bias, and
  # the head and its code with it; the classifier's decisions read attn_0_1 alone.
  cfg = config()
  params = hand_built(cfg)
  params['attn_0_0'] = {**params['attn_0_0'], 'predicate': -jnp.ones_like(params['attn_0_0']['predicate'])}
  card = tp.cardinality(cfg)
  readout = np.asarray(params['readout']).copy()
  counts = [TOKENS.index(f'#{n}') for n in range(1, 6)]
  readout[counts, -1] = -1.0                       # the bias
  readout[counts, 2 * card + BOS] = 1.0            # attn_0_0 == '<s>'
  params['readout'] = jnp.asarray(readout)
  x, lengths = every_input(5, cfg.max_len)
  program = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True)
  assert 'first_token =' not in program.source and '(attn_0_0)' not in program.source
  assert program.tables == {} and "DECIDES = ('count_same_token',)" in program.source
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths) == tags(cfg, params, x, lengths)).all()


@pytest.mark.parametrize('seed,causal', [(0, False), (1, True), (2, False)])
def test_random_programs_decompile_exactly_on_every_short_input(seed, causal):
  cfg = config(num_layers=2, num_heads=3, numerical_heads=1, mlps=2, causal=causal)
  params = init(cfg, seed)
  x, lengths = every_input(5, cfg.max_len)
  program = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True)
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  want = tags(cfg, params, x, lengths)
  assert (loaded.predict_ids(x, lengths) == want).all()
  # Where the task tags no '<s>', the program is exact at every other position and tags '<s>' 0.
  untagged = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True, untagged=(BOS,))
  got = program_code._load(untagged.source, untagged.tables, 'program.npz').predict_ids(x, lengths)
  assert (got[x != BOS] == want[x != BOS]).all() and (got[x == BOS] == 0).all()
  # Every prefix length of a row padded to the full width.
  assert (loaded.predict_ids(x[:50], np.minimum(lengths[:50], 3)) == tags(cfg, params, x[:50],
                                                                          np.minimum(lengths[:50], 3))).all()


@pytest.mark.parametrize('seed', [0, 1])
def test_numerical_heads_kept_from_positions_never_read_them_and_decompile_exactly(seed):
  """model.numerical_positions = False: a numerical head selects its query and key among every variable but
  positions (one logit fewer), so a first-layer count is the same wherever its query and keys stand; the
  program the decompiler writes from those selections tags every input as the model does."""
  cfg = config(num_layers=2, num_heads=3, numerical_heads=2, mlps=1, numerical_positions=False)
  params = init(cfg, seed)
  for l in range(2):
    readable = tp.head_reads(cfg, l, numerical=True)
    assert 'positions' not in readable and len(readable) == len(tp.variable_names(cfg, l)) - 1
    assert params[f'attn_{l}_2']['select_query'].shape == (len(readable),)
    assert params[f'attn_{l}_0']['select_query'].shape == (len(readable) + 1,)     # categorical: positions too
  # A numerical head whose largest selection logit falls on the variable after tokens reads attn_0_0 in layer 1
  # (positions are skipped), and the program names it so.
  params['attn_1_1'] = {**params['attn_1_1'], 'select_query': choose(5, 1), 'select_key': choose(5, 0)}
  plan = program_code.plan_of(params, cfg)
  reads = {m.name: m.reads for m in plan.modules}
  assert reads['attn_1_1'] == ('attn_0_0', 'tokens')
  assert all('positions' not in reads[f'attn_{l}_{h}'] for l in range(2) for h in (1, 2))
  x, lengths = every_input(5, cfg.max_len)
  program = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True)
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths) == tags(cfg, params, x, lengths)).all()
  # Layer 0's counts read the tokens alone: reversing each input's content reverses them.
  flipped = x.copy()
  for r, n in enumerate(lengths):
    flipped[r, 1:n] = x[r, 1:n][::-1]
  mask, card = jnp.asarray(x != PAD), tp.cardinality(cfg)
  counts = lambda ids: np.asarray(build(cfg).apply({'params': params}, jnp.asarray(ids), mask, return_hidden=True)[0]
                                  )[..., 3 * card:5 * card].reshape(*x.shape, 2, card).argmax(-1)  # attn_0_1, _2
  a, b = counts(x), counts(flipped)
  assert all((b[r, 1:n] == a[r, 1:n][::-1]).all() and (b[r, 0] == a[r, 0]).all() for r, n in enumerate(lengths))
  assert len(np.unique(a)) > 2
  with pytest.raises(InputError, match=r'model.numerical_positions = False keeps numerical heads from reading '
                                       r'positions: it needs model.numerical_heads >= 1, got 0'):
    config(numerical_heads=0, numerical_positions=False)


def test_a_numerical_head_sums_a_lower_count_and_saturates_as_its_code_says():
  """model.numerical_values, on a hand-built program whose answer is known: head 0.1 counts the keys holding the
  query's token (c_j), head 1.1 sums those counts over every key (the sum of c_s² over the symbols s), which
  saturates at cardinality − 1; the readout tags each position with that sum."""
  cfg = config(num_layers=2, numerical_values=True, mlps=0)
  card = tp.cardinality(cfg)
  assert tp.numerical_names(cfg, 0) == ['ones'] and tp.numerical_names(cfg, 1) == ['ones', 'attn_0_1']
  params = jax.tree.map(jnp.zeros_like, init(cfg))
  params['attn_0_1'] = dict(select_query=choose(2, 0), select_key=choose(2, 0), select_value=choose(1, 0),
                            predicate=jnp.asarray(np.where(np.eye(card) > 0, 1.0, -1.0)))
  params['attn_1_1'] = dict(select_query=choose(4, 1), select_key=choose(4, 1), select_value=choose(2, 1),
                            predicate=jnp.ones((card, card)))
  params['attn_1_0'] = {**params['attn_1_0'], 'predicate': -jnp.ones((card, card))}
  readout = np.zeros((cfg.vocab_size, 6 * card + 1))   # tokens, positions, attn_0_0, attn_0_1, attn_1_0, attn_1_1
  readout[np.arange(card), 5 * card + np.arange(card)] = 1.0
  params['readout'] = jnp.asarray(readout)
  x, lengths = every_input(5, cfg.max_len)
  got = tags(cfg, params, x, lengths)
  want = np.zeros_like(x)
  for r, (row, n) in enumerate(zip(x, lengths)):
    counts = [list(row[:n]).count(t) for t in row[:n]]     # '<s>' is a key too
    want[r, :n] = min(sum(counts), card - 1)
  assert (got == want).all() and (want == card - 1).any() and (want < card - 1).any()
  program = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True)
  assert program.names['attn_0_1'] == 'count_same_token' and program.names['attn_1_1'] == 'count_1_1'
  assert 'count_1_1 = aggregate_sum(count_1_1_pattern, count_same_token)' in program.source
  # It sums ones: a count.
  assert 'count_same_token = aggregate_sum(select(tokens, tokens, predicate_count_same_token))' in program.source
  assert '`count_1_1` (attn_1_1) sums the `count_same_token` of every key' in ' '.join(program.notes)
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths) == want).all()


@pytest.mark.parametrize('seed,causal', [(3, False), (4, True)])
def test_random_programs_that_sum_numerical_variables_decompile_exactly(seed, causal):
  cfg = config(num_layers=3, num_heads=3, numerical_heads=2, mlps=1, causal=causal, numerical_values=True)
  params = init(cfg, seed)
  for name, which in (('attn_1_1', 1), ('attn_2_2', 4)):     # a lower numerical head, not ones
    params[name] = {**params[name], 'select_value': choose(len(params[name]['select_value']), which)}
  x, lengths = every_input(5, cfg.max_len)
  program = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True)
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths) == tags(cfg, params, x, lengths)).all()
  run = program_code.plan_of(params, cfg)
  reads = {m.name: m.reads for m in run.modules}
  assert reads['attn_1_1'][2] == 'attn_0_1' and reads['attn_2_2'][2] == 'attn_1_2'


def test_a_linear_readout_weighs_a_count_by_its_value_and_decompiles_exactly():
  """model.numerical_readout='linear', against a NumPy transcription of the classifier of "Learning Transformer
  Programs" (§3.4): a row per value of every categorical variable, plus each count times one column per tag."""
  cfg = config(num_layers=2, num_heads=2, numerical_heads=1, mlps=1, numerical_readout='linear')
  card, names = tp.cardinality(cfg), tp.variable_names(cfg)
  assert tp.is_numerical(cfg) == [name in ('attn_0_1', 'attn_1_1') for name in names]
  params = init(cfg, seed=5)
  weights = np.asarray(params['readout'])
  assert weights.shape == (cfg.vocab_size, (len(names) - 2) * card + 2 + 1)
  x, lengths = every_input(4, cfg.max_len)
  hidden, table = build(cfg).apply({'params': params}, jnp.asarray(x), jnp.asarray(x != PAD), return_hidden=True)
  hidden = np.asarray(hidden)
  want, at = weights[:, -1].copy(), 0
  for i, numerical in enumerate(tp.is_numerical(cfg)):
    one_hot = hidden[..., i * card:(i + 1) * card]
    if numerical:
      want = want + (one_hot @ np.arange(card))[..., None] * weights[:, at]
      at += 1
    else:
      want = want + one_hot @ weights[:, at:at + card].T
      at += card
  np.testing.assert_allclose(hidden @ np.asarray(table).T, want, rtol=1e-5, atol=1e-5)
  got = tags(cfg, params, x, lengths)
  assert (got == np.where(x != PAD, want.argmax(-1), 0)).all()
  program = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True)
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths) == got).all()


@pytest.mark.parametrize('seed', [0, 3])
def test_a_readout_of_chosen_variables_reads_only_them_and_its_decision_is_code(seed):
  """model.readout_reads=2: the logits are a NumPy transcription of the classifier over the two variables the
  argmaxes of select_readout_* choose (every other row ignored); gradients reach both selections; the program
  decides from those variables alone, in code (no data file), equal to the model on every input."""
  cfg = config(num_layers=2, num_heads=2, numerical_heads=1, mlps=1, readout_reads=2, gumbel_scale=1.0)
  card, names = tp.cardinality(cfg), tp.variable_names(cfg)
  params = init(cfg, seed)
  params['select_readout_1'] = choose(len(names), names.index('attn_1_1'))  # a count, with another variable
  chosen = {names[int(np.argmax(params[f'select_readout_{i}']))] for i in range(2)}
  x, lengths = every_input(4, cfg.max_len)
  model = build(cfg)
  hidden, table = model.apply({'params': params}, jnp.asarray(x), jnp.asarray(x != PAD), return_hidden=True)
  hidden, weights = np.asarray(hidden), np.asarray(params['readout'])
  want = weights[:, -1] + sum(hidden[..., i * card:(i + 1) * card] @ weights[:, i * card:(i + 1) * card].T
                              for i, name in enumerate(names) if name in chosen)
  np.testing.assert_allclose(hidden @ np.asarray(table).T, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(tp.readout_of(params, cfg)), np.asarray(table), rtol=0, atol=0)

  def loss(p):
    h, t = model.apply({'params': p}, jnp.asarray(x), jnp.asarray(x != PAD), return_hidden=True)
    return jnp.mean(jax.nn.log_softmax(h @ t.T)[..., 2])

  grads = jax.grad(loss)(params)
  for i in range(2):
    assert np.abs(np.asarray(grads[f'select_readout_{i}'])).sum() > 0, i
  # While training the choice is a Gumbel-softmax sample: every variable's rows weigh in, and train.
  _, sampled = model.apply({'params': params}, jnp.asarray(x[:4]), jnp.asarray(x[:4] != PAD), return_hidden=True,
                           gumbel_scale=1.0, rngs={'gumbel': jax.random.PRNGKey(seed)})
  others = [i for i, name in enumerate(names) if name not in chosen]
  assert all(np.abs(np.asarray(sampled)[:, i * card:(i + 1) * card]).max() > 0 for i in others)
  got = tags(cfg, params, x, lengths)
  program = program_code.build(params, cfg, TOKENS, x, lengths, exhaustive=True)
  assert program.tables == {} and program.decisions is not None
  assert set(program.decisions.reads) <= {program.names.get(v, v) for v in chosen}
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths) == got).all()


def counts_set(cfg, task, seed):
  """The trainer's fresh-parameter changes (``trainer.task_init``) on ``init(cfg, seed)`` for ``task``: the
  parameters before and after, each variable's value on every input of up to 3 symbols, its lengths and which of
  its positions are real."""
  from symjax.train import optim
  from symjax.train import trainer as train
  params = init(cfg, seed=seed)
  state = optim.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=())
  before = jax.tree.map(np.asarray, params)  # task_init donates the state
  got = train.task_init(state, task, cfg, None).params
  x, lengths = every_input(3, cfg.max_len)
  real = np.arange(x.shape[1])[None, :] < lengths[:, None]
  hidden, _ = build(cfg).apply({'params': got}, jnp.asarray(x), jnp.asarray(real), return_hidden=True)
  card, names = tp.cardinality(cfg), tp.variable_names(cfg)
  value = lambda name: np.asarray(hidden)[..., names.index(name) * card:(names.index(name) + 1) * card].argmax(-1)
  return before, got, value, x, lengths, real


def assert_the_rest_as_initialised(got, before, set_leaves, count: int):
  """Every leaf of ``got`` but the ``count`` (module, leaf) pairs of ``set_leaves`` equals ``before``'s."""
  kept = [(path, np.asarray(a), b) for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got),
                                                           jax.tree.leaves(before))
          if tuple(getattr(k, 'key', None) for k in path)[:2] not in set_leaves]
  assert len(kept) == len(jax.tree.leaves(before)) - count
  for path, a, b in kept:
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize('numerical_values', [False, True])
def test_position_counts_start_three_heads_counting_positions_and_leave_the_rest(numerical_values):
  """model.position_counts: after the trainer's fresh-parameter changes, layer 0's first three numerical heads
  write n − i, i + 1 and n at every real position i of an input of n (a NumPy count, independent of the model),
  and every other parameter is as initialised; without the option the state is returned as is."""
  from symjax.train import optim
  from symjax.train import trainer as train
  cfg = config(num_heads=4, numerical_heads=3, mlps=0, position_counts=True, numerical_values=numerical_values)
  no_change = types.SimpleNamespace(initial_params=lambda params, model_config: None, symbol_ids=tuple)
  state = optim.TrainState(step=jnp.zeros((), jnp.int32), params=init(cfg, seed=1), opt_state=())
  assert train.task_init(state, no_change, cfg.replace(position_counts=False), None) is state
  before, got, value, x, lengths, real = counts_set(cfg, no_change, seed=1)
  i, n = np.arange(x.shape[1])[None, :], lengths[:, None]
  for name, want in [('attn_0_1', n - i), ('attn_0_2', i + 1), ('attn_0_3', np.broadcast_to(n, x.shape))]:
    np.testing.assert_array_equal(np.where(real, value(name), -1), np.where(real, want, -1), err_msg=name)
  set_leaves = {(f'attn_0_{h}', leaf) for h in (1, 2, 3)
                for leaf in ('select_query', 'select_key', 'predicate', 'select_value')}
  assert_the_rest_as_initialised(got, before, set_leaves, 12 if numerical_values else 9)


def test_symbol_counts_start_a_head_per_symbol_after_the_position_counts_and_leave_the_rest():
  """model.symbol_counts with model.position_counts: after the trainer's fresh-parameter changes the numerical
  heads after the three counting positions write, at every real position, how many of the input's symbols
  are each of the task's symbols (a NumPy count), layer 0's counts of positions are still set, and every other
  parameter is as initialised."""
  cfg = config(num_layers=2, num_heads=4, numerical_heads=3, mlps=0, position_counts=True, symbol_counts=True)
  task = types.SimpleNamespace(initial_params=lambda params, model_config: None, symbol_ids=lambda: SYMBOLS)
  before, got, value, x, lengths, real = counts_set(cfg, task, seed=2)
  i, n = np.arange(x.shape[1])[None, :], lengths[:, None]
  counts = [np.broadcast_to(((x == s) & real).sum(1, keepdims=True), x.shape) for s in SYMBOLS]
  for name, want in zip(['attn_0_1', 'attn_0_2', 'attn_0_3', 'attn_1_1', 'attn_1_2', 'attn_1_3'],
                        [n - i, i + 1, np.broadcast_to(n, x.shape), *counts], strict=True):
    np.testing.assert_array_equal(np.where(real, value(name), -1), np.where(real, want, -1), err_msg=name)
  set_leaves = {(f'attn_{l}_{h}', leaf) for l in (0, 1) for h in (1, 2, 3)
                for leaf in ('select_query', 'select_key', 'predicate')}
  assert_the_rest_as_initialised(got, before, set_leaves, 18)
  with pytest.raises(InputError, match='it has 3 symbols and the model 0 numerical heads free to count them'):
    tp.symbol_counts(got, cfg.replace(num_layers=1), SYMBOLS)
  with pytest.raises(InputError, match='model.symbol_counts counts the symbols of the task, and this task names'):
    tp.symbol_counts(got, cfg, ())


def test_the_most_freq_recipe_starts_from_counts_of_its_six_symbols():
  """configs/rasp.py: most_freq's program recipe sets model.symbol_counts (runlocal's two heads could not hold
  them), and the task names its content symbols, the ids a histogram counts."""
  from symjax import configs
  from symjax.tasks import rasp
  recipe, local = (configs.from_file(f'rasp:task=most_freq,model=program{extra}') for extra in ('', ',runlocal=true'))
  assert recipe.model.symbol_counts and not local.model.symbol_counts
  assert not configs.from_file('rasp:task=hist,model=program').model.symbol_counts
  task = rasp.RaspTask('most_freq')
  assert [task.vocab.tokens[i] for i in task.symbol_ids()] == ['0', '1', '2', '3', '4', '5']


@pytest.mark.parametrize('numerical_values', [False, True])
def test_forward_is_one_hot_and_gradients_reach_every_choice(numerical_values):
  cfg = config(num_layers=2, num_heads=2, numerical_heads=1, mlps=1, numerical_values=numerical_values)
  params = init(cfg)
  x, lengths = every_input(3, cfg.max_len)
  model = build(cfg)

  def loss(p):
    h, table = model.apply({'params': p}, jnp.asarray(x), jnp.asarray(x != PAD), return_hidden=True)
    return jnp.mean(jax.nn.log_softmax(h @ table.T)[..., 2]), h

  grads, hidden = jax.grad(loss, has_aux=True)(params)
  assert set(np.unique(np.asarray(hidden))) == {0.0, 1.0}
  for name in ('attn_1_0', 'attn_1_1', 'mlp_1_0'):
    for leaf in ('select_query', 'select_first') + (('select_value',) if name == 'attn_1_1' else ()):
      if leaf in grads[name]:
        assert np.abs(np.asarray(grads[name][leaf])).sum() > 0, (name, leaf)
    assert np.abs(np.asarray(grads[name].get('predicate', grads[name].get('out_kernel')))).sum() > 0


@pytest.mark.parametrize('seed,causal,numerical_values', [(0, False, False), (1, True, True)])
def test_the_relaxation_becomes_the_program_as_its_temperature_falls(seed, causal, numerical_values, monkeypatch):
  """Relaxed training's forward pass (every choice softmax((logits + g) / τ)) has the hard model, the program,
  as its limit: with the noise at zero and τ tiny, the same logits; at τ = 1 soft weights and other logits."""
  cfg = config(num_layers=2, num_heads=3, numerical_heads=1, mlps=1, causal=causal, relaxed=True,
               gumbel_scale=3.0, numerical_values=numerical_values)
  params = init(cfg, seed)
  x, lengths = every_input(3, cfg.max_len)
  mask = jnp.asarray(np.arange(x.shape[1])[None, :] < lengths[:, None])
  model = build(cfg)
  hard = np.asarray(model.apply({'params': params}, jnp.asarray(x), mask))
  monkeypatch.setattr(jax.random, 'gumbel', lambda key, shape: jnp.zeros(shape))
  monkeypatch.setattr(jax.random, 'logistic', lambda key, shape: jnp.zeros(shape))

  def relaxed(tau):
    h, table = model.apply({'params': params}, jnp.asarray(x), mask, gumbel_scale=tau, return_hidden=True,
                           rngs={'gumbel': jax.random.PRNGKey(0)})
    return np.asarray(h), np.asarray(h @ table.T)

  h, logits = relaxed(1e-6)
  np.testing.assert_allclose(logits, hard, atol=1e-4)
  h, logits = relaxed(1.0)
  assert not set(np.unique(h)) <= {0.0, 1.0} and np.abs(logits - hard).max() > 0.1
  with pytest.raises(InputError, match='model.relaxed trains on Gumbel-softmax samples'):
    config(relaxed=True)
  with pytest.raises(InputError, match="model.relaxed trains a Transformer Program's relaxation"):
    config(kind='symbolic', relaxed=True)


def test_relaxed_attention_without_its_noise_reads_the_closest_match_as_tau_falls():
  """A head whose predicate matches every `a` reads the closest one. The relaxation's Gumbel-softmax sample of
  its attention reads a farther `a` on many queries however small τ is (the closeness bias is under the unit
  noise); with ``model.attention_noise = False`` the softmax at a small τ is the program's pattern, the earlier
  of two keys at the same distance included."""
  def pattern(noise: bool, tau: float | None, seed: int = 0):
    cfg = config(num_heads=1, numerical_heads=0, mlps=0, relaxed=tau is not None, gumbel_scale=3.0,
                 attention_noise=noise)
    card = tp.cardinality(cfg)
    params = jax.tree.map(jnp.zeros_like, init(cfg))
    params['attn_0_0'] = dict(select_query=choose(2, 1, 50.0), select_key=choose(2, 0, 50.0),   # positions, tokens
                              select_value=choose(2, 0, 50.0),
                              predicate=jnp.asarray(np.where(np.arange(card)[None, :] == SYMBOLS[0], 50.0, -50.0)
                                                    * np.ones((card, 1))))
    x, lengths = every_input(5, cfg.max_len)
    mask = jnp.asarray(np.arange(x.shape[1])[None, :] < lengths[:, None])
    rngs = {} if tau is None else {'gumbel': jax.random.PRNGKey(seed)}
    _, state = build(cfg).apply({'params': params}, jnp.asarray(x), mask, gumbel_scale=tau, rngs=rngs,
                                mutable=['intermediates'])
    return np.asarray(state['intermediates']['attn_0_0']['pattern'][0]), x, np.asarray(mask)

  hard, x, mask = pattern(True, None)
  several = mask & ((x == SYMBOLS[0]).sum(1) >= 2)[:, None]          # queries with two or more `a`s to read
  assert set(np.unique(hard)) == {0.0, 1.0} and several.sum() > 500
  soft, _, _ = pattern(False, 0.01)
  np.testing.assert_allclose(soft[mask], hard[mask], atol=1e-3)
  farther = np.mean([(pattern(True, 0.01, seed)[0].argmax(-1) != hard.argmax(-1))[several].mean() for seed in range(3)])
  assert farther > 0.2
  with pytest.raises(InputError, match='model.attention_noise = False .* needs model.relaxed = True'):
    config(attention_noise=False)


def test_program_kind_refuses_options_it_has_not():
  with pytest.raises(InputError, match='qk_positions'):
    config(qk_positions=True)
  with pytest.raises(InputError, match='numerical_heads'):
    config(numerical_heads=3)
  with pytest.raises(InputError, match='mlps'):
    config(mlps=-1)
  with pytest.raises(InputError, match='model.numerical_values is what numerical heads sum'):
    config(numerical_heads=0, numerical_values=True)
  with pytest.raises(InputError, match="model.numerical_values sums a Transformer Program's numerical"):
    config(kind='symbolic', numerical_values=True)
  with pytest.raises(InputError, match=r"model.numerical_readout must be one of \['one_hot', 'linear'\]"):
    config(numerical_readout='log')
  with pytest.raises(InputError, match='linear needs model.numerical_heads >= 1'):
    config(numerical_heads=0, numerical_readout='linear')
  with pytest.raises(InputError, match="model.numerical_readout weighs a Transformer Program's numerical"):
    config(kind='symbolic', numerical_readout='linear')
  with pytest.raises(InputError, match=r'model.readout_reads must be an int in \[0, 5\]'):
    config(readout_reads=6)
  with pytest.raises(InputError, match="model.readout_reads chooses the variables a Transformer Program's"):
    config(kind='symbolic', readout_reads=1)
  with pytest.raises(InputError, match=r'model.position_counts starts three numerical heads .* got 1 and True'):
    config(position_counts=True)
  with pytest.raises(InputError, match="model.position_counts starts a Transformer Program's numerical heads"):
    config(kind='symbolic', position_counts=True)
  with pytest.raises(InputError, match="model.symbol_counts starts a Transformer Program's numerical heads"):
    config(kind='symbolic', symbol_counts=True)
  with pytest.raises(InputError, match='model.symbol_counts starts numerical heads whose query reads positions'):
    config(symbol_counts=True, numerical_positions=False)
  with pytest.raises(InputError, match="model.attention_noise is a Transformer Program's relaxed attention"):
    config(kind='symbolic', attention_noise=False)


def test_the_command_trains_and_decompiles_sort_into_code_equal_on_every_input(tmp_path):
  """End to end: a few steps of the program kind on sort, then the command; the code equals the model on all
  19,530 inputs of sort (its three splits), runs with NumPy alone and refuses inputs longer than it was
  checked on."""
  import os
  import subprocess
  import sys

  import symjax
  from symjax.proj import decompile
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run = str(tmp_path / 'run')
  proc = subprocess.run([sys.executable, '-m', 'symjax.main', '--config=rasp:task=sort,model=program,runlocal=true',
                         '--config.progress_bar=false', '--config.total_steps=30', '--config.eval_every_steps=30',
                         f'--workdir={run}'], cwd=repo, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  output = str(tmp_path / 'out' / 'sort.py')
  proc = subprocess.run([sys.executable, '-m', 'symjax.decompile', f'--workdir={run}', f'--output={output}'],
                        cwd=repo, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'fidelity 100.00%' in proc.stdout and not proc.stderr.strip(), (proc.stdout, proc.stderr)
  with open(output) as f:
    text = f.read()
  assert 'def predicate_' in text or 'def num_predicate_' in text
  assert sorted(os.listdir(os.path.dirname(output))) == ['sort.npz', 'sort.py']
  loaded, program = symjax.load(run), decompile.load_program(output)
  measured = [decompile.evaluate(loaded, program, split) for split in ('train', 'validation', 'test')]
  assert sum(m['sequences'] for m in measured) == 19_530
  assert [m['fidelity'] for m in measured] == [100.0, 100.0, 100.0]
  with pytest.raises(InputError, match='at most 8 tokens'):
    decompile.evaluate(loaded, program, 'length_12')
  assert len(predict_with_numpy_alone(output, ['<s>', '3', '1', '2', '</s>'], str(tmp_path))) == 5


def test_the_induction_recipe_trains_and_decompiles_into_code_equal_on_every_input(tmp_path):
  """configs/program.py end to end at runlocal: the program is pruned on, and equals the model on, all 133,760
  inputs of the induction task, and is code."""
  import os
  import subprocess
  import sys

  import symjax
  from symjax.proj import decompile
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run, output = str(tmp_path / 'run'), str(tmp_path / 'out' / 'induction.py')
  for command in (['symjax.main', '--config=program:runlocal=true', '--config.progress_bar=false', f'--workdir={run}'],
                  ['symjax.decompile', f'--workdir={run}', f'--output={output}']):
    proc = subprocess.run([sys.executable, '-m', *command], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'fidelity 100.00%' in proc.stdout, proc.stdout
  loaded, program = symjax.load(run), decompile.load_program(output)
  assert decompile.evaluate(loaded, program, 'validation')['fidelity'] == 100.0
  with open(output) as f:
    assert 'every input of the task' in f.read()


def test_a_task_whose_inputs_cannot_be_listed_is_refused_in_one_line(tmp_path):
  from symjax.configs import symbolic
  from symjax.run import workdir
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('to be or not to be, that is the question. ' * 100)
  config = symbolic.get_config('task=text,runlocal=true')
  config.text_path, config.model.kind = str(corpus), 'program'
  loaded = workdir.Loaded(None, None, config, None, None, step=0, task=config.task, seq_len=8,
                          language_model=True)
  with pytest.raises(InputError, match=r"needs a task whose inputs can be listed \(the RASP tasks and induction\), "
                                       r"got task 'text'"):
    program_code.decompile(loaded)


def test_the_interpretability_tools_refuse_a_program_in_one_line():
  from symjax.interpret import core
  with pytest.raises(InputError, match=r"model.kind 'program' has neither \(read a program run as code"):
    core.analysis_model(build(config()))


def constant_and_duplicate_plan() -> program_code.Plan:
  """A plan whose MLP is a constant (1 on every input), read as the query of a head that therefore selects on its
  key alone; a second head equal to that one; and a counting head whose predicate never holds (a constant 0).
  The classifier tags each position with the token the first head copies, and adds the other two heads'
  rows (the duplicate's and the constant's), so that the simplifier's folding and merging are what keeps the
  tags. Three heads the classifier ignores, which the check that the simplified program tags every input alike
  runs: one counts with the constant as its query, one has it as its key (a predicate of the query alone), one
  matches no key (position 0's value everywhere)."""
  card, a = len(TOKENS), TOKENS.index('a')
  constant = program_code.Module('mlp_0_0', 'mlp', ('tokens', 'positions'), np.ones((card, card), int))
  reads_a = np.zeros(card, int)
  reads_a[1] = a                                  # query value 1 (the MLP's constant) selects keys holding 'a'
  first = program_code.Module('attn_1_0', 'categorical', ('mlp_0_0', 'tokens', 'tokens'), reads_a)
  same = program_code.Module('attn_1_1', 'categorical', ('mlp_0_0', 'tokens', 'tokens'), reads_a.copy())
  never = program_code.Module('attn_1_2', 'numerical', ('positions', 'positions'), np.zeros((card, card), bool))
  counts_b = np.zeros((card, card), bool)
  counts_b[1, TOKENS.index('b')] = True            # query value 1 (the constant) counts the keys holding 'b'
  count = program_code.Module('attn_1_3', 'numerical', ('mlp_0_0', 'tokens'), counts_b)
  names_b = np.zeros(card, int)
  names_b[TOKENS.index('b')] = 1                   # the query 'b' names key value 1, which every key holds
  query_only = program_code.Module('attn_1_4', 'categorical', ('tokens', 'mlp_0_0', 'positions'), names_b)
  no_key = program_code.Module('attn_1_5', 'categorical', ('positions', 'positions', 'attn_1_0'),
                               np.full(card, card - 1))  # names a position no input reaches
  names = ['tokens', 'positions', 'mlp_0_0', 'attn_1_0', 'attn_1_1', 'attn_1_2', 'attn_1_3', 'attn_1_4', 'attn_1_5']
  readout = {n: np.zeros((card, card), np.float32) for n in names}
  readout['attn_1_0'][np.arange(card), np.arange(card)] = 2.0     # tag = the copied token
  readout['attn_1_1'][np.arange(card), (np.arange(card) + 1) % card] = 1.0   # a weaker vote, same variable
  readout['attn_1_2'][0, 3] = 0.5                  # a constant row: it joins the bias
  readout['bias'] = np.zeros(card, np.float32)
  return program_code.Plan([constant, first, same, never, count, query_only, no_key], readout, list(TOKENS), 6,
                           False, card)


def test_a_counting_head_left_with_neither_query_nor_key_counts_every_allowed_key_or_none():
  """Folding can leave a counting head with neither a query nor a key (both ``NOTHING``: its key was a constant,
  then its query became one, as a reverse program's unused head did); its code counts every key the mask
  allows, or none, as the model's head does."""
  x, lengths = every_input(3, 5)
  card, nothing = len(TOKENS), program_code.NOTHING
  every = program_code.Module('attn_0_0', 'numerical', (nothing, nothing), np.ones((1, 1), bool))
  none = program_code.Module('attn_0_1', 'numerical', (nothing, nothing), np.zeros((1, 1), bool))
  readout = {n: np.zeros((card, card), np.float32) for n in ('attn_0_0', 'attn_0_1')}
  readout['bias'] = np.zeros(card, np.float32)
  for causal in (False, True):
    plan = program_code.Plan([every, none], readout, list(TOKENS), 5, causal, card)
    doms = program_code.domains(plan, sorted(set(x[x != PAD].tolist())))
    values, real = program_code._run(plan, doms, {'attn_0_0', 'attn_0_1'}, readout, x, lengths, 'program.npz')
    keys = np.minimum(np.arange(x.shape[1]) + 1, lengths[:, None]) if causal else lengths[:, None] + 0 * x
    assert (values['attn_0_0'].ids[real] == keys[real]).all(), causal
    assert (values['attn_0_1'].ids[real] == 0).all(), causal


def test_the_simplifier_folds_constants_merges_duplicates_and_keeps_every_tag():
  """The constant MLP leaves the program and its head's predicate reads the key alone (``k_token == 'a'``); the
  equal head is merged into the first; the counting head that counts nothing is gone; and the program's tags are
  those of a direct transcription: every position copies an 'a' where the input holds one, else position 0's
  token."""
  x, lengths = every_input(5, 6)
  program = program_code.code_of(constant_and_duplicate_plan(), x, lengths, exhaustive=True)
  text = program.source
  assert program.names['attn_1_0'] == 'tok_1_0'
  assert 'def predicate_tok_1_0(k_token):' in text and "return k_token == 'a'" in text
  assert 'mlp_0_0' not in text and '(attn_1_1)' not in text and '(attn_1_2)' not in text
  assert any('attn_1_1 = attn_1_0' in note for note in program.notes)
  assert any('attn_1_3' in note and 'folded' in note for note in program.notes)  # a count on the key alone
  assert program.left == {'constant': [], 'never': [], 'duplicate': []}
  # The same check on the plan as the model wrote it finds each of them.
  before = constant_and_duplicate_plan()
  input_tokens = sorted(set(x[x != PAD].tolist()))
  doms = program_code.domains(before, input_tokens, {'tokens': (BOS,)})
  left = program_code.leftovers(before, doms, {m.name for m in before.modules})
  assert left == {'constant': ['mlp_0_0', 'attn_1_2'], 'never': ['attn_1_2'], 'duplicate': ['attn_1_1']}
  x_plan = constant_and_duplicate_plan()
  doms_of = lambda plan: program_code.domains(plan, sorted(set(x[x != PAD].tolist())), {'tokens': (BOS,)})
  simple, _ = program_code.simplify(x_plan, doms_of)
  full = program_code.source(simple, set(program_code._variables(simple)), doms_of(simple), 'all', 'program.npz')
  assert "def predicate_attn_1_4(q_token):" in full and "return q_token == 'b'" in full
  assert 'attn_1_4 = aggregate(select_closest(None, tokens, predicate_attn_1_4), positions)' in full
  assert 'attn_1_5 = at_first(attn_1_0)' in full
  want = np.zeros_like(x)
  for r, (row, n) in enumerate(zip(x, lengths)):
    want[r, :n] = TOKENS.index('a') if TOKENS.index('a') in row[:n] else row[0]
  loaded = program_code._load(text, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths) == want).all()


def unreached_plan() -> program_code.Plan:
  """A causal plan whose tables hold other values on pairs no input reaches: a head counts the keys at position
  2 or later (at the query '<s>', which only position 0 holds and which sees position 0 alone, it names
  positions 2 and 4 too), and an MLP is 1 where the token is 'a', else 0, over the token and that count (7 where
  '<s>' meets a count above 0, 3 at the counts 5 and 6, which inputs of 6 tokens never reach). The classifier
  reads both."""
  card, a = len(TOKENS), TOKENS.index('a')
  q, k = np.indices((card, card))
  counts = k >= 2
  counts[BOS] = np.isin(np.arange(card), [2, 4])
  table = (q == a).astype(int)
  table[BOS, 1:] = 7
  table[:, 5:7] = 3
  modules = [program_code.Module('attn_0_0', 'numerical', ('tokens', 'positions'), counts),
             program_code.Module('mlp_0_0', 'mlp', ('tokens', 'attn_0_0'), table)]
  names = ['tokens', 'positions', 'attn_0_0', 'mlp_0_0']
  readout = {n: np.zeros((card, card), np.float32) for n in names}
  readout['mlp_0_0'][1, TOKENS.index('#5')] = 10.0
  for n in range(5):
    readout['attn_0_0'][n, TOKENS.index(f'#{n + 1}')] = 1.0
  readout['bias'] = np.zeros(card, np.float32)
  return program_code.Plan(modules, readout, list(TOKENS), 6, True, card)


def test_pairs_no_input_reaches_are_written_in_the_shortest_way_and_every_tag_stays():
  """Written over every input, the pairs no input reaches take the values that write least: the count is
  ``k_position >= 2`` with no case for '<s>' (a predicate of the key alone), and the MLP reads the token alone.
  Over inputs that are not the task's every input, the tables stay the model's. Both tag every input as the
  plan does."""
  x, lengths = every_input(5, 6)
  plan = unreached_plan()
  doms = program_code.domains(plan, sorted(set(x[x != PAD].tolist())), {'tokens': (BOS,)})
  everything = set(program_code._variables(plan))
  plain = program_code.source(plan, everything, doms, 'as the model wrote it', 'program.npz')
  want = program_code._load(plain, program_code._readout(plan, everything), 'program.npz').predict_ids(x, lengths)
  assert len(np.unique(want)) > 3
  program = program_code.code_of(plan, x, lengths, exhaustive=True)
  text = program.source.split('def run(')[1].split('def decide(')[0]
  assert "'<s>'" not in text and ' 7' not in text and ' 3' not in text
  assert 'return k_position >= 2' in text and '(k_position):' in text
  assert 'def mlp_0_0(token):' in text and "return 1 if token == 'a' else 0" in text
  assert any('written anew' in note for note in program.notes)
  kept = program_code.code_of(unreached_plan(), x, lengths, exhaustive=False)
  assert "'<s>'" in kept.source.split('def run(')[1] and not any('written anew' in n for n in kept.notes)
  for p in (program, kept):
    assert (program_code._load(p.source, p.tables, 'program.npz').predict_ids(x, lengths) == want).all()


def test_a_head_exact_only_where_tagged_may_fold_after_its_unreached_pairs_are_written():
  """On inputs of at most 3 tokens no key sits at position 4 or 5. A count of the keys at positions 0 and 2
  takes in position 4 too for 'a', position 5 for 'b', so only once those pairs are written anew do its
  tagged queries agree and the head reads its key alone; at the untagged '<s>', a case of its own that counted
  nothing, the count then changes, which no tag reads. The program tags every position as the plan does."""
  card = len(TOKENS)
  k = np.indices((card, card))[1]
  counts = (k == 0) | (k == 2)
  counts[TOKENS.index('a'), 4] = counts[TOKENS.index('b'), 5] = True
  counts[BOS] = False
  names = ['tokens', 'positions', 'attn_0_0']
  readout = {n: np.zeros((card, card), np.float32) for n in names}
  for n in range(5):
    readout['attn_0_0'][n, TOKENS.index(f'#{n + 1}')] = 1.0
  readout['bias'] = np.zeros(card, np.float32)
  plan = program_code.Plan([program_code.Module('attn_0_0', 'numerical', ('tokens', 'positions'), counts)],
                           readout, list(TOKENS), 6, True, card, untagged=(BOS,))
  x, lengths = every_input(3, 6)
  doms = program_code.domains(plan, sorted(set(x[x != PAD].tolist())), {'tokens': (BOS,)})
  plain = program_code.source(plan, set(names), doms, 'as the model wrote it', 'program.npz')
  want = program_code._load(plain, program_code._readout(plan, set(names)), 'program.npz').predict_ids(x, lengths)
  program = program_code.code_of(plan, x, lengths, exhaustive=True)
  assert 'def predicate_count_0_0(k_position):\n        return k_position in {0, 2}' in program.source
  got = program_code._load(program.source, program.tables, 'program.npz').predict_ids(x, lengths)
  assert (got == want).all() and len(np.unique(want[(x != BOS) & (x != PAD)])) == 2


def test_a_predicate_is_written_anew_wherever_no_variable_changes():
  """Pairs every input reaches may still be written either way where no variable changes. A count of the keys at
  positions {1, 2, 3} for '<s>', 'b' and 'c' and {0, 2, 3} for 'a' counts as many on every input (positions 0
  and 1 are always there): one predicate of the key alone, where the model's needs a case for 'a'. The program
  tags every input as the plan does."""
  card = len(TOKENS)
  counts = np.zeros((card, card), bool)
  counts[:, 1:4] = True
  counts[TOKENS.index('a')] = np.isin(np.arange(card), [0, 2, 3])
  names = ['tokens', 'positions', 'attn_0_0']
  readout = {n: np.zeros((card, card), np.float32) for n in names}
  for n in range(1, 6):
    readout['attn_0_0'][n, TOKENS.index(f'#{n}')] = 1.0
  readout['bias'] = np.zeros(card, np.float32)
  plan = program_code.Plan([program_code.Module('attn_0_0', 'numerical', ('tokens', 'positions'), counts)],
                           readout, list(TOKENS), 6, False, card)
  x, lengths = every_input(5, 6)
  doms = program_code.domains(plan, sorted(set(x[x != PAD].tolist())), {'tokens': (BOS,)})
  plain = program_code.source(plan, set(names), doms, 'as the model wrote it', 'program.npz')
  assert "if token != 'a':" in plain
  want = program_code._load(plain, program_code._readout(plan, set(names)), 'program.npz').predict_ids(x, lengths)
  assert len(np.unique(want)) == 4   # padding's 0, and counts 1 to 3 by the input's length
  program = program_code.code_of(plan, x, lengths, exhaustive=True)
  text = program.source.split('def run(')[1]
  assert 'def predicate_count_0_0(k_position):' in text and "'a'" not in text
  assert any('no variable changes' in note for note in program.notes)
  got = program_code._load(program.source, program.tables, 'program.npz').predict_ids(x, lengths)
  assert (got == want).all()


def test_the_commonest_row_is_the_first_of_the_rows_seen_most_often():
  # _rule's choice of extra keys: the same row as sorting the rows and counting them (np.unique over rows),
  # ties broken by the first row in that order, whatever the width.
  rng = np.random.default_rng(0)
  for shape in [(12, 3), (40, 5), (7, 17), (30, 64)]:
    for _ in range(20):
      distinct = rng.random((3, shape[1])) < 0.3
      rows = distinct[rng.permutation(np.arange(shape[0]) % 3)]    # as many of each, or one more: ties
      rows[rng.random(shape[0]) < 0.2] ^= True
      patterns, count = np.unique(rows, axis=0, return_counts=True)
      np.testing.assert_array_equal(program_code._commonest_row(rows), patterns[np.argmax(count)])


def test_kept_rows_says_which_rows_read_the_same_values_on_every_input():
  """A head reading the next position's token, on inputs whose positions 1 and 2 hold the same token: query
  position 0 may name key 2 instead of 1, or none at the last position, where it reads position 0 either way;
  naming key 3 reads another token. A count changes where the keys counted differ in number on some input."""
  card = len(TOKENS)
  x = np.array([[BOS, a, a, b, c, PAD][:n] + [PAD] * (6 - n) for a, b, c in itertools.product(SYMBOLS, repeat=3)
                for n in (3, 5)])
  lengths = (x != PAD).sum(1)
  real = np.arange(6)[None, :] < lengths[:, None]
  nxt = np.minimum(np.arange(card) + 1, card - 1)
  head = program_code.Module('attn_0_0', 'categorical', ('positions', 'positions', 'tokens'), nxt)
  plan = program_code.Plan([head], {}, list(TOKENS), 6, False, card)
  doms = program_code.domains(plan, sorted(set(x[real].tolist())), {'tokens': (BOS,)})
  positions = np.broadcast_to(np.arange(6), x.shape)
  read = np.where(positions + 1 < lengths[:, None], np.take_along_axis(x, np.minimum(positions + 1, 5), 1), BOS)
  holds = lambda a: type('V', (), {'ids': a})()
  values = {'tokens': holds(x), 'positions': holds(positions), 'attn_0_0': holds(read)}
  kept = program_code.kept_rows(head, doms, values, real, False, card)
  assert kept(nxt[:6]).all()
  assert list(kept(np.array([2, 2, 3, 4, 5, 6]))) == [True] * 6
  assert list(kept(np.array([3, 2, 3, 4, -1, -1]))) == [False, True, True, True, True, True]
  count = program_code.Module('attn_0_1', 'numerical', ('positions', 'positions'), np.ones((card, card), bool))
  counted = holds(np.broadcast_to(lengths[:, None], x.shape))
  kept = program_code.kept_rows(count, doms, {**values, 'attn_0_1': counted}, real, False, card)
  fewer = np.ones((6, 6), bool)
  fewer[1, 4] = fewer[2, 0] = False
  assert list(kept(fewer)) == [True, False, False, True, True, True]


def count_then_mlp(table: np.ndarray):
  """A counting head (same token) then an MLP over the token and that count (``table``); the classifier tags
  a count n '#n' (the MLP's rows, zero here, and the bias are the caller's): modules, names, readout."""
  card = len(TOKENS)
  modules = [program_code.Module('attn_0_0', 'numerical', ('tokens', 'tokens'), np.eye(card, dtype=bool)),
             program_code.Module('mlp_0_0', 'mlp', ('tokens', 'attn_0_0'), table)]
  names = ['tokens', 'positions', 'attn_0_0', 'mlp_0_0']
  readout = {n: np.zeros((card, card), np.float32) for n in names}
  for n in range(1, 6):
    readout['attn_0_0'][n, TOKENS.index(f'#{n}')] = 1.0
  readout['bias'] = np.zeros(card, np.float32)
  return modules, names, readout


def test_a_table_is_loosened_where_no_tag_changes_on_any_input():
  """An MLP returns 1 for 'a', 3 for a 'b' that occurs twice or more, else 0; the classifier tags 'a' '#5' and
  every other position with its token's count, reading 3 as it reads 0. On the task's every input the case for
  'b' changes no tag, so the code leaves it out (the MLP's 3 becomes 0); over other inputs it stays. Both tag
  every input as the plan does."""
  card, a, b = len(TOKENS), TOKENS.index('a'), TOKENS.index('b')
  q, c = np.indices((card, card))
  table = np.where(q == a, 1, np.where((q == b) & (c >= 2), 3, 0))
  modules, names, readout = count_then_mlp(table)
  readout['mlp_0_0'][1, TOKENS.index('#5')] = 10.0
  plan = lambda: program_code.Plan([dataclasses.replace(m) for m in modules], readout, list(TOKENS), 6, False, card)
  x, lengths = every_input(5, 6)
  doms = program_code.domains(plan(), sorted(set(x[x != PAD].tolist())), {'tokens': (BOS,)})
  plain = program_code.source(plan(), set(names), doms, 'as the model wrote it', 'program.npz')
  assert 'else 3' in plain
  want = program_code._load(plain, program_code._readout(plan(), set(names)), 'program.npz').predict_ids(x, lengths)
  program = program_code.code_of(plan(), x, lengths, exhaustive=True)
  assert "return 1 if token == 'a' else 0" in program.source and ' 3' not in program.source.split('def run(')[1]
  assert any('mlp_0_0' in note and 'loosened' in note for note in program.notes)
  kept = program_code.code_of(plan(), x, lengths, exhaustive=False)
  assert 'else 3' in kept.source and not any('loosened' in note for note in kept.notes)
  for p in (program, kept):
    assert (program_code._load(p.source, p.tables, 'program.npz').predict_ids(x, lengths) == want).all()


def test_a_cell_takes_its_rows_value_where_the_mlps_commonest_would_change_a_tag():
  """An MLP returns 1 for 'a' (4 where three 'a's are counted), 2 for 'b', else 0; the classifier reads 1 and 4
  alike ('#5'), 2 as '#4', 0 as nothing. The commonest value, 0, would change the tag of those 'a's; the
  value of the rest of their row, 1, changes none, so the code returns 1 for every 'a'."""
  card, a, b = len(TOKENS), TOKENS.index('a'), TOKENS.index('b')
  q, c = np.indices((card, card))
  table = np.where(q == a, np.where(c == 3, 4, 1), np.where(q == b, 2, 0))
  modules, names, readout = count_then_mlp(table)
  readout['mlp_0_0'][[1, 4], TOKENS.index('#5')] = 10.0
  readout['mlp_0_0'][2, TOKENS.index('#4')] = 10.0
  plan = lambda: program_code.Plan([dataclasses.replace(m) for m in modules], readout, list(TOKENS), 6, False, card)
  x, lengths = every_input(5, 6)
  doms = program_code.domains(plan(), sorted(set(x[x != PAD].tolist())), {'tokens': (BOS,)})
  plain = program_code.source(plan(), set(names), doms, 'as the model wrote it', 'program.npz')
  want = program_code._load(plain, program_code._readout(plan(), set(names)), 'program.npz').predict_ids(x, lengths)
  program = program_code.code_of(plan(), x, lengths, exhaustive=True)
  run = program.source.split('def run(')[1]
  assert 'return 4' not in run and 'else 4' not in run and '4 if' not in run, run
  kept = program_code.code_of(plan(), x, lengths, exhaustive=False)
  assert '4' in kept.source.split('def mlp_0_0')[1].split('mlp_0_0 = ')[0]
  for p in (program, kept):
    assert (program_code._load(p.source, p.tables, 'program.npz').predict_ids(x, lengths) == want).all()


def test_decisions_read_only_the_variables_that_decide_the_tag():
  """Over the combinations reached, a variable whose values the others already decide is dropped: here the
  tag is the count, whatever the token, so the decisions read the count alone."""
  reached = np.array([[2, 1], [3, 1], [2, 2], [4, 3]])        # (token, count)
  tags = np.array([5, 5, 6, 7])
  assert program_code._decides(reached[:, [1]], tags)
  assert not program_code._decides(reached[:, [0]], tags)    # token 2 reaches two tags
  assert program_code._decides(reached[:, []], np.array([4, 4, 4, 4]))
  assert not program_code._decides(reached[:, []], tags)


def named_plan():
  """Heads whose predicates show what they hold, over tokens a, b, c and positions 0..5: the next token, the
  length, the count of 'a' (a predicate that ignores its query), position 0's token (a predicate that matches
  no key), and a count of the keys holding the query's token or '<s>' (but at the query '<s>'); and an MLP
  reading the count of 'a'. The classifier reads every one of them."""
  card = len(TOKENS)
  q, k = np.indices((card, card))
  a = TOKENS.index('a')
  modules = [
      program_code.Module('attn_0_0', 'categorical', ('positions', 'positions', 'tokens'), np.arange(card) + 1),
      program_code.Module('attn_0_1', 'numerical', ('tokens', 'positions'), np.ones((card, card), bool)),
      program_code.Module('attn_0_2', 'numerical', ('positions', 'tokens'), k == a),
      program_code.Module('attn_0_3', 'categorical', ('tokens', 'tokens', 'tokens'), np.full(card, PAD)),
      program_code.Module('attn_0_4', 'numerical', ('tokens', 'tokens'), ((k == q) | (k == BOS)) & (q != BOS)),
      program_code.Module('mlp_0_0', 'mlp', ('attn_0_2', 'attn_0_2'), np.minimum(q, 2)),
  ]
  names = ['tokens', 'positions', *[m.name for m in modules]]
  rng = np.random.default_rng(0)
  readout = {n: rng.normal(size=(card, card)).astype(np.float32) for n in names}
  readout['bias'] = np.zeros(card, np.float32)
  return program_code.Plan(modules, readout, list(TOKENS), 6, False, card)


def test_a_classifier_fit_anew_over_fewer_variables_tags_every_input_alike_without_their_heads(monkeypatch):
  """The model's classifier tags each position with its token, but only with a head's help: its row for 'c'
  scores 'b' higher, and the length head adds the same 0.8 to 'c' at every length. Pruning keeps that head (its
  rows change tags); the tokens alone tag every input alike with other rows, so the fit anew leaves it out.
  The classifier stays a table here (no decisions), as where the tags need more than decisions may write."""
  monkeypatch.setattr(program_code, 'DECISION_LIMIT', 0)
  card = len(TOKENS)
  b, c = TOKENS.index('b'), TOKENS.index('c')
  length = program_code.Module('attn_0_0', 'numerical', ('tokens', 'positions'), np.ones((card, card), bool))
  token_rows = np.eye(card, dtype=np.float32)
  token_rows[c, b] = 1.5
  length_rows = np.zeros((card, card), np.float32)
  length_rows[:, c] = 0.8
  plan = program_code.Plan([length], {'tokens': token_rows, 'positions': np.zeros((card, card), np.float32),
                                      'attn_0_0': length_rows, 'bias': np.zeros(card, np.float32)},
                           list(TOKENS), 6, False, card)
  x, lengths = every_input(5, 6)
  real = np.arange(6)[None, :] < lengths[:, None]
  model = program_code.code_of(plan, x, lengths, exhaustive=True, fit_classifier=False)
  fit = program_code.code_of(plan, x, lengths, exhaustive=True)
  assert 'length = aggregate_sum(' in model.source and 'length = ' not in fit.source
  for program in (model, fit):
    got = program_code._load(program.source, program.tables, 'program.npz').predict_ids(x, lengths)
    assert (got == np.where(real, x, 0)).all()
  assert all(v.dtype == np.int64 for v in fit.tables.values())
  assert fit.entries < model.entries and fit.lines < model.lines
  assert any('fit anew over 1 of its 2 variables' in note and '`length`' not in note for note in fit.notes)


def test_variables_are_named_by_what_they_hold_and_each_module_says_what_it_computes():
  x, lengths = every_input(5, 6)
  # The classifier as built (fit_classifier=False): it reads every module, whose names and comments are tested.
  program = program_code.code_of(named_plan(), x, lengths, exhaustive=True, fit_classifier=False)
  assert program.source.startswith('"""Decompiled by symjax from the Transformer Program memory.')
  assert program.names == {'attn_0_0': 'next_token', 'attn_0_1': 'length', 'attn_0_2': 'count_a',
                           'attn_0_3': 'first_token', 'attn_0_4': 'count_0_4'}
  text = program.source
  # Each module has a one-line comment saying what it computes, naming the model's head it comes from: briefer
  # where the docs' sentence would wrap (position 0 where none matches is the runtime's, the cases counted).
  assert "    # `next_token` (attn_0_0) copies `tokens` where `k_position == q_position + 1`.\n" in text
  assert '    # `count_0_4` (attn_0_4) counts the keys by `tokens` of query and key (3 cases).\n' in text
  assert all(len(line) <= program_code.WIDTH for line in text[text.index('def run('):text.index('def predict_ids(')]
             .splitlines())
  assert '    # `length` (attn_0_1) counts every key: the length' in text
  assert '    # `count_a` (attn_0_2) counts the keys where `k_token == \'a\'`.' in text
  assert '    # `mlp_0_0` is 0 where `count_a` is 0; 1 where `count_a` is 1; else 2.' in text
  # A predicate that ignores its query reads its key alone; a comparison with one exception lists it first.
  assert "def predicate_count_a(k_token):\n        return k_token == 'a'" in text
  assert ("    def predicate_count_0_4(q_token, k_token):\n        if q_token == '<s>':\n            return False\n"
          "        return k_token == q_token or k_token == '<s>'") in text
  # Position 0's token is '<s>' on every input: a constant, whose classifier row joins the bias.
  assert 'first_token =' not in text
  # The lines the model decides: run() alone here (the classifier is a data file), without the runtime.
  run = text[text.index('def run('):text.index('def predict_ids(')].rstrip('\n')
  assert program.tables and program.model_lines == len(run.splitlines()) < program.lines - 100
  # The named program tags every input as the plan written with the model's names does.
  plan = named_plan()
  everything = set(program_code._variables(plan))
  doms = program_code.domains(plan, sorted(set(x[x != PAD].tolist())), {'tokens': (BOS,)})
  plain = program_code.source(plan, everything, doms, 'model names', 'program.npz')
  assert 'def predicate_attn_0_4(q_token, k_token):' in plain
  want = program_code._load(plain, program_code._readout(plan, everything), 'program.npz').predict_ids(x, lengths)
  got = program_code._load(text, program.tables, 'program.npz').predict_ids(x, lengths)
  assert (got == want).all() and len(np.unique(want)) > 2
  assert program.left == {'constant': [], 'never': [], 'duplicate': []}


def renamed_plan(reader: str | None = None):
  """The previous token (attn_0_0); an MLP that renames it one-to-one (mlp_0_0 = perm[attn_0_0]); a head counting
  the keys whose token the renaming maps back to it (so: the keys holding the previous token); the classifier
  reads all three. ``reader``: one more head that copies the MLP's value from the next position ('copy'), or
  sums it over every key ('sum', which no renaming of its inputs re-indexes)."""
  card = len(TOKENS)
  perm = np.roll(np.arange(card), 3)
  q, k = np.indices((card, card))
  modules = [
      program_code.Module('attn_0_0', 'categorical', ('positions', 'positions', 'tokens'),
                          np.maximum(np.arange(card) - 1, 0)),
      program_code.Module('mlp_0_0', 'mlp', ('attn_0_0', 'attn_0_0'), perm[q]),
      program_code.Module('attn_1_0', 'numerical', ('mlp_0_0', 'tokens'), k == np.argsort(perm)[q]),
  ]
  if reader == 'copy':
    modules.append(program_code.Module('attn_1_1', 'categorical', ('positions', 'positions', 'mlp_0_0'),
                                       np.minimum(np.arange(card) + 1, 5)))
  elif reader == 'sum':
    modules.append(program_code.Module('attn_1_1', 'numerical', ('positions', 'positions', 'mlp_0_0'),
                                       np.ones((card, card), bool)))
  names = ['tokens', 'positions', *[m.name for m in modules]]
  rng = np.random.default_rng(1)
  readout = {n: rng.normal(size=(card, card)).astype(np.float32) for n in names}
  readout['bias'] = np.zeros(card, np.float32)
  return program_code.Plan(modules, readout, list(TOKENS), 6, False, card)


@pytest.mark.parametrize('reader', [None, 'copy', 'sum'])
def test_a_variable_equal_to_an_earlier_one_up_to_a_renaming_is_merged_into_it(reader):
  """Merged where every reader can be re-indexed — a head copying the renamed variable copies the earlier one,
  its own value renamed alike — and left (and found left) where a head sums it."""
  x, lengths = every_input(5, 6)
  # The classifier as built: a fit anew could leave out the variable whose merge is tested.
  program = program_code.code_of(renamed_plan(reader), x, lengths, exhaustive=True, fit_classifier=False)
  text = program.source
  merged = any('mlp_0_0 = f(attn_0_0)' in note for note in program.notes)
  assert merged == (reader != 'sum')
  assert program.left['duplicate'] == (['mlp_0_0'] if reader == 'sum' else [])
  if merged:
    # The MLP is gone; the count reads the previous token through the renaming: a comparison of tokens.
    assert 'def mlp_0_0' not in text and 'def predicate_count_1_0(prev_token, token):' in text
    assert 'return token == prev_token' in text and 'mlp_0_0=prev_token' in text.replace(' ', '')
  else:
    assert 'def mlp_0_0' in text
  if reader == 'copy':   # it copies the previous token from the next position: a token, named as one
    assert 'tok_1_1 = aggregate(tok_1_1_pattern, prev_token)' in text
  plan = renamed_plan(reader)
  everything = set(program_code._variables(plan))
  doms = program_code.domains(plan, sorted(set(x[x != PAD].tolist())), {'tokens': (BOS,)})
  plain = program_code.source(plan, everything, doms, 'as the model', 'program.npz')
  want = program_code._load(plain, program_code._readout(plan, everything), 'program.npz').predict_ids(x, lengths)
  got = program_code._load(text, program.tables, 'program.npz').predict_ids(x, lengths)
  assert (got == want).all() and len(np.unique(want)) > 2


def test_a_renaming_at_the_tagged_positions_alone_merges_where_untagged_ones_reach_no_tag():
  """An MLP renames the previous token one-to-one at every tagged position and writes a value of its own at
  '<s>', which the task never tags and which nothing but the classifier (at its own position) reads: on such a
  task it is the previous token (``merge_renamings_everywhere``, as ``loosen`` calls it once a loosened table
  makes one), and the program tags every tagged position as before; where '<s>' is tagged, it stays."""
  card = len(TOKENS)
  perm = np.roll(np.arange(card), 3)
  prev, tok = np.indices((card, card))
  a = TOKENS.index('a')
  mlp = np.where(tok == BOS, perm[a], perm[prev])  # at '<s>' (previous token '<s>') as for 'a': no renaming there
  modules = [program_code.Module('attn_0_0', 'categorical', ('positions', 'positions', 'tokens'),
                                 np.maximum(np.arange(card) - 1, 0)),
             program_code.Module('mlp_0_0', 'mlp', ('attn_0_0', 'tokens'), mlp)]
  rng = np.random.default_rng(2)
  readout = {n: rng.normal(size=(card, card)).astype(np.float32) for n in ('tokens', 'positions', 'attn_0_0',
                                                                           'mlp_0_0')}
  readout['bias'] = np.zeros(card, np.float32)
  x, lengths = every_input(4, 6)
  doms_of = lambda p: program_code.domains(p, sorted(set(x[x != PAD].tolist())), {'tokens': (BOS,)})
  for untagged in ((), (BOS,)):
    plan = program_code.Plan(modules, readout, list(TOKENS), 6, False, card, untagged=untagged)
    merged, notes = program_code.merge_renamings_everywhere(plan, doms_of, x, lengths, 'program.npz')
    assert [m.name for m in merged.modules] == (['attn_0_0'] if untagged else ['attn_0_0', 'mlp_0_0'])
    assert any('mlp_0_0 = f(attn_0_0)' in n for n in notes) == bool(untagged)
  everything = set(program_code._variables(plan))
  run = lambda p: program_code._load(program_code.source(p, set(program_code._variables(p)), doms_of(p), 'x',
                                                         'program.npz'), program_code._readout(p, everything),
                                     'program.npz').predict_ids(x, lengths)
  want, got = run(plan), run(merged)
  assert (got[x != BOS] == want[x != BOS]).all() and len(np.unique(want[x != BOS])) > 2


def test_a_renaming_is_one_to_one_over_the_values_taken():
  assert list(program_code._renaming(np.array([1, 2, 1, 3]), np.array([4, 0, 4, 5]), 6)[[1, 2, 3]]) == [4, 0, 5]
  assert program_code._renaming(np.array([1, 2, 1]), np.array([4, 0, 5]), 6) is None    # 1 goes to two values
  assert program_code._renaming(np.array([1, 2, 3]), np.array([4, 4, 5]), 6) is None    # two values to one
  # Past the first positions it reads: a renaming there and everywhere, and one there that breaks at the last.
  a = np.arange(program_code.RENAMING_FIRST + 10) % 3
  b = np.array([2, 0, 1])[a]
  assert list(program_code._renaming(a, b, 4)[:3]) == [2, 0, 1]
  b[-1] = 3
  assert program_code._renaming(a, b, 4) is None


def test_a_head_that_matches_no_key_needs_only_the_variable_it_copies():
  """A copying head whose predicate matches no key reads position 0's value: its key (here an MLP nothing else
  reads) is not needed, and neither is that MLP's code."""
  card, a, b = len(TOKENS), TOKENS.index('a'), TOKENS.index('b')
  q, k = np.indices((card, card))
  # Position 0 counts the 'a's, every other position the 'b's: position 0's value is a variable of its own.
  modules = [program_code.Module('attn_0_0', 'numerical', ('positions', 'tokens'), np.where(q == 0, k == a, k == b)),
             program_code.Module('mlp_0_0', 'mlp', ('tokens', 'positions'), (q + k) % 3),
             program_code.Module('attn_0_1', 'categorical', ('positions', 'mlp_0_0', 'attn_0_0'),
                                 np.full(card, card - 1))]
  readout = {n: np.zeros((card, card), np.float32) for n in ['tokens', 'positions', 'attn_0_0', 'mlp_0_0', 'attn_0_1']}
  readout['attn_0_1'][np.arange(card), np.arange(card)] = 1.0       # tag: how many 'a' the input holds
  readout['bias'] = np.zeros(card, np.float32)
  plan = program_code.Plan(modules, readout, list(TOKENS), 6, False, card)
  x, lengths = every_input(5, 6)
  program = program_code.code_of(plan, x, lengths, exhaustive=True)
  assert 'first_count_0_0 = at_first(count_0_0)' in program.source and 'def mlp_0_0' not in program.source
  assert program.left == {'constant': [], 'never': [], 'duplicate': []}
  want = np.where(np.arange(6)[None] < lengths[:, None], (x == a).sum(1, keepdims=True), 0)
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths) == want).all()


def test_a_head_that_matches_every_key_reads_the_closest_other_position_and_nothing_else():
  """A copying head whose key is a constant its predicate names matches every key: each position copies its
  closest other position's token (the earlier of two, itself where it stands alone), and the constant it
  compared is gone with its MLP."""
  card = len(TOKENS)
  modules = [program_code.Module('mlp_0_0', 'mlp', ('tokens', 'positions'), np.zeros((card, card), int)),
             program_code.Module('attn_0_0', 'categorical', ('tokens', 'mlp_0_0', 'tokens'), np.zeros(card, int))]
  readout = {n: np.zeros((card, card), np.float32) for n in ['tokens', 'positions', 'mlp_0_0', 'attn_0_0']}
  readout['attn_0_0'][np.arange(card), np.arange(card)] = 1.0
  readout['bias'] = np.zeros(card, np.float32)
  plan = program_code.Plan(modules, readout, list(TOKENS), 6, False, card)
  x, lengths = every_input(5, 6)
  program = program_code.code_of(plan, x, lengths, exhaustive=True)
  assert 'tok_0_0 = closest_other(tokens)  # its predicate matches every key' in program.source
  assert 'def mlp_0_0' not in program.source and program.left == {'constant': [], 'never': [], 'duplicate': []}
  want = np.zeros_like(x)
  for r, (row, n) in enumerate(zip(x, lengths)):
    want[r, :n] = [row[i - 1] if i else row[1 if n > 1 else 0] for i in range(n)]
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths) == want).all()


def test_readout_sparsity_adds_the_group_lasso_of_each_variables_rows_to_the_loss():
  """The step minimises CE + λ Σ_v ‖W_v‖₂, W_v the readout columns of variable v (a NumPy transcription, the
  bias column left out); its gradient shrinks the readout more than the step without it."""
  from symjax.train import optim, trainer

  cfg = config()
  model, card = build(cfg), tp.cardinality(cfg)
  table = np.asarray(init(cfg, seed=3)['readout'], np.float64)
  columns = table[:, :-1]
  want = sum(np.linalg.norm(columns[:, v * card:(v + 1) * card]) for v in range(columns.shape[1] // card))
  assert float(tp.readout_group_norm(jnp.asarray(table, jnp.float32), card)) == pytest.approx(want, rel=1e-5)

  x, lengths = every_input(3, cfg.max_len)
  mask = np.arange(cfg.max_len)[None, :] < lengths[:, None]
  batch = dict(inputs=jnp.asarray(x), key_mask=jnp.asarray(mask), targets=jnp.asarray(np.where(mask, 5, 0)),
               weights=jnp.asarray(mask, jnp.float32))
  tx, params = optax.sgd(0.1), init(cfg, seed=3)
  state = optim.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  norms = {}
  for weight in (0.0, 0.5):
    step, _ = trainer.make_steps(model, tx, trainer.StepOptions(readout_sparsity=weight))
    after, metrics = jax.jit(step)(state, batch, jax.random.key(0))
    norms[weight] = float(tp.readout_group_norm(after.params['readout'], card))
    if weight:
      assert float(metrics['readout_norm']) == pytest.approx(want, rel=1e-5)
      assert float(metrics['objective']) == pytest.approx(float(metrics['loss']) + weight * want, rel=1e-5)
  # The group term's gradient λ·W_v/‖W_v‖ moves each of the variables' blocks lr·λ towards 0.
  assert norms[0.0] - norms[0.5] == pytest.approx(0.1 * 0.5 * (columns.shape[1] // card), rel=0.05)


def test_sort_with_repeated_symbols_is_three_counts_and_a_head_that_copies():
  """Sort in the kind with a decision of one variable: head 0.1 counts the symbols below the query's (s, where
  its run starts in the sorted output), head 0.2 those at or below it (c, where it ends); head 1.1 counts the
  keys whose run ends at or before the query's position i − 1 (m, the start of the run that holds position i);
  head 2.0 copies the token of a key whose run starts there (s == m). Set by hand, it sorts every input of the
  task, repeats included, and its decompiled decision is the copied token alone: no data file."""
  from symjax.tasks import base, rasp
  v = rasp.vocab('sort', 8)
  x = rasp.all_inputs('sort', 8, 8, v)
  lengths = (x != v.id(base.PAD)).sum(1)
  cfg = config(vocab_size=len(v), num_layers=3, num_heads=3, numerical_heads=2, mlps=0, max_len=8)
  card = tp.cardinality(cfg)
  q, k = np.indices((card, card))
  symbol = lambda i: (i >= v.id('0')) & (i <= v.id('4'))
  every = ~symbol(q)                               # <s> and </s> count every key: a value no run takes
  params = jax.tree.map(jnp.zeros_like, init(cfg))
  sign = lambda held: jnp.asarray(np.where(held, 1.0, -1.0))
  params['attn_0_1'] = dict(select_query=choose(2, 0), select_key=choose(2, 0),               # tokens, tokens
                            predicate=sign(every | symbol(q) & symbol(k) & (k < q)))
  params['attn_0_2'] = dict(select_query=choose(2, 0), select_key=choose(2, 0),
                            predicate=sign(every | symbol(q) & symbol(k) & (k <= q)))
  params['attn_1_1'] = dict(select_query=choose(5, 1), select_key=choose(5, 4),               # positions, attn_0_2
                            predicate=sign(k < q))
  params['attn_2_0'] = dict(select_query=choose(8, 6), select_key=choose(8, 3), select_value=choose(8, 0),
                            predicate=sign(k == q))                                 # attn_1_1, attn_0_1, tokens
  readout = np.zeros((cfg.vocab_size, 11 * card + 1))     # 11 variables: attn_2_0 is the ninth
  readout[np.arange(len(v)), 8 * card + np.arange(len(v))] = 1.0
  params['readout'] = jnp.asarray(readout)
  content = (x >= v.id('0')) & (x <= v.id('4'))
  want = np.where(content, np.sort(np.where(content, x, 99), axis=1)[:, np.r_[-1, 0:x.shape[1] - 1]], 0)
  got = tags(cfg, params, x, lengths)
  assert len(x) == 19530 and (got[content] == want[content]).all()
  program = program_code.build(params, cfg, v.tokens, x, lengths, exhaustive=True)
  assert program.tables == {} and 'DATA_FILE' not in program.source
  run = program.source[program.source.index('def run('):program.source.index('def decide(')]
  assert run.count(' = aggregate') == 4                                      # the unused heads: dropped
  assert 'return count_0_2 < position' in run and 'return count_0_1 == count_1_1' in run
  assert 'tok_2_0 = aggregate(select_closest(count_0_1, count_1_1, predicate_tok_2_0), tokens)' in run
  assert program.source.split('def decide(tok_2_0):')[1].split('def ')[0].strip().endswith('return tok_2_0')
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths)[content] == want[content]).all()


def test_dyck1_is_two_bracket_counts_their_sign_and_a_count_of_prefixes_gone_negative():
  """Dyck1 in the kind with a decision the code states: heads 0.1 and 0.2 count the `(` and the `)` so far,
  the MLP writes the sign of their difference (0 below, 1 level, 2 above), head 1.1 counts the prefixes whose
  sign was 0; a prefix is F once that count is 1 or more, else T where level and P where above. Set by hand,
  it tags all 32,768 inputs of the task, and its decompiled decision is in the code: no data file."""
  from symjax.tasks import base, rasp
  v = rasp.vocab('dyck1', 8, 16)
  x = rasp.all_inputs('dyck1', 16, 8, v)
  lengths = (x != v.id(base.PAD)).sum(1)
  cfg = config(vocab_size=len(v), num_layers=2, num_heads=3, numerical_heads=2, mlps=1, max_len=16, causal=True)
  card = tp.cardinality(cfg)
  q, k = np.indices((card, card))
  sign = lambda held: jnp.asarray(np.where(held, 1.0, -1.0))
  params = jax.tree.map(jnp.zeros_like, init(cfg))
  for head, bracket in (('attn_0_1', '('), ('attn_0_2', ')')):                    # tokens, tokens
    params[head] = dict(select_query=choose(2, 0), select_key=choose(2, 0), predicate=sign(k == v.id(bracket)))
  value = np.arange(card, dtype=np.float32)
  hidden = np.zeros((2 * card, cfg.program.mlp_hidden), np.float32)
  hidden[:card, 0], hidden[card:, 0] = value, -value                            # relu(opened - closed)
  hidden[:card, 1], hidden[card:, 1] = -value, value                            # relu(closed - opened)
  out = np.zeros((cfg.program.mlp_hidden, card), np.float32)
  out[0, 2] = out[1, 0] = 1.0
  out_bias = np.zeros(card, np.float32)
  out_bias[1] = 0.5                                                             # level: neither unit is on
  params['mlp_0_0'] = dict(select_first=choose(5, 3), select_second=choose(5, 4), hidden_kernel=jnp.asarray(hidden),
                           hidden_bias=jnp.zeros(cfg.program.mlp_hidden), out_kernel=jnp.asarray(out),
                           out_bias=jnp.asarray(out_bias))
  params['attn_1_1'] = dict(select_query=choose(6, 0), select_key=choose(6, 5),            # tokens, mlp_0_0
                            predicate=sign(np.broadcast_to(k == 0, (card, card))))
  readout = np.zeros((cfg.vocab_size, 10 * card + 1))   # 10 variables: mlp_0_0 the sixth, attn_1_1 the eighth
  readout[v.id('F'), 7 * card + 1:8 * card] = 10.0
  readout[v.id('T'), 5 * card + 1] = readout[v.id('P'), 5 * card + 2] = 5.0
  params['readout'] = jnp.asarray(readout)
  content = x[:, 1:]
  want = np.array([[0] + [v.id(t) for t in rasp.tags('dyck1', [v.tokens[i] for i in row])] for row in content])
  got = tags(cfg, params, x, lengths)
  assert len(x) == 32768 and (got[:, 1:] == want[:, 1:]).all()
  program = program_code.build(params, cfg, v.tokens, x, lengths, exhaustive=True)
  assert program.tables == {} and 'DATA_FILE' not in program.source
  assert ('def mlp_0_0(count_0_1, count_0_2):\n        if count_0_1 < count_0_2:\n            return 0\n'
          '        return 1 if count_0_1 == count_0_2 else 2\n') in program.source
  assert '`mlp_0_0` compares `count_0_1` with `count_0_2`: 0 where less, 1 where equal' in program.source
  assert "def decide(mlp_0_0, count_1_1):" in program.source and "return k_mlp_0_0 == 0" in program.source
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths)[:, 1:] == want[:, 1:]).all()


def test_dyck2_is_bracket_counts_a_level_the_partner_bracket_there_and_a_count_of_mismatches():
  """Dyck-2 in the kind, four layers (``benchmarks/analysis/dyck2_from_its_program.py``): counts of the opening
  and closing brackets so far, the depth, each bracket's level, the token of the closest earlier key at the same
  level (a closing bracket's partner), whether that partner mismatches, and a count of mismatches so far. Set
  by hand, it tags 20,000 inputs drawn as the task draws them, and its decompiled code tags them alike."""
  from benchmarks.analysis import dyck2_from_its_program as dyck2
  from symjax.tasks import base, rasp
  v = rasp.vocab('dyck2', 8, 16)
  contents = rasp.distinct_contents('dyck2', base.rng_for(0, 'rasp', 'dyck2'), 16, 8, 20000)
  x, want = (np.stack(rows) for rows in zip(*(rasp.encode('dyck2', list(c), 16, v) for c in contents)))
  lengths = (x != v.id(base.PAD)).sum(1)
  cfg = config(vocab_size=len(v), num_layers=4, num_heads=3, numerical_heads=2, mlps=2, max_len=16, causal=True)
  params = dyck2.dyck2_program(init(cfg), cfg, list(v.tokens))           # the other modules: random
  assert len(x) == 20000 and (tags(cfg, params, x, lengths)[:, 1:] == want[:, 1:]).all()
  mismatched = dict(params)                          # the partner head matching the other levels instead
  mismatched['attn_2_0'] = {**params['attn_2_0'], 'predicate': -params['attn_2_0']['predicate']}
  assert (tags(cfg, mismatched, x, lengths)[:, 1:] != want[:, 1:]).any()
  program = program_code.build(params, cfg, v.tokens, x[:4000], lengths[:4000], exhaustive=False)
  assert "return k_token in {'(', '{'}" in program.source and "return k_token in {')', '}'}" in program.source
  assert 'aggregate(select_closest(mlp_1_0, mlp_1_0, predicate_tok_2_0), tokens)' in program.source
  loaded = program_code._load(program.source, program.tables, 'program.npz')
  assert (loaded.predict_ids(x, lengths)[:, 1:] == want[:, 1:]).all()
  three = config(vocab_size=len(v), num_layers=3, num_heads=3, numerical_heads=2, mlps=2, max_len=16, causal=True)
  with pytest.raises(SystemExit, match='needs model.num_layers >= 4'):
    dyck2.dyck2_program(init(three), three, list(v.tokens))


def test_an_mlp_that_compares_two_numbers_is_written_as_the_comparison_and_filled_so_where_unreached():
  rng = np.random.default_rng(0)
  dom = list(range(6))
  signs = program_code._signs(dom, dom)
  table = np.choose(signs, [5, 3, 7])                       # 5 below, 3 equal, 7 above
  assert program_code._sign_values(table, dom, dom) == {0: 5, 1: 3, 2: 7}
  assert program_code._by_sign('a', 'b', {0: 5, 1: 3, 2: 7}) == [
      '        if a < b:', '            return 5', '        return 3 if a == b else 7']
  assert program_code._by_sign('a', 'b', {0: 5, 1: 7, 2: 7}) == ['        return 7 if a >= b else 5']
  assert program_code._by_sign('a', 'b', {0: 5, 1: 5, 2: 7}) == ['        return 7 if a > b else 5']
  assert program_code._by_sign('a', 'b', {0: 5, 1: 3, 2: 5}) == ['        return 3 if a == b else 5']
  for held, line in (({0: 5, 2: 7}, 'return 7 if a >= b else 5'), ({1: 3, 2: 7}, 'return 7 if a > b else 3'),
                     ({0: 5, 1: 3}, 'return 3 if a == b else 5')):   # domains where one relation never holds
    assert program_code._by_sign('a', 'b', held) == [f'        {line}']
  assert program_code._sign_values(np.array([[5, 5], [5, 5]]), [0, 1], [0, 1]) is None     # a constant
  assert program_code._sign_values(np.array([[5, 7]]), [0], [1, 3]) is None   # a < b on both cells, two values
  reached = rng.random(table.shape) < 0.5
  scrambled = np.where(reached, table, rng.integers(0, 9, table.shape))
  filled = program_code._sign_filled(scrambled, reached, signs)
  assert (filled[reached] == table[reached]).all() and program_code._sign_values(filled, dom, dom) is not None
  unequal = reached & (signs == 1)                          # one reached level cell tagged otherwise: no comparison
  broken = np.where(unequal & (np.cumsum(unequal) == 1).reshape(table.shape), 0, scrambled)
  assert program_code._sign_filled(broken, reached, signs) is None
  assert program_code._sign_values(np.where(signs == 1, np.arange(36).reshape(6, 6), table), dom, dom) is None
