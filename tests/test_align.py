"""Interpretability-guided alignment: the true source positions, the module against a NumPy transcription
of eqs. (3)-(6), the loss of eqs. (7)-(8), precision@k, and the command's errors."""

import json
import os

import jax
import ml_collections
import numpy as np
import pytest
from helpers import tiny_config

from symjax.proj import align
from symjax.tasks import base, induction, rasp
from symjax.train import trainer as train

pytestmark = pytest.mark.slow  # end to end: every test here trains or runs a command


def test_induction_sources_are_the_numbers_the_tags_copy():
  task = induction.InductionTask(num_sequences=400)
  x, y = task.data.inputs['train'], task.data.targets['train']
  src = induction.source_positions(x, task.vocab)
  unk = task.vocab.id(base.UNK)
  assert (src.sum(-1) == ((y != task.pad_id) & (y != unk))).all()   # one source per copied number, else none
  for i, q, t in zip(*np.nonzero(src)):
    assert x[i, t] == y[i, q] and x[i, t - 1] == x[i, q] and t < q
    assert not any(x[i, p] == x[i, q] and task.vocab.tokens[x[i, p + 1]] in induction.NUMBERS for p in range(t - 1))


def test_reverse_sources_mirror_the_content():
  task = rasp.RaspTask('reverse', num_sequences=400)
  x, y = task.data.inputs['train'], task.data.targets['train']
  src = rasp.reverse_source_positions(x, task.vocab)
  assert (src.sum(-1) == (y != task.pad_id)).all()
  for i, q, t in zip(*np.nonzero(src)):
    length = list(x[i]).index(task.vocab.id(base.EOS)) - 1
    assert t == length + 1 - q and x[i, t] == y[i, q]


def test_precision_at_k_counts_hits_among_the_top_k_readable():
  rng = np.random.default_rng(0)
  scores = rng.normal(size=(6, 5, 7))
  sources = rng.random((6, 5, 7)) < 0.2
  readable = rng.random((6, 5, 7)) < 0.8
  sources &= readable
  want = []
  for i in range(6):
    for q in range(5):
      k = sources[i, q].sum()
      if k:
        cand = [t for t in range(7) if readable[i, q, t]]
        top = sorted(cand, key=lambda t: -scores[i, q, t])[:k]
        want.append(sum(sources[i, q, t] for t in top) / k)
  np.testing.assert_allclose(align.precision_at_k(scores, sources, readable), np.mean(want))


def np_module(params, blocks, readable, condition, d_a):
  """Eqs. (3)-(6) written out in NumPy."""
  p = jax.tree.map(np.asarray, params)
  selu = lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * (np.exp(x) - 1))
  def proj(e):
    e = e / np.sqrt((e * e).mean(-1, keepdims=True) + 1e-6)
    return (e @ p['query']['kernel']) @ np.swapaxes(e @ p['key']['kernel'], -1, -2) / np.sqrt(d_a)
  t = blocks.shape[2]
  wg, wc = p['shared']['w_global'][:t, :t], p['shared']['w_context'][:t, :t]
  c = condition[..., None]
  agg = blocks.sum(1)
  pr = proj(agg)
  ci = selu(pr @ wg + c * (pr @ wc))
  weights = pr * (wg.mean(-1) + c * wc.mean(-1))
  per_block = np.stack([selu(proj(blocks[:, j]) @ wg + c * (proj(blocks[:, j]) @ wc)) for j in range(blocks.shape[1])], 1)  # noqa: E501
  z = np.where(readable, ci, -np.inf)
  a = np.exp(z - z.max(-1, keepdims=True))
  a /= a.sum(-1, keepdims=True)
  mu, var = agg.mean(-1, keepdims=True), agg.var(-1, keepdims=True)
  normed = (agg - mu) / np.sqrt(var + 1e-6) * p['norm']['scale'] + p['norm']['bias']
  logits = (a @ normed) @ p['classifier']['kernel'] + p['classifier']['bias']
  return {'activations': ci, 'weights': weights, 'blocks': per_block, 'logits': logits}


def test_the_module_is_eqs_3_to_6():
  rng = np.random.default_rng(1)
  blocks = rng.normal(size=(3, 2, 6, 16)).astype(np.float32)
  readable = np.tril(np.ones((6, 6), bool))[None].repeat(3, 0)
  condition = np.asarray([[1, 0, 1, 1, 0, 1]] * 3, np.float32)
  module = align.Module(seq_len=8, vocab_size=5, projection_dim=4)
  params = module.init(jax.random.key(0), blocks, readable, condition)['params']
  params = jax.tree.map(lambda v: v + 0.1 * rng.normal(size=v.shape).astype(v.dtype), params)  # biases nonzero
  got = module.apply({'params': params}, blocks, readable, condition)
  want = np_module(params, blocks.astype(np.float64), readable, condition, 4)
  for k in want:
    np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=2e-4, atol=2e-5, err_msg=k)


def test_the_loss_reads_annotations_of_the_annotated_part_only():
  rng = np.random.default_rng(2)
  n, t = 4, 6
  batch = {'blocks': rng.normal(size=(n, 2, t, 8)).astype(np.float32), 'readable': np.ones((n, t, t), bool),
           'condition': np.ones((n, t), np.float32), 'targets': rng.integers(0, 5, (n, t)),
           'scored': np.ones((n, t), bool), 'sources': rng.random((n, t, t)) < 0.3,
           'annotated': np.asarray([1, 0, 1, 0], np.float32)}
  module = align.Module(seq_len=t, vocab_size=5, projection_dim=4)
  params = module.init(jax.random.key(0), batch['blocks'], batch['readable'], batch['condition'])['params']
  config = align.defaults()
  total, m = align.loss_fn(module, params, batch, config)
  np.testing.assert_allclose(float(total), float(m['ce'] + m['mse_activations'] + m['mse_weights']), rtol=1e-6)
  out = module.apply({'params': params}, batch['blocks'], batch['readable'], batch['condition'])
  gt = batch['sources'][[0, 2]].astype(np.float64)
  np.testing.assert_allclose(float(m['mse_activations']), ((np.asarray(out['activations'])[[0, 2]] - gt) ** 2).mean(),
                             rtol=1e-5)
  flipped = dict(batch, sources=batch['sources'].copy())
  flipped['sources'][[1, 3]] = ~flipped['sources'][[1, 3]]          # unannotated rows: no effect
  np.testing.assert_allclose(float(align.loss_fn(module, params, flipped, config)[0]), float(total), rtol=1e-6)
  flipped['sources'][0] = ~flipped['sources'][0]
  assert float(align.loss_fn(module, params, flipped, config)[0]) != pytest.approx(float(total))


@pytest.fixture(scope='module')
def backbone(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('backbone') / 'induction')
  train.train_and_evaluate(tiny_config('token_factored', total_steps=20), workdir)
  return workdir


def test_align_writes_its_evaluation_once_and_refuses_another_config_in_the_same_folder(backbone, tmp_path):
  config = align.defaults()
  config.steps = 30
  out = str(tmp_path / 'aligned')
  result = align.align(backbone, out, config, verbose=False)
  with open(os.path.join(out, align.RESULT_FILE)) as f:
    saved = json.load(f)
  assert saved['test'] == result['test'] and saved['kind'] == 'token_factored'
  for key in ('precision_activations', 'precision_weights', 'precision_attention', 'module_accuracy'):
    assert 0.0 <= saved['test'][key] <= 1.0
  assert len(saved['test']['precision_blocks']) == 2
  assert align.align(backbone, out, config, verbose=False)['test'] == result['test']   # finished: not retrained
  other = ml_collections.ConfigDict(config.to_dict())
  other.activation_weight = 0.0
  with pytest.raises(ValueError, match='another backbone or config'):
    align.align(backbone, out, other, verbose=False)


def test_alignment_errors_name_what_is_wrong(backbone, tmp_path):
  text_like = str(tmp_path / 'rev')
  config = tiny_config('token_factored', total_steps=10)
  config.task = 'sort'
  config.model.max_len = 16
  train.train_and_evaluate(config, text_like)
  with pytest.raises(ValueError, match=r"one of \['induction', 'reverse'\].*'sort'"):
    align.align(text_like, str(tmp_path / 'a'), align.defaults(), verbose=False)
  with pytest.raises(FileNotFoundError, match='not a symjax work directory'):
    align.align(str(tmp_path), str(tmp_path / 'b'), align.defaults(), verbose=False)
  bad = align.defaults()
  bad.annotated_fraction = 1.5
  with pytest.raises(ValueError, match=r'annotated_fraction must be in \(0, 1\]'):
    align.align(backbone, str(tmp_path / 'c'), bad, verbose=False)
  assert not os.path.exists(str(tmp_path / 'c'))
  bad = align.defaults()
  bad.learning_rate = float('nan')
  with pytest.raises(ValueError, match=r'config.learning_rate must be a finite number, got nan'):
    align.align(backbone, str(tmp_path / 'd'), bad, verbose=False)
  assert not os.path.exists(str(tmp_path / 'd'))


def test_own_annotations_are_read_and_checked(backbone, tmp_path):
  from symjax import tasks
  task = tasks.get_task(tiny_config('token_factored'))
  n, t = task.split_size('train'), task.seq_len
  config = align.defaults()
  config.steps = 5
  for array, message in ((np.zeros((n, t)), rf'has shape \({n}, {t}\); the training split needs \({n}, {t}, {t}\)'),
                         (np.full((n, t, t), 2), 'values other than 0 and 1')):
    np.save(tmp_path / 'a.npy', array)
    config.annotations = str(tmp_path / 'a.npy')
    with pytest.raises(ValueError, match=message):
      align.align(backbone, str(tmp_path / 'x'), config, verbose=False)
  config.annotations = str(tmp_path / 'missing.npy')
  with pytest.raises(FileNotFoundError, match='no file'):
    align.align(backbone, str(tmp_path / 'x'), config, verbose=False)
  true = induction.source_positions(task.data.inputs['train'], task.vocab)
  np.save(tmp_path / 'true.npy', true.astype(np.uint8))
  config.annotations = str(tmp_path / 'true.npy')
  own = align.align(backbone, str(tmp_path / 'own'), config, verbose=False)
  config.annotations = ''
  derived = align.align(backbone, str(tmp_path / 'derived'), config, verbose=False)
  assert own['test'] == derived['test']   # the true sources given as a file: the same module
