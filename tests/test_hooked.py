"""The model object: TransformerLens's calls on texts, id sequences and padded batches, each the same as the
functional call it wraps."""

import jax
import numpy as np
import pytest
from helpers import randomize, small

from symjax.interpret import HookedModel, circuits, hooks
from symjax.model import Transformer
from symjax.run.workdir import TokenVocab
from symjax.system.errors import InputError
from symjax.tasks import Vocab

WORDS = ['<s>', 'a', 'b', 'c', 'd', '0', '1', '2', '3', 'x', 'y', 'z', 'q']


@pytest.fixture(scope='module')
def hm():
  cfg = small(kind='symbolic')
  model = Transformer(cfg)
  params = randomize(model.init(jax.random.key(0), np.zeros((1, 4), np.int32))['params'], 1)
  return HookedModel(model, params, TokenVocab(Vocab(WORDS)))


def test_texts_of_unequal_length_are_padded_with_their_key_mask(hm):
  ids, mask = hm.to_tokens(['<s> a 1 b', '<s> c'])
  assert ids.shape == (2, 4) and mask.tolist() == [[True] * 4, [True, True, False, False]]
  assert hm.to_tokens('<s> a 1')[1] is None and hm.to_tokens('<s> a 1')[0].tolist() == [[0, 1, 6]]
  assert hm.to_str_tokens('<s> a 1') == ['<s>', 'a', '1']
  assert hm.to_str_tokens(['<s> a 1 b', '<s> c']) == [['<s>', 'a', '1', 'b'], ['<s>', 'c']]
  assert hm.to_string([0, 1, 6]) == '<s> a 1' and hm.cfg.kind == 'symbolic'


def test_calls_equal_the_functional_api_and_a_padded_row_equals_the_row_alone(hm):
  ids = hm.tokenizer.encode('<s> a 1 b 2')
  logits, cache = hm.run_with_cache('<s> a 1 b 2')
  want, want_cache = hooks.run_with_cache(hm.model, hm.params, ids)
  np.testing.assert_array_equal(logits, want)
  np.testing.assert_array_equal(cache['blocks.1.x_e'], want_cache['blocks.1.x_e'])
  np.testing.assert_array_equal(hm(ids), want)
  batch = hm(['<s> a 1 b 2', '<s> c'])
  np.testing.assert_allclose(batch[1, :2], hm('<s> c')[0], rtol=1e-5, atol=1e-5)  # causal: padding after it
  zeroed = hm.run_with_hooks('<s> a 1 b 2', {'blocks.0.attn.z': hooks.zero_head(0)})
  np.testing.assert_array_equal(zeroed, hooks.run_with_hooks(hm.model, hm.params, ids,
                                                             {'blocks.0.attn.z': hooks.zero_head(0)}))
  assert cache.to_str_tokens() == ['<s>', 'a', '1', 'b', '2']


def test_bad_inputs_are_one_line_errors(hm):
  for call, message in [(lambda: hm('<s> nope'), r"tokens not in the vocabulary: \['nope'\]"),
                        (lambda: hm(np.zeros((1, 2, 3), int)), r'token ids must be 1-D \(one prompt\) or 2-D'),
                        (lambda: HookedModel(object()), r'HookedModel takes a loaded run'),
                        (lambda: HookedModel(hm.model, hm.params)('<s> a'), r'has no tokenizer'),
                        (lambda: hm(['<s> a', '<s>'], key_mask=[[1, 1], [1, 0]]), r'carry their own key mask')]:
    with pytest.raises(InputError, match=message) as e:
      call()
    assert '\n' not in str(e.value)


def test_a_custom_pattern_scores_one_on_an_attention_that_matches_it_and_less_elsewhere():
  t = 6
  previous = np.eye(t, k=-1)
  previous[0, 0] = 1.0  # the first query has no previous key: it attends to itself
  other = np.full((t, t), 1 / t)
  attention = np.stack([previous, other])[None, None]  # [layers 1, batch 1, heads 2, t, t]
  scores = circuits.detect_head(attention, previous)
  assert scores.shape == (1, 2) and scores[0, 0] == 1.0 and scores[0, 1] < 0.5
  named = circuits.detect_head(attention, 'previous_token_head', tokens=np.arange(t)[None])
  assert named[0, 0] == 1.0  # the named pattern leaves the first query out: it has no previous key
  with pytest.raises(InputError, match=r"unknown detection pattern 'nope'; patterns: \['previous_token_head'"):
    circuits.detect_head(attention, 'nope', tokens=np.arange(t)[None])
  with pytest.raises(InputError, match=r'a detection pattern must be \[query, key\] = \(6, 6\)'):
    circuits.detect_head(attention, np.ones((3, 3)))


@pytest.mark.slow
def test_the_detectors_find_the_previous_token_and_induction_heads_of_the_default_induction_model(tmp_path):
  """The default recipe (symbolic, induction), trained until validation accuracy reaches 1: the strongest
  previous-token head is in block 0 and the strongest induction head in block 1, the heads the circuit
  finder names."""
  import symjax
  from symjax import tasks
  from symjax.train import config as config_lib
  from symjax.train import trainer
  config = config_lib.from_file('symbolic')
  config.stop_at_accuracy, config.progress_bar = 1.0, False
  trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  run = symjax.load(str(tmp_path / 'run'))
  batch = next(tasks.get_task(run.config).eval_batches('test', 64, run.config.data_seed))
  _, cache = HookedModel(run).run_with_cache(batch['inputs'], key_mask=batch['key_mask'])
  previous, induction = cache.detect_head('previous_token_head'), cache.detect_head('induction_head')
  assert np.unravel_index(previous.argmax(), previous.shape)[0] == 0, previous
  assert np.unravel_index(induction.argmax(), induction.shape)[0] == 1, induction
  circuit = circuits.find_induction_circuit(run.model, run.params, batch['inputs'], batch['key_mask'])
  assert circuit.previous_token_head == tuple(int(i) for i in np.unravel_index(previous.argmax(), previous.shape))
