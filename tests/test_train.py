"""The trainer end to end on tiny configs: outputs, exact resume, corrupt checkpoints, divergence, loading
and sampling (the configs' errors: test_configs.py)."""

import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
  DAMAGE,
  KILLED_AT_STEP_25,
  REPO,
  SHAKESPEARE,
  TOTAL_STEPS,
  assert_trees_equal,
  damage,
  params_of,
  tiny_config,
)

import symjax
from symjax.model import Transformer
from symjax.run import sample
from symjax.run import workdir as rundir
from symjax.system import host
from symjax.system import mesh as mesh_lib
from symjax.tasks import base as tasks_base
from symjax.tasks import text as text_tasks
from symjax.train import config as config_lib
from symjax.train import optim
from symjax.train import trainer as train

pytestmark = pytest.mark.slow  # end to end: every test here trains or runs a command


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  """One uninterrupted tiny symbolic run on the induction task."""
  workdir = str(tmp_path_factory.mktemp('run') / 'work')
  final = train.train_and_evaluate(tiny_config(), workdir)
  return workdir, final


def test_run_leaves_metrics_events_config_and_checkpoints(finished_run):
  workdir, final = finished_run
  records = [json.loads(l) for l in open(os.path.join(workdir, rundir.METRICS_FILE))]
  train_steps = [r['step'] for r in records if r['split'] == 'train']
  assert train_steps == list(range(5, TOTAL_STEPS + 1, 5))
  assert [r['step'] for r in records if r['split'] == 'validation'] == [10, 20, 30, 40]
  assert all(np.isfinite(r['loss']) and r['tokens_per_second'] > 0 for r in records if r['split'] == 'train')
  assert glob.glob(os.path.join(workdir, 'tensorboard', 'events.out.tfevents.*'))
  config = json.load(open(os.path.join(workdir, rundir.CONFIG_FILE)))
  assert config['total_steps'] == TOTAL_STEPS and config['model']['kind'] == 'symbolic'
  steps = sorted(int(s) for s in os.listdir(os.path.join(workdir, rundir.CHECKPOINT_DIR)) if s.isdigit())
  assert steps[-2:] == [30, 40]  # the last two, plus the best when it is older
  assert set(final) == {'train', 'validation', 'test'}
  assert 0.0 <= final['test']['accuracy'] <= 1.0 and final['test']['top3_accuracy'] >= final['test']['accuracy']


def test_best_checkpoint_is_kept_beside_the_last_ones(finished_run):
  workdir, _ = finished_run
  records = [json.loads(l) for l in open(os.path.join(workdir, rundir.METRICS_FILE))]
  validation = {r['step']: r['accuracy'] for r in records if r['split'] == 'validation'}
  best = max(validation, key=lambda s: (validation[s], s))
  assert os.path.isdir(os.path.join(workdir, rundir.CHECKPOINT_DIR, str(best)))
  assert symjax.load(workdir, 'best').step == best


def test_killed_run_resumes_to_exactly_the_uninterrupted_parameters(finished_run, tmp_path):
  reference, _ = finished_run
  workdir = str(tmp_path / 'killed')
  # Kill the process outright (SIGKILL) when it asks for the batch of step 25: no clean-up runs.
  driver = KILLED_AT_STEP_25 + textwrap.dedent(f"""
      from symjax.train import trainer as train
      from tests.helpers import tiny_config
      train.train_and_evaluate(tiny_config(), {workdir!r})
  """)
  proc = subprocess.run([sys.executable, '-c', driver], cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == -9, proc.stderr[-2000:]
  assert not os.path.exists(os.path.join(workdir, 'final_metrics.json'))
  train.train_and_evaluate(tiny_config(), workdir)  # the same command again
  assert_trees_equal(params_of(workdir), params_of(reference))


@pytest.mark.parametrize('kind', DAMAGE)
def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(finished_run, tmp_path, capsys, monkeypatch, kind):
  reference, _ = finished_run
  workdir = str(tmp_path / 'corrupt')
  shutil.copytree(reference, workdir)
  assert damage(os.path.join(workdir, rundir.CHECKPOINT_DIR, str(TOTAL_STEPS)), kind) > 0
  unraisable = []  # where reads left in flight by a failed restore would report (pytest turns them into warnings)
  monkeypatch.setattr(sys, 'unraisablehook', unraisable.append)
  train.train_and_evaluate(tiny_config(), workdir)
  err = capsys.readouterr()
  # One line says what happened; no Orbax or asyncio traceback buries it.
  assert 'Traceback' not in err.err and not unraisable, (err.err[:2000], unraisable[:1])
  assert err.err.startswith(f'WARNING: checkpoint at step {TOTAL_STEPS} is corrupt or partial'), err.err[:2000]
  assert len(err.err.strip().splitlines()) == 1, err.err[:2000]
  assert 'resuming from step 30' in err.out
  # The corrupt files were moved aside, not deleted, and the retrained step 40 equals the original.
  moved = os.listdir(os.path.join(workdir, rundir.CORRUPT_DIR))
  assert len(moved) == 1 and moved[0].startswith(f'{TOTAL_STEPS}_')
  assert_trees_equal(params_of(workdir), params_of(reference))


def test_resuming_with_a_different_model_is_refused_and_keeps_the_checkpoints(finished_run):
  workdir, _ = finished_run
  before = sorted(os.listdir(os.path.join(workdir, rundir.CHECKPOINT_DIR)))
  config = tiny_config()
  config.model.num_heads = 4
  with pytest.raises(ValueError, match=r'holds a run of a different model \(num_heads: 2 -> 4\)'):
    train.train_and_evaluate(config, workdir)
  assert sorted(os.listdir(os.path.join(workdir, rundir.CHECKPOINT_DIR))) == before


def test_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
  batch = tasks_base.FixedSetTask.batch

  def poisoned(self, split, step, *args):
    out = batch(self, split, step, *args)
    if split == 'train' and step >= 22:
      out['weights'] = np.full_like(out['weights'], np.nan)
    return out

  monkeypatch.setattr(tasks_base.FixedSetTask, 'batch', poisoned)
  workdir = str(tmp_path / 'nan')
  with pytest.raises(train.TrainingDiverged, match='non-finite training metrics at step 25'):
    train.train_and_evaluate(tiny_config(), workdir)
  monkeypatch.undo()
  steps = sorted(int(s) for s in os.listdir(os.path.join(workdir, rundir.CHECKPOINT_DIR)) if s.isdigit())
  assert steps == [10, 20]
  loaded = symjax.load(workdir, 'latest')
  assert loaded.step == 20
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(loaded.params))


@pytest.fixture(scope='module')
def shakespeare_run(tmp_path_factory):
  if not os.path.isfile(SHAKESPEARE):
    pytest.skip(f'corpus not found at {SHAKESPEARE}')
  workdir = str(tmp_path_factory.mktemp('text') / 'work')
  config = tiny_config('token_factored', task='text', text_path=SHAKESPEARE, seq_len=32, eval_windows=32,
                       total_steps=20)
  config.model.max_len = 96
  train.train_and_evaluate(config, workdir)
  return workdir


def test_text_run_reloads_without_the_corpus_and_samples_every_mode(shakespeare_run, tmp_path):
  workdir = str(tmp_path / 'moved')
  shutil.copytree(shakespeare_run, workdir)  # symjax.load needs only the work directory
  loaded = symjax.load(workdir)
  assert loaded.language_model and loaded.tokenizer.kind == 'char' and len(loaded.tokenizer.vocab) == 65
  outputs = {}
  for mode in sample.MODES:
    text = sample.sample_text(loaded, 'ROMEO:', 20, mode=mode, top_k=5, top_p=0.8, seed=1)
    assert text.startswith('ROMEO:') and len(text) == len('ROMEO:') + 20
    outputs[mode] = text
  assert outputs['greedy'] == sample.sample_text(loaded, 'ROMEO:', 20, mode='greedy')
  # A prompt longer than the training windows (32) works up to model.max_len (96), then a clear error.
  long_prompt = 'To be, or not to be, that is the question: whether tis nobler in the mind'
  assert len(sample.sample_text(loaded, long_prompt, 10, mode='greedy')) == len(long_prompt) + 10
  with pytest.raises(ValueError, match=r'exceeds model.max_len = 96'):
    sample.sample_text(loaded, long_prompt, 30)


def test_sample_cli_prints_a_continuation(shakespeare_run):
  step = rundir.checkpoint_steps(shakespeare_run)[0]  # a checkpoint chosen by its step
  proc = subprocess.run([sys.executable, '-m', 'symjax.cli.sample', f'--workdir={shakespeare_run}',
                         '--prompt=KING:', '--num_tokens=12', '--mode=top_k', '--top_k=3', f'--checkpoint={step}'],
                        cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.startswith('KING:') and len(proc.stdout.rstrip('\n')) >= len('KING:') + 1


def test_checkpoint_flags_take_best_latest_or_a_step():
  assert [rundir.checkpoint_choice(t, '--checkpoint') for t in ('best', 'latest', '120')] == ['best', 'latest', 120]
  for bad in ('last', '-5', '1.5', ''):
    with pytest.raises(ValueError, match=r"--which must be 'best', 'latest' or a checkpointed step number"):
      rundir.checkpoint_choice(bad, '--which')


def test_top_k_and_top_p_filters_keep_the_right_tokens():
  logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
  top_k = np.asarray(sample.filter_logits(logits, 'top_k', 1.0, 2, 1.0))
  assert np.isfinite(top_k).tolist() == [True, True, False, False]
  top_p = np.asarray(sample.filter_logits(logits, 'top_p', 1.0, 0, 0.75))
  assert np.isfinite(top_p).tolist() == [True, True, False, False]   # 0.5 + 0.3 reaches 0.75
  top_p = np.asarray(sample.filter_logits(logits, 'top_p', 1.0, 0, 0.5))
  assert np.isfinite(top_p).tolist() == [True, False, False, False]


def test_bpe_tokenizer_round_trips_and_is_saved(tmp_path):
  from symjax.tasks.text import TextTask, tokenizer_from_json
  path = tmp_path / 'corpus.txt'
  path.write_text('the cat sat on the mat. ' * 300 + 'ünïcödé ok\n', encoding='utf-8')
  task = TextTask(str(path), seq_len=16, tokenizer='bpe', bpe_vocab_size=300)
  text = 'the mat sat on ünïcödé'
  assert task.tokenizer.decode(task.tokenizer.encode(text)) == text
  assert len(task.tokenizer.encode('the cat sat')) < len('the cat sat')  # merges happened
  again = tokenizer_from_json(json.loads(json.dumps(task.tokenizer.to_json())))
  np.testing.assert_array_equal(again.encode(text), task.tokenizer.encode(text))


def test_load_and_sample_errors(finished_run, tmp_path):
  with pytest.raises(FileNotFoundError, match='is not a symjax work directory: config.json is missing'):
    symjax.load(str(tmp_path))
  loaded = symjax.load(finished_run[0])
  with pytest.raises(ValueError, match="task 'induction' is a tagging task"):
    sample.sample_text(loaded, '<s> a', 3)
  with pytest.raises(ValueError, match=r"prompt token ids must be in \[0, 12\) \(the model's vocabulary\), got \[12\]"):
    sample.generate(loaded.model, loaded.params, [1, 12], 2)
  for temperature in (0.0, float('nan'), float('inf')):
    with pytest.raises(ValueError, match='temperature must be a finite number > 0'):
      sample.generate(loaded.model, loaded.params, [1, 4], 2, mode='temperature', temperature=temperature)
  with pytest.raises(ValueError, match=r'generate continues one prompt, a 1-D sequence of token ids; got an array '
                                       r'of shape \(2, 2\)'):
    sample.generate(loaded.model, loaded.params, [[1, 4], [2, 3]], 2)


def test_load_a_given_checkpoint_step(finished_run):
  workdir, _ = finished_run
  steps = rundir.checkpoint_steps(workdir)
  assert steps[-2:] == [30, 40]
  early, latest = symjax.load(workdir, steps[-2]), symjax.load(workdir, 'latest')
  assert (early.step, latest.step) == (30, 40)
  differ = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))),
                                        early.params, latest.params))
  assert any(differ)
  with pytest.raises(ValueError, match=r'has no checkpoint at step 7; it has steps \[.*30, 40\]'):
    symjax.load(workdir, 7)
  with pytest.raises(ValueError, match="which must be 'best', 'latest' or a checkpointed step number"):
    symjax.load(workdir, 'first')


def test_progress_bar_shows_in_notebook_kernels_and_not_in_captured_output(monkeypatch):
  import types
  assert not train.interactive_output()  # pytest captures stderr: no TTY, no kernel
  kernel_shell = types.SimpleNamespace(kernel=object())
  monkeypatch.setitem(sys.modules, 'IPython', types.SimpleNamespace(get_ipython=lambda: kernel_shell))
  assert train.interactive_output()
  monkeypatch.setitem(sys.modules, 'IPython', types.SimpleNamespace(get_ipython=lambda: None))
  assert not train.interactive_output()


def test_resume_that_cannot_continue_the_checkpoints_is_refused_and_moves_nothing(tmp_path):
  """Clipping switched off changes the optimiser state's structure: before, the good checkpoint was taken
  for corrupt, moved away, and training restarted at step 0. Another data_seed or seed would train the
  restored model on other data or keys. Each is a one-line error now, and the folder is left as it was."""
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(tiny_config(total_steps=10, grad_clip_norm=1.0), workdir)
  listing = lambda: sorted(os.listdir(workdir)) + sorted(os.listdir(os.path.join(workdir, 'checkpoints')))
  with open(os.path.join(workdir, 'config.json')) as f:
    config_before = f.read()
  before = listing()
  cases = [(dict(grad_clip_norm=0.0), r'optimiser state .*grad_clip_norm: 1\.0 -> 0\.0'),
           (dict(data_seed=7), r'other data or keys \(data_seed: 0 -> 7\)'),
           (dict(seed=3), r'other data or keys \(seed: 0 -> 3\)')]
  for overrides, message in cases:
    with pytest.raises(ValueError, match=message):
      train.train_and_evaluate(tiny_config(total_steps=20, **overrides), workdir)
    assert listing() == before and 'checkpoints_corrupt' not in before
    with open(os.path.join(workdir, 'config.json')) as f:
      assert f.read() == config_before
  # A change that the optimiser state does not depend on still resumes.
  final = train.train_and_evaluate(tiny_config(total_steps=20, grad_clip_norm=0.5), workdir)
  assert symjax.load(workdir).step == 20 and final['test']['loss'] > 0


def test_compiled_steps_are_kept_in_the_persistent_cache(tmp_path):
  cache = tmp_path / 'cache'
  env = {k: v for k, v in os.environ.items() if k != 'JAX_COMPILATION_CACHE_DIR'}
  subprocess.run([sys.executable, '-m', 'symjax.main', f'--config={REPO}/configs/symbolic.py:size=tiny',
                  '--config.total_steps=4', '--config.warmup_steps=1', '--config.eval_every_steps=2',
                  '--config.progress_bar=false', f'--config.compilation_cache_dir={cache}',
                  f'--workdir={tmp_path / "run"}'], check=True, capture_output=True, env=env, cwd=tmp_path)
  names = os.listdir(cache)
  assert any(name.startswith('jit_eval_step') for name in names), names  # quick to compile, kept all the same
  # The same command again reads every program from the cache and ends with the same metrics.
  subprocess.run([sys.executable, '-m', 'symjax.main', f'--config={REPO}/configs/symbolic.py:size=tiny',
                  '--config.total_steps=4', '--config.warmup_steps=1', '--config.eval_every_steps=2',
                  '--config.progress_bar=false', f'--config.compilation_cache_dir={cache}',
                  f'--workdir={tmp_path / "again"}'], check=True, capture_output=True, env=env, cwd=tmp_path)
  assert sorted(os.listdir(cache)) == sorted(names)  # nothing compiled anew
  final = [json.loads((tmp_path / run / rundir.FINAL_FILE).read_text()) for run in ('run', 'again')]
  assert final[0] == final[1]


def test_an_unwritable_compilation_cache_is_one_warning_and_no_cache(tmp_path, capsys):
  blocker = tmp_path / 'a_file'
  blocker.write_text('x')
  before = jax.config.jax_compilation_cache_dir  # set by an earlier run in this process, if any
  jax.config.update('jax_compilation_cache_dir', None)  # else the config's folder is not used at all
  try:
    host.use_compilation_cache(str(blocker / 'cache'))
    err = capsys.readouterr().err
    assert err.count('\n') == 1, err
    assert 'cannot be created or written (Not a directory); compiling without the persistent cache' in err
    assert not jax.config.jax_compilation_cache_dir
  finally:
    jax.config.update('jax_compilation_cache_dir', before)


def test_top_k_counts_ties_as_random_tie_breaking_and_nan_as_wrong():

  from symjax.train import metrics
  logits = jnp.array([[0.0, 0.0, 0.0, 0.0],      # uniform: the target is first with probability 1/4
                      [1.0, 3.0, 2.0, 2.0],      # target 2 ties with 3, below 1
                      [5.0, 1.0, 0.0, 0.0],      # target 0 is the argmax
                      [jnp.nan] * 4])            # a diverged model
  targets = jnp.array([0, 2, 0, 1])
  _, _, above, tied = metrics.logit_stats(logits, targets)
  np.testing.assert_allclose(metrics.in_top_k(above, tied, 1), [0.25, 0.0, 1.0, 0.0])
  np.testing.assert_allclose(metrics.in_top_k(above, tied, 2), [0.5, 0.5, 1.0, 0.0])
  np.testing.assert_allclose(metrics.in_top_k(above, tied, 3), [0.75, 1.0, 1.0, 0.0])


def test_final_metrics_are_written_atomically(tmp_path, monkeypatch):
  """final_metrics.json goes through the work directory's atomic writer, as every other run file does: a
  crash while writing it leaves the old file or none, never half a file."""
  from symjax.system import files
  written = []
  real = files.write_atomically
  monkeypatch.setattr(files, 'write_atomically', lambda path, text: (written.append(path), real(path, text))[1])
  workdir = str(tmp_path / 'w')
  train.train_and_evaluate(tiny_config(total_steps=10), workdir)
  assert os.path.join(workdir, rundir.FINAL_FILE) in written
  assert json.load(open(os.path.join(workdir, rundir.FINAL_FILE)))['step'] == 10


def test_any_error_in_the_loop_closes_the_metric_writer_and_keeps_the_checkpoints(tmp_path, monkeypatch):
  """Not only a divergence: a bug or an interrupt mid-run still finishes the checkpoints being written and
  closes the metric files, so that nothing saved is lost."""
  from symjax.tasks import base
  closed = []
  real_close = rundir.MetricWriter.close
  monkeypatch.setattr(rundir.MetricWriter, 'close', lambda self: (closed.append(1), real_close(self))[1])
  batch = base.FixedSetTask.batch

  def failing_batch(self, split, step, *args):
    if split == 'train' and step == 15:
      raise RuntimeError('a fault in the data pipeline')
    return batch(self, split, step, *args)

  monkeypatch.setattr(base.FixedSetTask, 'batch', failing_batch)
  workdir = str(tmp_path / 'w')
  with pytest.raises(RuntimeError, match='a fault in the data pipeline'):
    train.train_and_evaluate(tiny_config(), workdir)
  assert closed == [1]
  monkeypatch.undo()
  assert symjax.load(workdir, 'latest').step == 10
  records = [json.loads(l) for l in open(os.path.join(workdir, rundir.METRICS_FILE))]
  assert [r['step'] for r in records if r['split'] == 'validation'] == [10]


_CLI_DRIVER = """
import sys
from symjax.system.errors import InputError
from symjax.train import trainer
def fail(config, workdir, early=None):
  raise {error}
trainer.train_and_evaluate = fail
sys.argv = ['symjax.main', '--config=symbolic:runlocal=true', '--workdir={workdir}']
from symjax.cli import train

train.run()
"""


@pytest.mark.parametrize('error, one_line', [("InputError('config.x must be > 0, got -1')", True),
                                             ("ValueError('an internal bug')", False)])
def test_the_cli_prints_input_errors_as_one_line_and_bugs_with_their_traceback(error, one_line, tmp_path):
  driver = _CLI_DRIVER.format(error=error, workdir=tmp_path / 'w')
  proc = subprocess.run([sys.executable, '-c', driver], cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 1, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  if one_line:
    assert lines == ['error: config.x must be > 0, got -1']
  else:
    assert 'Traceback (most recent call last)' in proc.stderr and lines[-1] == 'ValueError: an internal bug'


def test_a_loaded_run_gives_its_batches_its_loss_on_text_and_decodes_one_id(shakespeare_run, finished_run):
  """The data a researcher needs from a run, from the run itself: the batches it was evaluated on, the loss
  on any text, and the tokenizer on a single id as on a list."""
  from symjax import tasks
  from symjax.system.errors import InputError
  run = symjax.load(shakespeare_run)
  assert run.tokenizer.decode(5) == run.tokenizer.decode([5]) == run.tokenizer.vocab.tokens[5]
  with pytest.raises(InputError, match=r'token ids must be in \[0, 65\)'):
    run.tokenizer.decode(65)
  batches = run.batches('validation', 2, batch_size=3)
  want = tasks.get_task(run.config).eval_batches('validation', 3, run.config.data_seed)
  for got, expected in zip(batches, [next(want), next(want)]):
    np.testing.assert_array_equal(got['inputs'], expected['inputs'])
  assert len(batches) == 2 and batches[0]['inputs'].shape == (3, run.seq_len)
  # The loss on a text is the mean cross-entropy of each next character, computed here from the logits.
  text = 'First Citizen:\nBefore we proceed'
  ids = run.tokenizer.encode(text)
  logits = np.asarray(run.model.apply({'params': run.params}, ids[None, :-1])[0], np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  want_loss = -logp[np.arange(len(ids) - 1), ids[1:]].mean()
  assert run.loss(text) == pytest.approx(want_loss, rel=1e-5) and run.loss(list(ids)) == run.loss(text)
  with pytest.raises(InputError, match='at least 2 tokens'):
    run.loss('F')
  with pytest.raises(InputError, match="split must be one of"):
    run.batches('dev')
  tagging = symjax.load(finished_run[0])
  assert tagging.tokenizer.decode(3) == tagging.tokenizer.decode([3])
  assert tagging.batches('train', 1)[0]['inputs'].shape[0] == tagging.config.batch_size
  with pytest.raises(InputError, match='is a tagging task'):
    tagging.loss([1, 2, 3])


def test_a_task_whose_inputs_never_pad_trains_without_its_all_true_key_mask(tmp_path):
  """Text windows are full, so the step functions pass attention no key mask (a fused kernel would add the
  all-true mask as a bias): the same step to float32 rounding; a step told to read the mask still does."""
  (tmp_path / 'c.txt').write_text('the quick brown fox jumps over the lazy dog. ' * 40)
  task = text_tasks.TextTask(str(tmp_path / 'c.txt'), seq_len=16)
  assert not task.pads_inputs and tasks_base.FixedSetTask.pads_inputs
  for split in tasks_base.SPLITS:
    assert task.batch(split, 0, 4, 0)['key_mask'].all()
  config = tiny_config('standard')
  assert not train.StepOptions.of(config, task).key_mask
  assert train.StepOptions.of(config).key_mask  # no task named: the mask is read

  model = Transformer(config_lib.model_config(config, len(task.vocab), causal=True))
  tx = optim.make_optimizer(config)
  state = optim.init_state(model, tx, jax.random.key(0), task.seq_len)
  batch = {k: jax.numpy.asarray(v) for k, v in task.batch('train', 0, 4, 0).items()}
  padded = dict(batch, key_mask=batch['key_mask'].at[:, :3].set(False))
  outputs = {}
  for reads_mask in (True, False):
    step, _ = train.make_steps(model, tx, train.StepOptions(key_mask=reads_mask))
    outputs[reads_mask] = [jax.jit(step)(state, b, jax.random.key(1)) for b in (batch, padded)]
  (full_masked, padded_masked), (full_unmasked, padded_unmasked) = outputs[True], outputs[False]
  # The same function; XLA may order a sum differently without the mask (a float32 ulp in a slope's moment).
  for x, y in zip(jax.tree.leaves(full_masked), jax.tree.leaves(full_unmasked)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-7)
  assert float(padded_masked[1]['loss']) != float(padded_unmasked[1]['loss'])


def _compiled_tiny_run(tmp_path, kind='symbolic'):
  config = tiny_config(kind)
  s = train.setup(config_lib.validate(config), [(str(tmp_path), config)])
  mesh = mesh_lib.make_mesh(1, 1, config.batch_size)
  with jax.set_mesh(mesh):
    run = train.compile_run(s.model, s.tx, train.StepOptions.of(config, s.task), jax.random.key(config.seed), mesh,
                            (), s.task.seq_len)
  return config, s, mesh, run


def test_the_initialiser_traced_once_gives_the_state_of_the_model_initialised_directly():
  """``compile_run``'s init replays the one trace that gave the state's shapes: the same arrays, bit for bit,
  as initialising the model and optimiser directly, for each kind."""
  for kind in ('standard', 'symbolic'):
    config = tiny_config(kind)
    model = Transformer(config_lib.model_config(config, 12, causal=True))
    tx = optim.make_optimizer(config)
    mesh = mesh_lib.make_mesh(1, 1, config.batch_size)
    with jax.set_mesh(mesh):
      run = train.compile_run(model, tx, train.StepOptions(), jax.random.key(0), mesh, (), 8)
      got = run.init(jax.random.key(7))
    want = jax.jit(lambda k: nn.meta.unbox(optim.init_state(model, tx, k, 8)))(jax.random.key(7))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert_trees_equal(got, want)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), run.abstract_state) == jax.tree.map(
        lambda a: (a.shape, a.dtype), got)


def test_importing_the_trainer_leaves_orbax_tensorstore_and_tensorboardx_for_later():
  """A run that starts from nothing needs none of them before its first save or record."""
  code = ('import sys, symjax.train.trainer, symjax.cli.train\n'
          "print(sorted(m for m in ('orbax.checkpoint', 'tensorstore', 'tensorboardX') if m in sys.modules))")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True, cwd=REPO)
  assert out.stdout.strip() == '[]'




def test_the_batches_of_a_run_are_every_batch_its_evaluation_scores(finished_run):
  """``run.batches(split)`` is every batch the run's validation metrics were computed on: the weighted
  cross-entropy of the final parameters over them is the loss final_metrics.json reports."""
  from symjax import tasks
  workdir, final = finished_run
  run = symjax.load(workdir, 'latest')
  batches = run.batches('validation')
  task = tasks.get_task(run.config)
  assert len(batches) == len(list(task.eval_batches('validation', run.config.batch_size, run.config.data_seed))) > 1
  nll = weight = 0.0
  for b in batches:
    logits = np.asarray(run.model.apply({'params': run.params}, b['inputs'], b['key_mask']), np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    token_nll = -np.take_along_axis(logp, b['targets'][..., None], -1)[..., 0]
    nll += float((token_nll * b['weights']).sum())
    weight += float(b['weights'].sum())
  assert nll / weight == pytest.approx(final['validation']['loss'], rel=1e-4)
  assert len(run.batches('validation', n=1)) == 1 and len(run.batches('train')) == 4


def test_a_runs_evaluate_gives_its_own_validation_metrics_and_takes_hooks(finished_run):
  """``run.evaluate(split)`` scores exactly the run's batches as the trainer does: its final validation
  metrics; a hook that zeroes a head raises the loss, the same under TransformerLens's name and written
  inline; a site the model lacks is a one-line error."""
  from symjax.interpret import hooks as hooks_lib
  from symjax.system.errors import InputError
  workdir, final = finished_run
  run = symjax.load(workdir, 'latest')
  got = run.evaluate('validation')
  assert got.keys() == final['validation'].keys()
  for k, v in final['validation'].items():
    assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
  zeroed = run.evaluate('validation', hooks={'blocks.1.attn.hook_z': hooks_lib.zero_head(0)})
  assert zeroed['loss'] - got['loss'] > 1e-3
  inline = run.evaluate('validation', hooks={'blocks.1.attn.z': lambda v, name: hooks_lib.zero_head(0)(v, name)})
  assert inline['loss'] == pytest.approx(zeroed['loss'], rel=1e-6)
  with pytest.raises(InputError, match="'blocks.9.attn.z' is not one of this model's sites"):
    run.evaluate(hooks={'blocks.9.attn.z': hooks_lib.zero_head(0)})
