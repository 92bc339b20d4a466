"""The model object: TransformerLens's calls on texts, id sequences and padded batches, each the same as the
functional call it wraps."""

import jax
import numpy as np
import pytest
from helpers import randomize, small

from symjax.interpret import HookedModel, hooks
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
