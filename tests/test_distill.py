"""Stream-specific distillation: the objective against a NumPy transcription, the standard model's stream
split, training from a teacher, and the errors for teachers that do not fit."""

import json
import os

import jax
import numpy as np
import pytest
from helpers import tiny_config

from symjax import tasks
from symjax.interpret import core
from symjax.run import workdir as rundir
from symjax.train import config as config_lib
from symjax.train import distill, seeds
from symjax.train import trainer as train

pytestmark = pytest.mark.slow  # end to end: every test here trains or runs a command


def np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_logit_and_stream_losses_match_numpy():
  rng = np.random.default_rng(0)
  s, t = rng.normal(size=(2, 5, 7)) * 3, rng.normal(size=(2, 5, 7)) * 3
  for temp in (1.0, 2.5):
    p = np.exp(np_log_softmax(t / temp))
    want = temp ** 2 * (p * (np_log_softmax(t / temp) - np_log_softmax(s / temp))).sum(-1)
    np.testing.assert_allclose(distill.soft_cross_entropy(s, t, temp), want, rtol=1e-5, atol=1e-6)
  a, b = rng.normal(size=(2, 5, 16)) * 4, rng.normal(size=(2, 5, 16)) * 0.1
  rms = lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(distill.stream_distance(a, b), ((rms(a) - rms(b)) ** 2).mean(-1), rtol=1e-5)
  np.testing.assert_allclose(distill.stream_distance(a, 7 * a), 0, atol=1e-10)  # scale-free


def test_layers_are_matched_in_proportion():
  assert [distill.matched_layer(l, 2, 4) for l in (1, 2)] == [2, 4]
  assert [distill.matched_layer(l, 4, 2) for l in (1, 2, 3, 4)] == [1, 1, 2, 2]
  assert [distill.matched_layer(l, 3, 3) for l in (1, 2, 3)] == [1, 2, 3]


@pytest.fixture(scope='module')
def teachers(tmp_path_factory):
  """Tiny induction teachers (20 steps): a standard and a token_factored one."""
  root = tmp_path_factory.mktemp('teachers')
  out = {}
  for kind in ('standard', 'token_factored'):
    out[kind] = str(root / kind)
    train.train_and_evaluate(tiny_config(kind, total_steps=20), out[kind])
  return out


def test_a_standard_models_streams_are_what_attention_and_the_ffns_wrote(teachers):
  loaded = rundir.load(teachers["standard"])
  tokens = np.asarray([[1, 4, 8, 5, 9, 4]])
  _, inter = core.run(loaded.model, loaded.params, tokens)
  streams = distill.layer_streams(loaded.model_config, inter)
  parts = core.components(loaded.model_config, inter)
  for l, s in enumerate(streams):
    x_t = parts['embedding'] + sum(parts[f'attention_{k}'] for k in range(l + 1))
    x_e = sum(parts[f'ffn_{k}'] for k in range(l + 1))
    np.testing.assert_allclose(s['x_t'], x_t, atol=1e-10)
    np.testing.assert_allclose(s['x_e'], x_e, atol=1e-10)
    np.testing.assert_allclose(s['x'], inter[f'blocks.{l}.resid'], atol=1e-10)


def test_a_teacher_distilled_into_itself_costs_nothing_and_the_objective_adds_up(teachers):
  """The teacher's own parameters as the student: KL and every stream distance are 0; a perturbed student
  pays exactly label CE + KL + Σ stream distances, each term recomputed by hand."""
  config = tiny_config('token_factored')
  config.distill.teacher = teachers['token_factored']
  config.distill.logits_weight, config.distill.temperature = 0.5, 2.0
  config.distill.streams = 'x_t:0.25,x_e:2.0'
  loaded = rundir.load(teachers['token_factored'])
  task = tasks.get_task(config)
  spec = config_lib.validate(config)
  teacher = distill.load_teacher(spec, task, loaded.model_config, '/nonexistent')
  objective = distill.make_objective(loaded.model_config, teacher, spec)
  batch = task.batch('validation', 0, 8, 0)
  logits, state = loaded.model.apply({'params': loaded.params}, batch['inputs'], batch['key_mask'],
                                     mutable=['intermediates'])
  total, metrics = objective(1.5, logits, state['intermediates'], batch)
  assert abs(float(metrics['distill/kl'])) < 1e-6
  assert float(metrics['distill/x_t']) < 1e-9 and float(metrics['distill/x_e']) < 1e-9
  np.testing.assert_allclose(float(total), 1.5, rtol=1e-6)

  noisy = jax.tree.map(lambda p: p + 0.05 * np.random.default_rng(1).normal(size=p.shape).astype(p.dtype),
                       loaded.params)
  logits, state = loaded.model.apply({'params': noisy}, batch['inputs'], batch['key_mask'], mutable=['intermediates'])
  total, metrics = objective(1.5, logits, state['intermediates'], batch)
  t_logits = np.asarray(loaded.model.apply({'params': loaded.params}, batch['inputs'], batch['key_mask']))
  w = batch['weights']
  p_t = np.exp(np_log_softmax(t_logits / 2.0))
  kl = (4.0 * (p_t * (np_log_softmax(t_logits / 2.0) - np_log_softmax(np.asarray(logits) / 2.0))).sum(-1) * w).sum() / w.sum()  # noqa: E501
  assert kl > 1e-4
  np.testing.assert_allclose(float(metrics['distill/kl']), kl, rtol=1e-4)
  np.testing.assert_allclose(float(total), 1.5 + 0.5 * kl + 0.25 * float(metrics['distill/x_t'])
                             + 2.0 * float(metrics['distill/x_e']), rtol=1e-5)


def test_distillation_trains_towards_the_teacher_and_resumes_only_with_its_own_teacher(teachers, tmp_path):
  config = tiny_config('symbolic', total_steps=20)
  config.distill.teacher = teachers['standard']
  config.distill.teacher_checkpoint = str(rundir.checkpoint_steps(teachers['standard'])[-1])  # as on a command line
  workdir = str(tmp_path / 'student')
  train.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, rundir.METRICS_FILE)) as f:
    rows = [json.loads(line) for line in f if '"train"' in line]
  kl = [r['distill/kl'] for r in rows]
  assert kl[-1] < kl[0], kl
  assert all(r['objective'] > r['loss'] for r in rows)   # the logged loss stays the cross-entropy
  other = tiny_config('symbolic', total_steps=30)
  other.distill.teacher = teachers['token_factored']
  with pytest.raises(ValueError, match='other distillation settings.*distill.teacher'):
    train.train_and_evaluate(other, workdir)
  plain = tiny_config('symbolic', total_steps=30)
  with pytest.raises(ValueError, match='other distillation settings'):
    train.train_and_evaluate(plain, workdir)


def test_seeds_distil_together_like_one_run(teachers, tmp_path):
  config = tiny_config('token_factored', total_steps=10)
  config.eval_every_steps = 10
  config.distill.teacher = teachers['standard']
  one = train.train_and_evaluate(config, str(tmp_path / 'one'))
  both = seeds.train_seeds(config, [0, 1], [str(tmp_path / 's0'), str(tmp_path / 's1')], verbose=False)
  np.testing.assert_allclose(both[0]['test']['loss'], one['test']['loss'], rtol=1e-4)
  assert both[0]['test']['loss'] != both[1]['test']['loss']


@pytest.mark.parametrize('change,message', [
    (dict(task='reverse'), "trained on task 'induction', the student trains on 'reverse'"),
    (dict(model_d=32), 'needs equal d_model'),
    (dict(teacher='missing'), 'no work directory'),
    (dict(streams='x_t:1,h:2'), "cannot read 'h:2'"),
    (dict(streams='x_t:-1'), 'weight >= 0'),
    (dict(temperature=0.0), 'temperature must be > 0'),
    (dict(label_weight=0.0, logits_weight=0.0, streams=''), 'every weight is 0'),
    (dict(teacher_checkpoint='last'),
     "config.distill.teacher_checkpoint must be 'best', 'latest' or a checkpointed step number, got 'last'"),
])
def test_a_teacher_or_setting_that_does_not_fit_is_a_clear_error(teachers, tmp_path, change, message):
  config = tiny_config('symbolic', total_steps=10)
  if 'task' in change:
    config = tiny_config('symbolic', total_steps=10)
    config.task = change['task']
    config.model.max_len = 16
  if 'model_d' in change:
    config.model.head_dim = change['model_d'] // config.model.num_heads
  config.distill.teacher = str(tmp_path / 'missing') if change.get('teacher') else teachers['standard']
  for k in ('streams', 'temperature', 'label_weight', 'logits_weight', 'teacher_checkpoint'):
    if k in change:
      config.distill[k] = change[k]
  workdir = str(tmp_path / 'w')
  with pytest.raises((ValueError, FileNotFoundError), match=message):
    train.train_and_evaluate(config, workdir)
  assert not os.path.exists(os.path.join(workdir, rundir.CHECKPOINT_DIR))  # refused before anything is written
