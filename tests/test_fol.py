"""The first-order-logic task: vocabulary ids, numerals, glyphs, generator, validator, and baselines."""

import collections

import numpy as np
import pytest

from symjax.tasks import base, fol
from symjax.train import baselines


@pytest.fixture(scope='module')
def task():
  return fol.FOLTask()


def test_vocabulary_has_the_notes_ids():
  v = fol.vocab()
  assert len(v) == 663
  assert v.id('0') == 0 and v.id('624') == 624
  expected = {'NOT': 625, 'IFF': 629, 'FORALL': 630, 'EXISTS1': 632, 'EQUALS': 633, 'GREATER_EQUAL': 638,
              'LPAREN': 639, 'DOT': 643, 'VAR': 644, 'SORT': 648, 'TRUE': 649, 'FALSE': 650, 'ENTAILS': 651,
              'EQUIVALENT': 654, base.PAD: 655, base.BOS: 656, base.EOS: 657, base.UNK: 658}
  assert {t: v.id(t) for t in expected} == expected


@pytest.mark.parametrize('n, digits', [(0, ['0']), (5, ['5']), (624, ['624']), (625, ['1', '0']),
                                        (627, ['1', '2']), (625 ** 2 + 3, ['1', '0', '3'])])
def test_names_are_base_625_digits(n, digits):
  assert fol.digits(n) == digits
  parser = fol.Parser(digits)
  assert parser.number() == n


def test_glyphs_are_a_bijection_with_the_documented_examples():
  grids = [fol.glyph(n) for n in range(625)]
  assert len({g.tobytes() for g in grids}) == 625
  assert not grids[0].any()
  assert grids[1].sum() == 1 and grids[1][0, 0]
  assert grids[25][0].all() and grids[25].sum() == 25
  assert grids[624].sum() == 624 and not grids[624][24, 24]
  with pytest.raises(ValueError, match='numerals are 0..624'):
    fol.glyph(625)
  e = fol.numeral_embeddings(32, 0.25)
  assert e.shape == (625, 32) and abs(e.std() - 0.25) < 0.05
  assert np.corrcoef(e[300], e[301])[0, 1] > np.corrcoef(e[1], e[600])[0, 1]  # shared cells -> similar


def test_dataset_mix_sizes_and_every_formula_is_valid(task):
  counts = collections.Counter(task.levels.values())
  assert counts == {'atomic': 4000, 'compound': 8000, 'quantified': 6000, 'nested': 2000}
  assert {k: len(v) for k, v in task.data.inputs.items()} == {'train': 16_200, 'validation': 1_800,
                                                              'test': 2_000}
  v = task.vocab
  for split in ('train', 'test'):
    for inputs, targets in zip(task.data.inputs[split], task.data.targets[split]):
      tokens = v.decode([inputs[0], *targets])  # next-symbol targets: the input shifted by one
      np.testing.assert_array_equal(inputs[1:], targets[:-1])
      assert tokens[0] == base.BOS
      end = tokens.index(base.EOS)
      fol.validate(tokens[1:end])
  quantified = [f for f, level in task.levels.items() if level in ('quantified', 'nested')]
  assert all(any(t in fol.QUANTIFIERS for t in f) for f in quantified)
  # Multi-digit names occur.
  assert any(f[i] == 'VAR' and f[i + 2].isdigit() for f in quantified for i in range(len(f) - 2))


@pytest.mark.parametrize('tokens, reason', [
    ('FORALL VAR 1 PRED 1 LPAREN VAR 1 RPAREN', None),
    ('FORALL VAR 1 PRED 1 LPAREN VAR 1', 'ends early'),                                 # unbalanced
    ('PRED 1 LPAREN VAR 1 RPAREN', 'variable x1 is not bound'),                          # free variable
    ('FORALL VAR 1 PRED 2 LPAREN VAR 1 RPAREN', 'PRED 2 takes 2 argument'),              # arity
    ('LPAREN PRED 1 LPAREN CONST 1 RPAREN AND RPAREN', 'expected a term'),               # AND needs two
    ('LPAREN PRED 1 LPAREN CONST 1 RPAREN NOT PRED 1 LPAREN CONST 2 RPAREN RPAREN', 'binary connective'),
    ('CONST 3 EQUALS CONST 4 RPAREN', 'extra tokens'),
    ('EXISTS VAR 2 7 VAR 2 7 LESS_THAN CONST 1', None),                                  # x_1257 bound
    ('EXISTS VAR 2 7 VAR 2 LESS_THAN CONST 1', 'variable x2 is not bound'),
])
def test_validator_accepts_and_rejects(tokens, reason):
  if reason is None:
    fol.validate(tokens.split())
  else:
    with pytest.raises(fol.FOLSyntaxError, match=reason):
      fol.validate(tokens.split())


def test_validator_rejects_corrupted_formulas(task):
  rng = np.random.default_rng(0)
  v = task.vocab
  rejected = total = 0
  for inputs, targets in zip(task.data.inputs['test'][:300], task.data.targets['test'][:300]):
    tokens = v.decode([inputs[0], *targets])
    f = tokens[1:tokens.index(base.EOS)]
    structural = [i for i, t in enumerate(f) if not t.isdigit()]
    i = structural[rng.integers(len(structural))]
    corrupted = f[:i] + f[i + 1:]  # drop one operator or structural token
    total += 1
    rejected += not fol.is_valid(corrupted)
  assert rejected / total > 0.95


@pytest.mark.slow
def test_ngram_matches_hand_counts_and_uniform_scores_exactly(task):
  # Bigram on a toy corpus: after token 1 came 2 twice and 3 once.
  inputs = np.array([[1, 2, 0], [1, 3, 0], [1, 2, 0]])
  targets = np.array([[2, 0, 0], [3, 0, 0], [2, 0, 0]])
  weights = np.array([[1, 0, 0]] * 3)
  model = baselines.NGram(2, vocab_size=4).fit(inputs, targets, weights)
  unigram = (np.array([0, 0, 2, 1]) + 2 * 0.25) / (3 + 2)        # Witten–Bell over the uniform
  want = (np.array([0, 0, 2, 1]) + 2 * unigram) / (3 + 2)        # c(h)=3, T(h)=2
  np.testing.assert_allclose(np.exp(model.log_probs(inputs))[0, 0], want, rtol=1e-6)
  np.testing.assert_allclose(np.exp(model.log_probs(inputs)).sum(-1), 1.0, rtol=1e-5)
  metrics = baselines.score(baselines.uniform(663), task, 'test', 64, (5, 10))
  assert metrics['perplexity'] == pytest.approx(663, rel=1e-4)
  assert metrics['accuracy'] == pytest.approx(1 / 663, rel=1e-4)   # ties broken at random
  assert metrics['top10_accuracy'] == pytest.approx(10 / 663, rel=1e-4)


def test_fol_validity_counts_ended_and_valid_samples(monkeypatch):
  """The counting around sampling: a valid formula, an invalid one, and one with no </s> in reach."""
  from symjax.run import sample
  v = fol.vocab()
  bos, eos = v.id('<s>'), v.id('</s>')
  first = fol.FOLTask(num_formulas=50).data.inputs['train'][0]
  row = [int(t) for t in first[1:] if int(t) not in (eos, v.id('<pad>'))]
  assert fol.is_valid(v.decode(row)) and not fol.is_valid(v.decode(row[:-1]))
  outputs = iter([[bos, *row, eos], [bos, *row[:-1], eos], [bos, *row]])
  monkeypatch.setattr(sample, 'generate', lambda *a, **k: np.asarray(next(outputs)))
  fake = type('Model', (), {'config': type('C', (), {'max_len': 48})()})()
  assert sample.fol_validity(fake, None, num_samples=3) == {'valid': 1 / 3, 'ended': 2 / 3}


@pytest.mark.parametrize('glyphs', [True, False])
def test_glyph_initialisation_is_the_tasks_own_change_to_fresh_parameters(glyphs):
  import jax.numpy as jnp

  from symjax import model as model_lib
  from symjax.train import optim
  from symjax.train import trainer as train
  task = fol.FOLTask(num_formulas=50, numeral_glyph_init=glyphs)
  config = model_lib.ModelConfig.of(vocab_size=len(task.vocab), num_layers=1, num_heads=2, head_dim=4,
                                 ff_dim=8, kind='standard', embed_init_std=0.25)
  table = np.random.default_rng(0).normal(size=(len(task.vocab), config.d_model)).astype(np.float32)
  state = optim.TrainState(step=jnp.zeros((), jnp.int32), params={'embed': {'embedding': jnp.asarray(table)},
                                                                   'other': jnp.ones(3)}, opt_state=())
  out = train.task_init(state, task, config, None)
  got = np.asarray(out.params['embed']['embedding'])
  if glyphs:
    np.testing.assert_allclose(got[:fol.NUM_NUMERALS], fol.numeral_embeddings(config.d_model, 0.25), rtol=1e-6)
    np.testing.assert_array_equal(got[fol.NUM_NUMERALS:], table[fol.NUM_NUMERALS:])
  else:
    assert out is state
