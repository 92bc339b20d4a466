"""Configs and their errors: every bad config or input is a one-line error naming the problem, every task
trains with every kind, and weight decay falls on exactly the activation matrices."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import REPO, tiny_config

import symjax.configs as configs
from symjax.run import workdir as rundir
from symjax.train import config as config_lib
from symjax.train import optim
from symjax.train import trainer as train

pytestmark = pytest.mark.slow  # most tests here train or run a command


# ------------------------------------------------------------------------------------------------------
# Bad configs and inputs: each error names the problem.
# ------------------------------------------------------------------------------------------------------
def _with(**kw):
  config = tiny_config()
  for k, v in kw.items():
    if k.startswith(('model_', 'distributed_')):
      group, name = k.split('_', 1)
      config[group][name] = v
    else:
      config[k] = v
  return config


@pytest.mark.parametrize('config, message', [
    (_with(task='sorting'), r"config.task must be one of \[.*'induction'.*'text'\], got 'sorting'"),
    (_with(batch_size=0), r'config.batch_size must be > 0, got 0'),
    (_with(learning_rate=-1e-3), r'config.learning_rate must be > 0'),
    (_with(warmup_steps=40), r'config.warmup_steps \(40\) must be < config.total_steps \(40\)'),
    (_with(best_metric='f1'), r"config.best_metric must be one of \['accuracy', 'loss'"),
    (_with(adam_b2=1.0), r'config.adam_b2 must be in \[0, 1\)'),
    (_with(model_kind='linear'),
     r"model.kind must be one of \['standard', 'token_factored', 'symbolic', 'lstm', 'program'\]"),
    (_with(model_head_dim=0), r'model.head_dim must be > 0'),
    (_with(model_symbolic_layers=(7,)), r'model.symbolic_layers \[7\] out of range: layers are 0..1'),
    (_with(task='text'), r"config.text_path is empty: task 'text' needs the path"),
    (_with(task='text', text_path='/nonexistent/corpus.txt'), r"'/nonexistent/corpus.txt' does not exist"),
    (_with(task='text', text_path=__file__, token_path='/tmp/tokens'),
     r"config.text_path \(.*\) and config.token_path \('/tmp/tokens'\) are both set: give one"),
    (_with(task='text', tokenizer='wordpiece', text_path=__file__),
     r"config.tokenizer must be one of \['char', 'bpe'\]"),
    (_with(model_max_len=8), r"task 'induction' has sequences of 10 tokens but model.max_len is 8"),
    (_with(learning_rate=float('nan')), r'config.learning_rate must be a finite number, got nan'),
    (_with(weight_decay=float('nan')), r'config.weight_decay must be a finite number, got nan'),
    (_with(model_tau_init=float('inf')), r'config.model.tau_init must be a finite number, got inf'),
    (_with(stop_at_accuracy=2.0), r'config.stop_at_accuracy must be in \[0, 1\]'),
    (_with(length_balance=1.5), r'config.length_balance must be in \[0, 1\] \(0 walks shuffled epochs'),
    (_with(task='text', text_path=__file__, length_balance=0.5),
     r"config.length_balance is for tasks of fixed sequences .* task 'text' trains on windows of one length"),
    (_with(readout_sparsity=1e-3), r"config.readout_sparsity must be >= 0, and > 0 only with model.kind = program .* "
                                   r"got 0.001 with model.kind = 'symbolic'"),
    (_with(distributed_num_processes=0), r'config.distributed.num_processes must be an integer >= 1, got 0'),
    (_with(data_seed=-1), r'config.data_seed must be an integer >= 0, got -1'),
    (_with(sharding_rules=(('vocab', 'vocab'), ('mlp', 'model'))),
     r"config.sharding_rules must be \(logical axis, mesh axis\) pairs.* got the rule \('mlp', 'model'\)"),
    (_with(sharding_rules=(('vocab', 'vocab'), ('mpl', 'data'))), r"got the rule \('mpl', 'data'\)"),
    (_with(distributed_num_processes=2, distributed_process_id=2), r'config.distributed.process_id must be in \[0, 2\)'),  # noqa: E501
    (_with(distributed_cpu_collectives='ucx'), r"config.distributed.cpu_collectives must be one of \['', 'gloo', 'mpi'\]"),  # noqa: E501
    (_with(task='text', tokenizer='bpe', bpe_vocab_size=100, text_path=__file__),
     r'config.bpe_vocab_size must be >= 256 \(a byte-level BPE vocabulary starts from the 256 bytes\)'),
])
def test_bad_config_is_a_clear_error(config, message, tmp_path):
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(config, str(tmp_path / 'w'))
  assert not os.path.exists(tmp_path / 'w' / rundir.CHECKPOINT_DIR)


@pytest.mark.parametrize('content, message', [
    ('', r'is empty'),
    ('short text', r'is too short: its train part has 9 tokens, fewer than seq_len \+ 2 = 66'),
])
def test_empty_or_short_corpus_is_a_clear_error(content, message, tmp_path):
  path = tmp_path / 'corpus.txt'
  path.write_text(content)
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(_with(task='text', text_path=str(path)), str(tmp_path / 'w'))


def test_non_utf8_corpus_is_a_clear_error(tmp_path):
  path = tmp_path / 'corpus.bin'
  path.write_bytes(b'\xff\xfe\x00binary' * 100)
  with pytest.raises(ValueError, match='is not UTF-8 text'):
    train.train_and_evaluate(_with(task='text', text_path=str(path)), str(tmp_path / 'w'))


def test_config_arguments_are_checked():
  with pytest.raises(ValueError, match=r"unknown config argument 'sise'; known keys"):
    config_lib.parse_arg('sise=small', task='induction', size='small')
  with pytest.raises(ValueError, match=r"size must be one of \['tiny', 'small', 'medium', 'paper'\]"):
    configs.shape('huge')
  with pytest.raises(ValueError, match=r"size must be one of \['tiny', 'small', 'medium', 'paper'\]"):
    configs.from_file('symbolic:size=huge')


@pytest.mark.parametrize('kind', ['standard', 'token_factored', 'symbolic'])
def test_readout_tying_defaults_follow_the_tuned_choice(kind):
  """The recipes (configs/*.py): the symbolic model reads out through a table of its own on the benchmark
  tasks (text, FOL, RASP), token_factored on text only; induction keeps the tied readout for every kind."""
  recipes = {'induction': configs.from_file(kind), 'text': configs.from_file(f'{kind}:task=text'),
             'fol': configs.from_file(f'configs/fol.py:model={kind}'),
             'rasp': configs.from_file(f'configs/rasp.py:model={kind}')}
  untied = {'standard': set(), 'token_factored': {'text'}, 'symbolic': {'text', 'fol', 'rasp'}}[kind]
  assert {task for task, c in recipes.items() if not c.model.tie_embeddings} == untied


def test_main_cli_reports_a_bad_override_and_exits_nonzero():
  proc = subprocess.run([sys.executable, '-m', 'symjax.main', '--config=configs/symbolic.py:size=tiny',
                         '--config.batch_size=-3', '--workdir=/nonexistent-unused'],
                        cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 1
  assert 'error: config.batch_size must be > 0, got -3' in proc.stderr


@pytest.mark.parametrize('task, kind', [
    ('reverse', 'symbolic'), ('sort', 'token_factored'), ('hist', 'standard'), ('double_hist', 'symbolic'),
    ('most_freq', 'token_factored'), ('dyck1', 'standard'), ('dyck2', 'symbolic'), ('fol', 'token_factored'),
    ('fol', 'lstm'),
])
def test_every_task_trains_with_every_kind_of_model(task, kind, tmp_path):
  config = tiny_config(kind, task=task, total_steps=2, warmup_steps=1, eval_every_steps=2)
  config.model.max_len = 48 if task == 'fol' else 16
  final = train.train_and_evaluate(config, str(tmp_path / 'w'))
  assert 0.0 <= final['test']['accuracy'] <= 1.0 and np.isfinite(final['test']['loss'])
  if task in ('reverse', 'sort', 'hist', 'double_hist', 'most_freq'):
    assert {'length_12', 'length_16'} <= set(final)


def test_rasp_config_runs_from_the_command_line(tmp_path):
  proc = subprocess.run([sys.executable, '-m', 'symjax.main', '--config=configs/rasp.py:task=dyck2,model=token_factored',  # noqa: E501
                         '--config.total_steps=3', '--config.warmup_steps=1', '--config.eval_every_steps=3',
                         f'--workdir={tmp_path / "w"}'], cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "task 'dyck2'" in proc.stdout and 'final metrics at step 3' in proc.stdout
  assert sum(str(tmp_path / 'w') in line for line in proc.stdout.splitlines()) == 1  # the work directory once


def test_lstm_needs_a_causal_task(tmp_path):
  with pytest.raises(ValueError, match="model.kind 'lstm' reads left to right and needs a causal task"):
    train.train_and_evaluate(tiny_config('lstm', task='sort'), str(tmp_path / 'w'))


# ------------------------------------------------------------------------------------------------------
# Weight decay by role: exactly these leaves decay, for every kind.
# ------------------------------------------------------------------------------------------------------
DECAYED = {
    'standard': {'attention/key/kernel', 'attention/query/kernel', 'attention/value/kernel',
                 'attention/out/kernel', 'ffn/wi/kernel', 'ffn/wo/kernel'},
    'token_factored': {'attention/key/kernel', 'attention/query/kernel', 'ffn/wi/kernel', 'ffn/wo/kernel'},
    'symbolic': {'attention/key/kernel', 'attention/query/kernel', 'ffn/w1', 'ffn/w2'},
}


@pytest.mark.parametrize('kind', sorted(DECAYED))
def test_weight_decay_applies_to_activation_matrices_only(kind):
  from symjax import model as model_lib
  config = tiny_config(kind, weight_decay=0.5, grad_clip_norm=0.0, warmup_steps=0, total_steps=10)
  model_config = config_lib.model_config(config, vocab_size=10, causal=True)
  shapes = model_lib.param_shapes(model_config)
  name = lambda path: '/'.join(str(k.key) for k in path)
  mask = jax.tree_util.tree_flatten_with_path(optim.decay_mask(shapes))[0]
  decayed = {name(p).split('/', 1)[1] for p, on in mask if on}
  assert decayed == DECAYED[kind]
  # Untied readout tables decay too; the embedding table never does.
  untied = model_lib.param_shapes(model_config.replace(tie_embeddings=False))
  flags = {name(p): on for p, on in jax.tree_util.tree_flatten_with_path(optim.decay_mask(untied))[0]}
  assert flags['readout'] and not flags['embed/embedding']
  # With zero gradients, one AdamW step moves exactly the decayed leaves (by lr · wd · p).
  params = jax.tree.map(lambda s: np.ones(s.shape, np.float32), shapes)
  tx = optim.make_optimizer(config)
  zeros = jax.tree.map(np.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  lr = float(optim.learning_rate_schedule(config)(0))
  for path, u in jax.tree_util.tree_flatten_with_path(updates)[0]:
    expected = -lr * 0.5 if name(path).split('/', 1)[-1] in DECAYED[kind] else 0.0
    np.testing.assert_allclose(np.asarray(u), expected, rtol=1e-6, err_msg=name(path))


@pytest.mark.parametrize('kind', ['standard', 'token_factored', 'symbolic'])
def test_the_run_spec_parses_the_config_once_into_the_models_config_and_the_streams(kind):
  config = config_lib.default_config(kind)
  spec = config_lib.validate(config)
  # The model completed with a task's vocabulary is the config's model for that task, table padding included.
  for vocab, causal, shards in ((12, True, 1), (65, False, 2), (1000, True, 8)):
    assert spec.model_for(vocab, causal, shards) == config_lib.model_config(config, vocab, causal, shards)
  assert spec.streams == {} and spec.config is config
  config.distill.teacher, config.distill.streams = '/a/teacher', 'x_t:1.0,x_e:0'
  assert config_lib.validate(config).streams == {'x_t': 1.0}  # a stream of weight 0 is not distilled
