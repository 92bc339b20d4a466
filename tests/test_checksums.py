"""Damage that still decodes: one flipped byte in any file of a checkpoint is found by its checksums before
the checkpoint is restored, and non-finite values never replace what a run saved."""

import json
import os
import re
import shutil
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import REPO, assert_trees_equal, params_of, tiny_config

from symjax.run import checksums
from symjax.run import workdir as rundir
from symjax.system.errors import TrainingDiverged
from symjax.tasks import base as tasks_base
from symjax.train import trainer as train

pytestmark = pytest.mark.slow  # end to end: every test here trains or loads runs

STEPS = 20  # checkpoints at 10 and 20


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """One finished tiny symbolic run with checkpoints at steps 10 and 20."""
  workdir = str(tmp_path_factory.mktemp('run') / 'work')
  train.train_and_evaluate(tiny_config(total_steps=STEPS), workdir)
  assert rundir.checkpoint_steps(workdir) == [10, STEPS]
  return workdir


def checkpoint_files(workdir, step=STEPS):
  folder = os.path.join(workdir, rundir.CHECKPOINT_DIR, str(step))
  return sorted(os.path.relpath(os.path.join(root, n), folder) for root, _, names in os.walk(folder) for n in names)


def flip(path):
  """Changes one byte in the middle of the file at ``path``."""
  with open(path, 'rb') as f:
    data = bytearray(f.read())
  data[len(data) // 2] ^= 0x01
  with open(path, 'wb') as f:
    f.write(data)


def flipped_copy(run, tmp_path, rel):
  workdir = str(tmp_path / rel.replace('/', '_'))
  shutil.copytree(run, workdir)
  flip(os.path.join(workdir, rundir.CHECKPOINT_DIR, str(STEPS), rel))
  return workdir


def without_checksums(workdir):
  """Turns every checkpoint of ``workdir`` into what symjax wrote before it kept checksums: the same files
  without checksums.json, and no custom metadata."""
  for step in rundir.checkpoint_steps(workdir):
    folder = os.path.join(workdir, rundir.CHECKPOINT_DIR, str(step))
    os.remove(os.path.join(folder, checksums.MANIFEST))
    path = os.path.join(folder, checksums.STEP_METADATA)
    meta = json.load(open(path))
    meta['custom_metadata'] = {}
    with open(path, 'w') as f:
      json.dump(meta, f)


def test_every_file_of_a_checkpoint_is_in_its_manifest_and_an_intact_one_verifies(run):
  files = checkpoint_files(run)
  listed = json.load(open(os.path.join(run, rundir.CHECKPOINT_DIR, str(STEPS), checksums.MANIFEST)))['files']
  assert set(files) == set(listed) | {checksums.MANIFEST, checksums.COMMIT_MARKER}
  assert any(f.startswith('default/ocdbt.process_0/d/') for f in listed)  # the arrays' data
  assert 'metrics/metrics' in listed and 'default/_METADATA' in listed
  for step in rundir.checkpoint_steps(run):
    assert checksums.verify(os.path.join(run, rundir.CHECKPOINT_DIR, str(step)))


def one_of_each_kind(files):
  """The files of a checkpoint, one of each kind: Orbax names its array data blocks by their hash
  (``default/ocdbt.process_0/d/<hash>``), and a block stands for every other."""
  kinds = {}
  for rel in files:
    kinds.setdefault(re.sub(r'/d/[0-9a-f]+$', '/d/*', rel), rel)
  return sorted(kinds.values())


def test_one_flipped_byte_in_any_file_of_the_latest_checkpoint_falls_back_with_one_line(run, tmp_path, capsys):
  """A file of each kind in turn (array data, Orbax's metadata, the stored metrics, the manifest itself): the
  rerun of the finished command warns once, sets the checkpoint aside, retrains from step 10 and ends with the
  parameters of the undamaged run. (Every file, data blocks and all, is found damaged by the check that comes
  before: ``test_load_finds_a_flipped_byte_in_any_file_and_loads_the_step_before``.)"""
  reference = params_of(run)
  every = checkpoint_files(run)
  files = one_of_each_kind(every)
  assert 10 <= len(files) < len(every)
  for rel in files:
    workdir = flipped_copy(run, tmp_path, rel)
    train.train_and_evaluate(tiny_config(total_steps=STEPS), workdir)
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f'WARNING: checkpoint at step {STEPS} is corrupt or partial'), \
        (rel, out.err[-2000:])
    assert 'resuming from step 10' in out.out, rel
    moved = os.listdir(os.path.join(workdir, rundir.CORRUPT_DIR))
    assert len(moved) == 1 and moved[0].startswith(f'{STEPS}_'), rel
    assert_trees_equal(params_of(workdir), reference)


def test_load_finds_a_flipped_byte_in_any_file_and_loads_the_step_before(run, tmp_path):
  files = checkpoint_files(run)
  workdirs = [flipped_copy(run, tmp_path, rel) for rel in files]
  script = (f'import symjax\nfor w in {workdirs!r}:\n'
            f'  print(symjax.load(w, "latest").step)')
  proc = subprocess.run([sys.executable, '-c', script], cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ['10'] * len(files)
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == len(files), proc.stderr[-3000:]
  assert all(l.startswith(f'WARNING: checkpoint at step {STEPS} is corrupt or partial') for l in lines), proc.stderr
  assert not os.path.exists(os.path.join(workdirs[0], rundir.CORRUPT_DIR))  # load moves nothing


def test_a_deleted_manifest_is_damage_not_an_old_checkpoint(run, tmp_path):
  workdir = str(tmp_path / 'w')
  shutil.copytree(run, workdir)
  os.remove(os.path.join(workdir, rundir.CHECKPOINT_DIR, str(STEPS), checksums.MANIFEST))
  with pytest.raises(checksums.ChecksumError, match='its checksums.json is missing'):
    checksums.verify(os.path.join(workdir, rundir.CHECKPOINT_DIR, str(STEPS)))


def test_the_manifest_covers_the_step_metadata_orbax_updates_from_its_own_thread(tmp_path, monkeypatch):
  """Orbax updates a checkpoint's step metadata from a thread of its own and waits for it only at the rename.
  Here that update is held until something waits for Orbax's metadata writes, so a manifest written without
  waiting reads the file before the update (or half-written) and the checkpoint fails its own checksum."""
  from orbax.checkpoint._src.metadata import checkpoint as orbax_metadata
  store = orbax_metadata._NonBlockingMetadataStore
  update, update_and_log, wait = store.update, store._update_and_log, store.wait_until_finished
  held = {}

  def held_update(self, file_path, **kwargs):
    if checksums.TMP_SUFFIX in str(file_path):
      held[str(file_path)] = threading.Event()
    return update(self, file_path, **kwargs)

  def held_update_and_log(self, file, **kwargs):
    if str(file) in held:
      held[str(file)].wait(timeout=120)  # a bound, so that a broken wait fails the test rather than hangs
    return update_and_log(self, file, **kwargs)

  def releasing_wait(self):
    for event in list(held.values()):
      event.set()
    return wait(self)

  monkeypatch.setattr(store, 'update', held_update)
  monkeypatch.setattr(store, '_update_and_log', held_update_and_log)
  monkeypatch.setattr(store, 'wait_until_finished', releasing_wait)
  workdir = str(tmp_path / 'work')
  train.train_and_evaluate(tiny_config(total_steps=10), workdir)
  assert held, 'no step-metadata update was held: the test no longer reaches Orbax\'s metadata thread'
  folder = os.path.join(workdir, rundir.CHECKPOINT_DIR, '10')
  assert checksums.written_with_checksums(folder)
  assert checksums.verify(folder)


def test_checkpoints_written_before_checksums_restore_and_say_so_once(run, tmp_path, capsys):
  workdir = str(tmp_path / 'old')
  shutil.copytree(run, workdir)
  without_checksums(workdir)
  assert not checksums.verify(os.path.join(workdir, rundir.CHECKPOINT_DIR, str(STEPS)))
  script = f'import symjax\nprint(symjax.load({workdir!r}, "latest").step)\nprint(symjax.load({workdir!r}, 10).step)'
  proc = subprocess.run([sys.executable, '-c', script], cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 0 and proc.stdout.split() == [str(STEPS), '10'], proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines() == [
      f'note: checkpoints in {workdir!r} were written without checksums (by an earlier symjax); they are restored '
      f'unverified']
  assert_trees_equal(params_of(workdir), params_of(run))
  # The trainer resumes them too, and the checkpoints it writes from then on carry checksums.
  train.train_and_evaluate(tiny_config(total_steps=30), workdir)
  assert 'resuming from step 20' in capsys.readouterr().out
  assert checksums.verify(os.path.join(workdir, rundir.CHECKPOINT_DIR, '30'))


def test_non_finite_values_restored_are_damage_and_final_metrics_are_not_replaced(run, tmp_path, monkeypatch, capsys):
  """A checkpoint without checksums whose parameters went non-finite on disk: the evaluation-only rerun sets
  it aside and retrains from the step before, so final_metrics.json keeps finite values."""
  workdir = str(tmp_path / 'nan')
  shutil.copytree(run, workdir)
  without_checksums(workdir)
  before = json.load(open(os.path.join(workdir, rundir.FINAL_FILE)))
  restore = rundir.restore_state

  def poisoned(manager, step, abstract):
    state = restore(manager, step, abstract)
    if step == STEPS:
      leaves, tree = jax.tree.flatten(state.params)
      leaves[0] = leaves[0].at[(0,) * leaves[0].ndim].set(jnp.nan)
      state = state.replace(params=jax.tree.unflatten(tree, leaves))
    return state

  monkeypatch.setattr(rundir, 'restore_state', poisoned)
  train.train_and_evaluate(tiny_config(total_steps=STEPS), workdir)
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 2 and err[0].startswith('note: ') and 'non-finite values' in err[1], err
  assert json.load(open(os.path.join(workdir, rundir.FINAL_FILE))) == before


def test_a_run_that_diverges_right_after_a_resume_names_the_checkpoint(run, tmp_path, monkeypatch):
  workdir = str(tmp_path / 'w')
  shutil.copytree(run, workdir)
  batch = tasks_base.FixedSetTask.batch

  def poisoned(self, split, step, *args):
    out = batch(self, split, step, *args)
    if split == 'train' and step >= STEPS + 2:
      out['weights'] = np.full_like(out['weights'], np.nan)
    return out

  monkeypatch.setattr(tasks_base.FixedSetTask, 'batch', poisoned)
  with pytest.raises(TrainingDiverged) as e:
    train.train_and_evaluate(tiny_config(total_steps=40), workdir)
  message = str(e.value)
  assert '\n' not in message and message.startswith('non-finite training metrics at step 25')
  assert f"5 steps after resuming from checkpoints/{STEPS} in {workdir!r}" in message
  assert f'move checkpoints/{STEPS} into checkpoints_corrupt/ and rerun the same command' in message
  assert rundir.checkpoint_steps(workdir) == [10, STEPS]  # nothing saved was lost


def test_a_checkpoint_folder_emptied_by_damage_is_damage_not_an_old_checkpoint(run, tmp_path, capsys):
  workdir = str(tmp_path / 'emptied')
  shutil.copytree(run, workdir)
  folder = os.path.join(workdir, rundir.CHECKPOINT_DIR, str(STEPS))
  shutil.rmtree(folder)
  os.makedirs(folder)
  with pytest.raises(checksums.ChecksumError, match='it holds no files'):
    checksums.verify(folder)
  train.train_and_evaluate(tiny_config(total_steps=STEPS), workdir)  # sets it aside, resumes from step 10
  err = capsys.readouterr().err
  assert 'without checksums' not in err and f'checkpoint at step {STEPS} is corrupt or partial' in err, err


def test_a_full_disk_stops_the_run_in_one_line_and_the_rerun_resumes_exactly(run, tmp_path, monkeypatch, capsys):
  """A save finding no space (an injected ENOSPC at step 20: a small file system is not available everywhere)
  stops the run at once with one line naming the last intact checkpoint, leaves no partial save, and the
  same command afterwards ends with the parameters of the run that never stopped."""
  import errno
  workdir = str(tmp_path / 'full')
  save = rundir.save_state

  def full_at_20(manager, step, state, metrics):
    if step == STEPS:
      os.makedirs(os.path.join(workdir, rundir.CHECKPOINT_DIR, f'{STEPS}{rundir.PARTIAL_SAVE}-1'))
      raise OSError(errno.ENOSPC, 'No space left on device')
    return save(manager, step, state, metrics)
  monkeypatch.setattr(rundir, 'save_state', full_at_20)
  with pytest.raises(rundir.DiskFull) as e:
    train.train_and_evaluate(tiny_config(total_steps=STEPS), workdir)
  message = str(e.value)
  assert '\n' not in message and 'the last intact checkpoint is step 10' in message, message
  assert os.listdir(os.path.join(workdir, rundir.CHECKPOINT_DIR)) == ['10']
  assert not os.path.exists(os.path.join(workdir, rundir.FINAL_FILE))
  monkeypatch.setattr(rundir, 'save_state', save)
  train.train_and_evaluate(tiny_config(total_steps=STEPS), workdir)
  assert_trees_equal(params_of(workdir), params_of(run))
  # Before a save that cannot fit, the free space is checked: no partial save is begun.
  monkeypatch.setattr(rundir.shutil, 'disk_usage', lambda path: shutil._ntuple_diskusage(1 << 30, 1 << 30, 1000))
  with pytest.raises(rundir.DiskFull, match=r'MiB free on its file system, a checkpoint needs about'):
    train.train_and_evaluate(tiny_config(total_steps=STEPS + 10), workdir)
  assert rundir.checkpoint_steps(workdir) == [10, STEPS]
