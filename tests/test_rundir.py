"""The work directory: it keeps describing what is in it across resumes, failures and damage."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import DAMAGE, REPO, TOTAL_STEPS, damage, tiny_config

import symjax
import symjax.configs as configs
from symjax.run import workdir as rundir
from symjax.tasks import base as tasks_base
from symjax.train import config as config_lib
from symjax.train import trainer as train

pytestmark = pytest.mark.slow  # end to end: every test here trains or runs a command

CLI = [sys.executable, '-m', 'symjax.main', '--config=configs/symbolic.py:size=tiny', '--config.total_steps=20',
       '--config.warmup_steps=2', '--config.eval_every_steps=10', '--config.keep_checkpoints=2']


def records(workdir):
  with open(os.path.join(workdir, rundir.METRICS_FILE)) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope='module')
def half_run(tmp_path_factory):
  """A tiny run stopped at step 20 of 40, with metrics written up to step 25 (as a run killed after its
  step-20 checkpoint but before the next one leaves them)."""
  workdir = str(tmp_path_factory.mktemp('half') / 'work')
  train.train_and_evaluate(tiny_config(total_steps=20), workdir)
  return workdir


def test_load_turns_on_the_runs_compilation_cache_unless_the_process_has_one(half_run, tmp_path):
  """A fresh process that loads a run compiles into the run's ``compilation_cache_dir`` (the default under
  HOME here); a cache folder the user chose through JAX wins."""
  script = f'import jax, symjax\nsymjax.load({half_run!r})\nprint(jax.config.jax_compilation_cache_dir)'
  env = {k: v for k, v in os.environ.items() if not k.startswith('JAX_COMPILATION_CACHE')}
  env['HOME'] = str(tmp_path)
  with open(os.path.join(half_run, 'config.json')) as f:
    assert json.load(f)['compilation_cache_dir'] == '~/.cache/symjax/jax'
  ran = subprocess.run([sys.executable, '-c', script], cwd=REPO, capture_output=True, text=True, env=env)
  assert ran.returncode == 0, ran.stderr[-2000:]
  assert ran.stdout.strip() == str(tmp_path / '.cache' / 'symjax' / 'jax')
  ran = subprocess.run([sys.executable, '-c', script], cwd=REPO, capture_output=True, text=True,
                       env={**env, 'JAX_COMPILATION_CACHE_DIR': str(tmp_path / 'mine')})
  assert ran.returncode == 0 and ran.stdout.strip() == str(tmp_path / 'mine'), ran.stderr[-2000:]


def test_a_resume_keeps_each_step_once_in_the_metrics_log(half_run, tmp_path, capsys):
  workdir = str(tmp_path / 'w')
  shutil.copytree(half_run, workdir)
  with open(os.path.join(workdir, rundir.METRICS_FILE), 'a') as f:  # replayed by the resume
    f.write('# a note someone added\n')  # not a record: kept aside, not dropped
    f.write(json.dumps({'step': 25, 'split': 'train', 'loss': 1.0}) + '\n')
    f.write(json.dumps({'step': 30, 'split': 'validation', 'loss': 1.0}) + '\n')  # never checkpointed
    f.write('{"step": 35, "spl')  # a kill -9 in the middle of a write
  train.train_and_evaluate(tiny_config(), workdir)
  assert open(os.path.join(workdir, rundir.METRICS_FILE + rundir.UNREADABLE_SUFFIX)).read() == (
      '# a note someone added\n')
  assert 'WARNING: 1 line(s) of' in capsys.readouterr().err
  rows = records(workdir)
  keys = [(r['step'], r['split']) for r in rows]
  assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
  assert [r['step'] for r in rows if r['split'] == 'train'] == list(range(5, TOTAL_STEPS + 1, 5))
  assert [r['step'] for r in rows if r['split'] == 'validation'] == [10, 20, 30, 40]
  assert [r['step'] for r in rows if r['split'] == 'test'] == [TOTAL_STEPS]  # the step-20 end was replaced
  assert all(isinstance(r['time'], float) for r in rows)


def test_a_failed_resume_leaves_the_run_files_and_the_history_records_each_config(half_run, tmp_path, monkeypatch):
  workdir = str(tmp_path / 'w')
  shutil.copytree(half_run, workdir)
  before = open(os.path.join(workdir, rundir.CONFIG_FILE)).read()
  # Diverges at once (NaN loss weights from the first resumed step on; a non-finite learning rate is
  # refused before anything starts): nothing new is checkpointed, so config.json must still describe the
  # checkpoints.
  batch = tasks_base.FixedSetTask.batch

  def poisoned(self, split, step, *args):
    out = batch(self, split, step, *args)
    if split == 'train':
      out['weights'] = np.full_like(out['weights'], np.nan)
    return out

  monkeypatch.setattr(tasks_base.FixedSetTask, 'batch', poisoned)
  with pytest.raises(train.TrainingDiverged):
    train.train_and_evaluate(tiny_config(learning_rate=5e-3), workdir)
  monkeypatch.undo()
  assert open(os.path.join(workdir, rundir.CONFIG_FILE)).read() == before
  train.train_and_evaluate(tiny_config(learning_rate=2e-3), workdir)
  with open(os.path.join(workdir, rundir.CONFIG_HISTORY_FILE)) as f:
    history = [json.loads(line) for line in f]
  assert [(h['from_step'], h['config']['learning_rate'], h['config']['total_steps']) for h in history] == [
      (0, tiny_config().learning_rate, 20), (20, 2e-3, TOTAL_STEPS)]
  assert json.load(open(os.path.join(workdir, rundir.CONFIG_FILE)))['learning_rate'] == 2e-3


@pytest.mark.parametrize('name, content, message', [
    (rundir.CONFIG_FILE, '{"task": "induc', r'config.json\' is not valid JSON \(.*\); symjax writes it in one '
     r'piece, so it was changed or damaged after it was written; the "config" of the last line of '
     r'config_history.jsonl is the same config'),
    (rundir.RUN_FILE, '[1, 2]', r"run.json' holds a JSON list, not an object"),
    ('vocab.json', b'\xff\xfe', r"vocab.json' is not valid JSON \('utf-8' codec can't decode"),
])
def test_a_damaged_run_file_is_named_and_nothing_is_moved(half_run, tmp_path, name, content, message):
  workdir = str(tmp_path / 'w')
  shutil.copytree(half_run, workdir)
  with open(os.path.join(workdir, name), 'wb') as f:
    f.write(content if isinstance(content, bytes) else content.encode())
  before = sorted(glob.glob(os.path.join(workdir, '**'), recursive=True))
  with pytest.raises(ValueError, match=message):
    symjax.load(workdir)
  if name != 'vocab.json':  # a resume of a built-in task reads no vocab.json (it writes it anew)
    with pytest.raises(ValueError, match=message):
      train.train_and_evaluate(tiny_config(), workdir)
  assert sorted(glob.glob(os.path.join(workdir, '**'), recursive=True)) == before
  assert rundir.checkpoint_steps(workdir) == [10, 20]


def test_the_best_checkpoint_survives_a_resume(tmp_path):
  """keep_checkpoints=1: after a restart, the best step must still be known (its metrics are stored with
  it) and kept, however much worse the later steps are."""
  workdir = str(tmp_path / 'w')
  config = tiny_config(keep_checkpoints=1)
  assert config.best_metric == 'accuracy'
  state = {'x': np.zeros(3)}
  manager = rundir.checkpoint_manager(workdir, config.keep_checkpoints, config.best_metric)
  for step, accuracy in ((10, 0.2), (20, 0.9), (30, 0.5)):
    manager.save(step, args=ocp.args.StandardSave(state), metrics={'accuracy': accuracy})
  manager.wait_until_finished()
  manager.close()
  assert rundir.checkpoint_steps(workdir) == [20, 30]
  manager = rundir.checkpoint_manager(workdir, config.keep_checkpoints, config.best_metric)  # a resumed run
  for step, accuracy in ((40, 0.1), (50, 0.0)):
    manager.save(step, args=ocp.args.StandardSave(state), metrics={'accuracy': accuracy})
  manager.wait_until_finished()
  manager.close()
  assert rundir.checkpoint_steps(workdir) == [20, 50]
  assert rundir.best_step(workdir, config.best_metric) == 20


def test_run_files_without_a_checkpoint_start_a_new_run(tmp_path, capsys):
  workdir = str(tmp_path / 'w')
  os.makedirs(workdir)
  bad = tiny_config()
  bad.model.num_heads = 4
  model_config = config_lib.model_config(bad, 12, True)
  with open(os.path.join(workdir, rundir.RUN_FILE), 'w') as f:
    json.dump({'model': model_config.flat()}, f)
  final = train.train_and_evaluate(tiny_config(total_steps=10, eval_every_steps=10), workdir)
  assert 'no checkpoint; starting a new run there' in capsys.readouterr().out
  assert final['test']['loss'] > 0
  assert json.load(open(os.path.join(workdir, rundir.RUN_FILE)))['model']['num_heads'] == 2


def test_every_checkpoint_corrupt_is_said_once_in_lines_of_its_own(tmp_path):
  """The command line: each corrupt checkpoint one warning line, then one line saying training starts
  again from step 0, and no Orbax or asyncio traceback; loading a good run prints nothing on stderr."""
  workdir = str(tmp_path / 'w')
  first = subprocess.run(CLI + [f'--workdir={workdir}'], cwd=REPO, capture_output=True, text=True)
  assert first.returncode == 0, first.stderr[-2000:]
  # Output is a pipe, not a terminal: one progress line per logged step instead of a progress bar.
  progress = [l for l in first.stdout.splitlines() if re.fullmatch(r'step \d+/20: loss \d+\.\d{4}, [\d,]+ tokens/s, '
                                                                    r'\d+\.\d s', l)]
  assert progress and progress[-1].startswith('step 20/20: '), first.stdout[-2000:]
  load = subprocess.run([sys.executable, '-c', f'import symjax; print(symjax.load({workdir!r}).step)'],
                        cwd=REPO, capture_output=True, text=True)
  assert load.returncode == 0 and load.stdout.strip() == '20' and load.stderr == '', load.stderr[-2000:]
  steps = rundir.checkpoint_steps(workdir)
  assert steps == [10, 20]
  for path in glob.glob(os.path.join(workdir, rundir.CHECKPOINT_DIR, '*', 'default', '**', '*'), recursive=True):
    if os.path.isfile(path):
      with open(path, 'wb') as f:
        f.write(b'not a checkpoint')
  again = subprocess.run(CLI + [f'--workdir={workdir}'], cwd=REPO, capture_output=True, text=True)
  assert again.returncode == 0, again.stderr[-2000:]
  lines = again.stderr.strip().splitlines()
  assert len(lines) == 3 and all(l.startswith('WARNING: ') for l in lines), again.stderr[-3000:]
  assert lines[0].startswith('WARNING: checkpoint at step 20 is corrupt') and lines[0].endswith('trying step 10')
  assert lines[1].startswith('WARNING: checkpoint at step 10 is corrupt')
  assert lines[1].endswith('no other checkpoint is left')
  assert 'falling back' not in again.stderr
  assert lines[2] == f"WARNING: no checkpoint in {workdir!r} could be restored; training starts again from step 0"
  assert sorted(os.listdir(os.path.join(workdir, rundir.CORRUPT_DIR)))[0].startswith('10_')
  assert symjax.load(workdir).step == 20


@pytest.mark.parametrize('args, status, message', [
    (['--config=configs/symbolic.py:size=tiny', '--workdir=/proc/x'], 1,
     r"work directory '/proc/x' cannot be created or written \(No such file or directory\)"),
    (['--config=configs/symbolic.py:size=tiny', f'--workdir={os.path.join(REPO, "README.md", "sub")}'], 1,
     r'cannot be created or written \(Not a directory\)'),
    (['--config=configs/symbolic.py', '--config.nonexistent_field=1'], 2,
     r"--config.nonexistent_field: the config has no field 'nonexistent_field'; fields of the config: \[.*'batch_size'"),  # noqa: E501
    (['--config=configs/symbolic.py', '--config.model.nope=1'], 2,
     r"--config.model.nope: the config has no field 'nope'; fields of config.model: \[.*'num_heads'"),
    (['--config=configs/nope.py'], 2, r"config 'configs/nope.py' is neither a file nor a recipe; recipes: \['align', "),
    (['--config=nope'], 2, r"config 'nope' is neither a file nor a recipe; recipes: \[.*'symbolic', 'token_factored'\]"),  # noqa: E501
    ([], 2, r'--config is required: a recipe name or the path of a config file, e\.g\. --config=symbolic'),
    (['--config=symbolic:size=huge'], 2,
     r"--config=symbolic:size=huge: size must be one of \['tiny', 'small', 'medium', 'paper'\], got 'huge'"),
    (['--config=configs/symbolic.py:size=tiny', '--config.distributed.num_processes=2', '--workdir={tmp}/w'], 1,
     r'config.distributed.num_processes = 2 but no coordinator was given or detected: set '
     r'config.distributed.coordinator_address'),
    (['--config=configs/symbolic.py:size=huge'], 2,
     r"--config=configs/symbolic.py:size=huge: size must be one of \['tiny', 'small', 'medium', 'paper'\], got 'huge'"),
    (['--config=configs/symbolic.py:sise=tiny'], 2, r"unknown config argument 'sise'; known keys: \['program', 'runlocal', 'size', 'task'\]"),  # noqa: E501
    (['--config=configs/symbolic.py', '--config.total_steps=abc'], 2, r'--config.total_steps=abc: invalid literal'),
    (['--config={syntax}'], 2, r"has a syntax error at line 1: invalid syntax"),
])
def test_command_line_mistakes_are_one_line_errors(args, status, message, tmp_path):
  syntax = tmp_path / 'broken.py'
  syntax.write_text('def get_config(:\n  pass\n')
  args = [a.format(syntax=syntax, tmp=tmp_path) for a in args]
  env = {k: v for k, v in os.environ.items() if k != 'JAX_COORDINATOR_ADDRESS'}
  proc = subprocess.run([sys.executable, '-m', 'symjax.main', *args], cwd=REPO, capture_output=True, text=True,
                        env=env)
  assert proc.returncode == status, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), proc.stderr[-2000:]
  assert re.search(message, lines[0]), lines[0]


def test_the_default_work_directory_is_the_same_for_the_same_command():
  from symjax.cli import train as main
  name = lambda *argv: main.default_workdir(argv[0].split('=', 1)[1], list(argv))
  assert name('--config=configs/symbolic.py') == os.path.join('runs', 'symbolic')
  assert name('--config=symbolic') == name('--config=configs/symbolic.py')  # a recipe's name or its file
  assert name('--config=configs/rasp.py:task=sort,model=standard') == os.path.join('runs', 'rasp_task-sort_model-standard')  # noqa: E501
  a = name('--config=configs/symbolic.py', '--config.total_steps=50', '--config.seed=1')
  assert a == name('--config=configs/symbolic.py', '--config.seed=1', '--config.total_steps=50')  # order-free
  assert a != name('--config=configs/symbolic.py', '--config.seed=2', '--config.total_steps=50')
  assert a.startswith(os.path.join('runs', 'symbolic_')) and len(os.path.basename(a)) == len('symbolic_') + 8


def test_overriding_the_window_moves_max_len_unless_it_is_set_too():
  config = configs.from_file('standard:task=text')
  assert (config.seq_len, config.model.max_len) == (64, 256)
  config.seq_len = 16  # what --config.seq_len=16 does
  assert config.model.max_len == 64
  config.model.max_len = 100  # an explicit --config.model.max_len wins
  config.seq_len = 32
  assert config.model.max_len == 100


@pytest.mark.parametrize('spec', ['configs/symbolic.py:runlocal=true', 'configs/standard.py:task=induction,runlocal=true',  # noqa: E501
                                  'configs/token_factored.py:runlocal=true',
                                  'configs/rasp.py:task=sort,model=token_factored,runlocal=true',
                                  'configs/fol.py:model=lstm,runlocal=true',
                                  'configs/graph.py:model=standard,runlocal=true'])
def test_every_config_file_has_a_seconds_long_runlocal_version(spec, tmp_path):
  config = configs.from_file(spec)
  full = configs.from_file(spec.replace('runlocal=true', 'runlocal=false'))
  assert (config.total_steps, config.eval_every_steps, config.keep_checkpoints) == (20, 10, 1)
  assert config.model.num_layers <= full.model.num_layers and config.task == full.task
  assert config.model.kind == full.model.kind and config.total_steps < full.total_steps
  final = train.train_and_evaluate(config, str(tmp_path / 'w'))
  assert np.isfinite(final['test']['loss'])


def test_config_files_are_the_recipes_they_document():
  rasp = configs.from_file('configs/rasp.py:task=dyck2,model=standard')
  assert (rasp.task, rasp.model.kind, rasp.model.num_layers, rasp.model.max_len, rasp.total_steps) == (
      'dyck2', 'standard', 3, 16, 3000)
  fol = configs.from_file('configs/fol.py:model=symbolic,glyphs=true')
  assert (fol.task, fol.top_ks, fol.best_metric, fol.numeral_glyph_init) == ('fol', (5, 10), 'loss', True)
  with pytest.raises(ValueError, match=r"task must be one of \['reverse', 'sort'"):
    configs.from_file('configs/rasp.py:task=copy')
  with pytest.raises(FileNotFoundError, match="config 'configs/nope.py' is neither a file nor a recipe"):
    configs.from_file('configs/nope.py')


def test_a_read_only_file_system_is_a_one_line_error(tmp_path, monkeypatch):
  """A read-only mount cannot be made here without privileges; the error it raises (EROFS) can."""
  import errno

  from symjax.cli import train as main

  def read_only(path, *args, **kwargs):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

  monkeypatch.setattr(main.os, 'makedirs', read_only)
  with pytest.raises(ValueError, match=r"work directory '.*w' cannot be created or written \(Read-only file "
                                       r"system\); give --workdir a folder you can write"):
    main.check_workdir(str(tmp_path / 'w'))


def test_workdir_check_leaves_other_processes_probes_alone(tmp_path):
  """The processes of a multi-process run check one shared work directory at the same time; one process's
  check must neither touch another's probe file nor fail because another removed its own."""
  from symjax.cli import train as main
  workdir = tmp_path / 'w'
  workdir.mkdir()
  others = [workdir / '.symjax_write_test', workdir / '.symjax_write_test_other']
  for other in others:
    other.write_text('another process is writing this')
  for _ in range(3):
    main.check_workdir(str(workdir))
  assert sorted(p.name for p in workdir.iterdir()) == sorted(p.name for p in others)
  assert all(p.read_text() == 'another process is writing this' for p in others)


def test_a_resume_on_changed_data_is_refused_and_a_token_folder_of_the_same_text_resumes(tmp_path, capsys):
  """run.json records the token stream's length and hash; the folder of the same text gives the same ids."""
  from symjax.tasks import text
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text(''.join(f'line {i} of the corpus, word {i * 7 % 13}\n' for i in range(400)))
  config = lambda **kw: tiny_config('standard', task='text', seq_len=16, eval_windows=8, **{'total_steps': 20, **kw})
  workdir = str(tmp_path / 'w')
  train.train_and_evaluate(config(text_path=str(corpus)), workdir)
  saved = json.load(open(os.path.join(workdir, rundir.RUN_FILE)))['data']
  assert saved['tokens'] == len(corpus.read_text()) and len(saved['sha256']) == 64
  text.write_token_file(str(corpus), str(tmp_path / 'tokens'))
  corpus.write_text(corpus.read_text().replace('word 3', 'word 4'))  # same characters, other text
  before = sorted(glob.glob(os.path.join(workdir, '**'), recursive=True))
  with pytest.raises(ValueError, match=r"was trained on other data: its run.json records 12,382 tokens \(sha256 "
                                       r"[0-9a-f]{12}\.\.\.\), the corpus this config reads gives 12,382 \(sha256"):
    train.train_and_evaluate(config(text_path=str(corpus), total_steps=30), workdir)
  assert sorted(glob.glob(os.path.join(workdir, '**'), recursive=True)) == before
  capsys.readouterr()
  train.train_and_evaluate(config(token_path=str(tmp_path / 'tokens'), total_steps=30), workdir)
  assert 'resuming from step 20' in capsys.readouterr().out
  assert rundir.checkpoint_steps(workdir)[-1] == 30


def test_each_kind_of_damage_is_found_before_orbax_and_load_says_it_in_one_line(half_run, tmp_path):
  """``read_every_array`` fails on every kind of damage (so Orbax is never handed a damaged checkpoint and
  leaves no reads in flight) and passes an intact checkpoint; ``symjax.load`` of each damaged folder, all in
  one process, prints one warning line per folder and nothing else, and loads the step before."""
  assert rundir.checkpoint_steps(half_run) == [10, 20]
  rundir.read_every_array(half_run, 20)  # intact: no error
  workdirs = []
  for kind in DAMAGE:
    workdir = str(tmp_path / kind)
    shutil.copytree(half_run, workdir)
    assert damage(os.path.join(workdir, rundir.CHECKPOINT_DIR, '20'), kind) > 0
    with pytest.raises(ValueError, match=r'does not read'):
      rundir.read_every_array(workdir, 20)
    rundir.read_every_array(workdir, 10)
    workdirs.append(workdir)
  script = f'import symjax\nfor w in {workdirs!r}:\n  print(symjax.load(w, "latest").step)'
  proc = subprocess.run([sys.executable, '-c', script], cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ['10'] * len(DAMAGE)
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == len(DAMAGE), proc.stderr[-3000:]
  assert all(l.startswith('WARNING: checkpoint at step 20 is corrupt or partial') and l.endswith('trying step 10')
             for l in lines), proc.stderr[-3000:]


def test_the_metric_writer_does_not_import_pytorch(tmp_path):
  """tensorboardX imports PyTorch wherever it is installed; the trainer's writer must not pay for it. A
  stand-in `torch` package on the path fails loudly if anything imports it."""
  fake = tmp_path / 'site' / 'torch'
  fake.mkdir(parents=True)
  (fake / '__init__.py').write_text('raise RuntimeError("torch was imported")\n')
  (tmp_path / 'w').mkdir()
  code = ("import sys; from symjax.run import workdir as rundir\n"
          f"w = rundir.MetricWriter({str(tmp_path / 'w')!r}, resume_step=0)\n"
          "w.write(1, 'train', {'loss': 1.0}); w.close()\n"
          "assert 'torch' not in sys.modules\n"
          "print(len(open(w.jsonl.name).readlines()))\n")
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(tmp_path / 'site'), os.environ.get('PYTHONPATH', '')])}
  proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env, cwd=REPO)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip() == '1'
  assert glob.glob(str(tmp_path / 'w' / 'tensorboard' / 'events.out.tfevents.*'))


def test_a_second_run_on_a_held_work_directory_refuses_in_one_line_and_leaves_it_untouched(tmp_path, capsys):
  """While one run holds a folder, another refuses at once, naming the holder, and writes nothing there; a
  lock left by a process that no longer holds it is taken over with a note."""
  from symjax.run import lock
  workdir = str(tmp_path / 'run')
  config = tiny_config(total_steps=10)
  train.train_and_evaluate(config, workdir)
  listing = lambda: sorted((p, os.path.getmtime(p), os.path.getsize(p))   # all but the lock file itself
                           for p in glob.glob(os.path.join(workdir, '**'), recursive=True)
                           if not p.endswith(lock.LOCK_FILE))
  before = listing()
  with lock.owned(workdir):   # the first run, still going
    with pytest.raises(lock.WorkdirBusy) as e:
      train.train_and_evaluate(tiny_config(total_steps=20, learning_rate=1e-3), workdir)
    held = listing()
  message = str(e.value)
  assert '\n' not in message and f'process {os.getpid()} on ' in message and 'started 20' in message, message
  assert held == before, 'the refused run wrote into the folder'
  # A lock file naming a process that died (no lock held on it): taken over, with a note.
  with open(os.path.join(workdir, lock.LOCK_FILE), 'w') as f:
    json.dump({'pid': 999999, 'host': 'elsewhere', 'started': '2026-01-01T00:00:00'}, f)
  capsys.readouterr()
  with lock.owned(workdir):
    pass
  note = capsys.readouterr().err
  assert note.count('\n') == 1 and 'taking over' in note and 'process 999999 on elsewhere' in note, note
  with open(os.path.join(workdir, lock.LOCK_FILE)) as f:
    assert f.read() == ''  # a run that ended leaves nothing to take over
