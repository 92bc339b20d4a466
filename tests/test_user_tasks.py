"""Each task a new user tried when reading a model, done with the public API in at most ten lines (the
interpretability-API issue's list): train a tiny text model; read the top exact-mixture tokens of X_e after
block 1 at the last position; get block 0's attention pattern; zero one head and measure the validation loss
change; patch one head between two prompts and report the logit difference recovered; sweep layers × heads."""

import numpy as np
import pytest

import symjax
import symjax.configs as configs
from symjax import interpret

pytestmark = pytest.mark.slow

CLEAN, CORRUPT = 'the cat sat on the mat', 'the cat sat on the hat'


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  from symjax.train import trainer as train
  folder = tmp_path_factory.mktemp('user')
  (folder / 'corpus.txt').write_text(''.join(f'the {a} sat on the {b}.\n' for a in ('cat', 'dog', 'hen', 'fox')
                                             for b in ('mat', 'hat', 'rug', 'log')) * 40)
  config = configs.from_file('symbolic:task=text,runlocal=true')
  config.text_path, config.progress_bar = str(folder / 'corpus.txt'), False
  train.train_and_evaluate(config, str(folder / 'run'))
  return symjax.load(str(folder / 'run'))


def test_top_exact_mixture_tokens_of_x_e_after_block_1(run):
  _, cache = interpret.run_with_cache(run.model, run.params, run.tokenizer.encode(CLEAN), decode=run.tokenizer.decode)
  tops = cache.top_tokens('blocks.1.x_e', -1, head=0, k=3)
  weights = [w for _, w in tops]
  assert len(tops) == 3 and weights == sorted(weights, reverse=True) and all(isinstance(t, str) for t, _ in tops)


def test_block_0_attention_pattern(run):
  _, cache = interpret.run_with_cache(run.model, run.params, run.tokenizer.encode(CLEAN), ['blocks.0.attn.pattern'])
  pattern = cache['blocks.0.attn.pattern']
  assert pattern.shape == (1, run.model_config.num_heads, len(CLEAN), len(CLEAN))
  np.testing.assert_allclose(pattern.sum(-1), 1.0, atol=1e-5)


def test_zero_one_head_and_measure_the_validation_loss_change(run):
  batch = run.batches('validation', n=1)[0]
  loss = lambda hooks: interpret.run_with_hooks(run.model, run.params, batch['inputs'], hooks, return_type='loss',
                                                targets=batch['targets'], weights=batch['weights'])
  change = loss({'blocks.1.attn.z': interpret.zero_head(0)}) - loss({})
  assert np.isfinite(change) and change != 0.0


def test_patch_one_head_between_two_prompts_and_report_the_logit_difference_recovered(run):
  clean, corrupt = run.tokenizer.encode(CLEAN), run.tokenizer.encode(CORRUPT)
  answer, wrong = run.tokenizer.encode('.')[0], run.tokenizer.encode('t')[0]
  diff = interpret.logit_difference(answer, wrong)
  low, high = (diff(interpret.run_with_hooks(run.model, run.params, x, {})) for x in (corrupt, clean))
  patched = interpret.patch(run.model, run.params, clean, corrupt, 'blocks.1.attn.z', heads=0, metric=diff)
  recovered = (patched - low) / (high - low)
  assert np.isfinite(recovered)


def test_sweep_layers_by_heads(run):
  clean, corrupt = run.tokenizer.encode(CLEAN), run.tokenizer.encode(CORRUPT)
  answer, wrong = run.tokenizer.encode('.')[0], run.tokenizer.encode('t')[0]
  sweep = interpret.sweep_heads(run.model, run.params, clean, corrupt, answer=answer, wrong=wrong)
  assert sweep.values.shape == (run.model_config.num_layers, run.model_config.num_heads)
  assert np.all(np.isfinite(sweep.values)) and sweep.figure() is not None
