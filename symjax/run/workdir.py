"""The work directory of a run: its files, the checks that a resume continues the same run, its Orbax
checkpoints, its metrics log, and ``load`` (``symjax.load``: a trained model back from its folder, without
the training data). The trainer and the seed trainer write through it; it does not import the trainer.

  DIR/config.json            the config the newest checkpoints were trained with
  DIR/config_history.jsonl   every config that trained checkpoints here, with the step it started from
  DIR/run.json               the resolved model and task facts ``symjax.load`` needs
  DIR/vocab.json             the task's vocabulary or tokenizer
  DIR/metrics.jsonl          one JSON line per (step, split) record, with a wall-clock ``time``
  DIR/tensorboard/           the same records as TensorBoard events
  DIR/checkpoints/<step>/    the last ``keep_checkpoints`` checkpoints and the best by ``best_metric``
  DIR/checkpoints_corrupt/   checkpoints that failed to restore, moved aside, never deleted
  DIR/final_metrics.json     metrics of the final parameters
  DIR/.lock                  held by the run training here (``symjax.run.lock``): a second run refuses

Run files are written when the first checkpoint of an invocation is saved, so a resume that fails before
(a bad override, a divergence) leaves the folder describing the checkpoints that are in it.

Orbax and TensorStore are imported by the functions that use them: a run that starts from nothing needs
neither before its first save, and importing them would hold up its first step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging as py_logging
import os
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from symjax import model as model_lib
from symjax import tasks
from symjax.model import ModelConfig, Transformer
from symjax.run import checksums
from symjax.system import files, host
from symjax.system.errors import InputError
from symjax.tasks.text import tokenizer_from_json

if TYPE_CHECKING:
  import orbax.checkpoint as ocp

# The validation metrics that can pick the best checkpoint (config.best_metric), and which way is better.
BEST_METRICS = {'accuracy': 'max', 'loss': 'min', 'perplexity': 'min', 'sequence_accuracy': 'max'}
CONFIG_FILE = 'config.json'
CONFIG_HISTORY_FILE = 'config_history.jsonl'
RUN_FILE = 'run.json'
METRICS_FILE = 'metrics.jsonl'
FINAL_FILE = 'final_metrics.json'
UNREADABLE_SUFFIX = '.unreadable'  # lines of METRICS_FILE that are not records, kept aside at a resume
CHECKPOINT_DIR = 'checkpoints'
CORRUPT_DIR = 'checkpoints_corrupt'



# config.json can be rebuilt from the newest line of config_history.jsonl ('config' field).
CONFIG_HINT = f'the "config" of the last line of {CONFIG_HISTORY_FILE} is the same config'


def checkpoint_choice(text: str, flag: str) -> str | int:
  """The value of a command line's checkpoint ``flag``: ``'best'``, ``'latest'`` or a step number, as
  ``load`` takes it."""
  if text in ('best', 'latest'):
    return text
  if text.isdigit():
    return int(text)
  raise InputError(f"{flag} must be 'best', 'latest' or a checkpointed step number, got {text!r}")


def checkpoint_steps(workdir: str) -> list[int]:
  """The steps at which ``workdir`` holds a finished checkpoint, ascending."""
  folder = os.path.join(workdir, CHECKPOINT_DIR)
  if not os.path.isdir(folder):
    return []
  return sorted(int(name) for name in os.listdir(folder) if name.isdigit())


def save_run_files(workdir: str, config: ml_collections.ConfigDict, task: tasks.Task,
                   model_config: ModelConfig, start_step: int) -> None:
  """config.json, run.json and vocab.json (all ``load`` needs), and one line of config_history.jsonl
  recording that this config trained the folder from ``start_step`` on. Process 0 only."""
  if jax.process_index() != 0:
    return
  run = {'model': model_config.flat(), 'task': task.name, 'seq_len': task.seq_len,
         'language_model': task.language_model, 'data': task.data_fingerprint}
  vocab = tasks.vocab_json(task)
  config_json = config.to_json_best_effort(indent=1)
  for name, text in ((CONFIG_FILE, config_json), (RUN_FILE, json.dumps(run, indent=1)),
                     (tasks.VOCAB_FILE, json.dumps(vocab))):
    files.write_atomically(os.path.join(workdir, name), text)
  with open(os.path.join(workdir, CONFIG_HISTORY_FILE), 'a') as f:
    f.write(json.dumps({'from_step': start_step, 'time': time.time(), 'config': json.loads(config_json)}) + '\n')


@contextlib.contextmanager
def quiet_orbax() -> Iterator[None]:
  """Silences Orbax's and asyncio's log records (tracebacks of a failed restore, read-only notices) for
  the duration; symjax prints its own one-line account of what happened."""
  loggers = [py_logging.getLogger(name) for name in ('absl', 'asyncio')]
  levels = [l.level for l in loggers]
  for l in loggers:
    l.setLevel(py_logging.CRITICAL)
  try:
    yield
  finally:
    for l, level in zip(loggers, levels):
      l.setLevel(level)


class DiskFull(InputError):
  """The work directory's file system filled up during a run."""


SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_SPACE_TEXT = ('No space left on device', 'Disk quota exceeded')


def out_of_space(e: BaseException | None) -> bool:
  """Whether ``e``, or an exception it was raised from or during, says the file system is full (an OSError
  ENOSPC or EDQUOT, or a library's error quoting one)."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if (isinstance(e, OSError) and e.errno in SPACE_ERRNOS) or any(t in str(e) for t in _SPACE_TEXT):
      return True
    e = e.__cause__ or e.__context__
  return False


class SpaceWatch(py_logging.Filter):
  """Drops the log records of a full file system — Orbax's background commit threads log each failure with
  its traceback, and the run reports it in one line — and remembers that one was seen, so that the run can
  stop at its next step (``check``) rather than at its next save, when Orbax would raise it."""

  seen = False

  def filter(self, record: py_logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    full = out_of_space(exc) or any(t in record.getMessage() for t in _SPACE_TEXT)
    self.seen = self.seen or full
    return not full

  def check(self) -> None:
    if self.seen:
      raise OSError(errno.ENOSPC, 'a checkpoint save in the background found no space left on device')


PARTIAL_SAVE = '.orbax-checkpoint-tmp'


@contextlib.contextmanager
def stops_when_full(workdir: str) -> Iterator[SpaceWatch]:
  """Within it, a full file system anywhere — a metric record, the run files, a checkpoint save or its
  background commit (``SpaceWatch.check``) — ends the run with one ``DiskFull`` line: the partial save is
  removed, the line names the last intact checkpoint, and rerunning the same command once there is space
  resumes from it."""
  watch = SpaceWatch()
  loggers = [py_logging.getLogger(name) for name in ('absl', 'asyncio')]
  for logger in loggers:
    logger.addFilter(watch)
  try:
    yield watch
  except BaseException as e:
    if isinstance(e, DiskFull):
      raise
    if not out_of_space(e):
      raise
    raise disk_full(workdir, 'no space left on its file system') from None
  finally:
    for logger in loggers:
      logger.removeFilter(watch)


def disk_full(workdir: str, why: str) -> DiskFull:
  """The one line of a run stopped for space: the partial save removed, the last intact checkpoint named."""
  folder = os.path.join(workdir, CHECKPOINT_DIR)
  for name in os.listdir(folder) if os.path.isdir(folder) else ():
    if PARTIAL_SAVE in name:
      shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
  steps = checkpoint_steps(workdir)
  last = (f'the last intact checkpoint is step {steps[-1]} ({os.path.join(folder, str(steps[-1]))})' if steps
          else 'no checkpoint was saved yet')
  return DiskFull(f'{os.path.abspath(workdir)!r}: {why}; training stopped, {last}; free space and rerun the same '
                  f'command to resume')


def check_space(workdir: str, state) -> None:
  """A ``DiskFull`` before a save that would not fit: the free space of the work directory's file system
  against the size of the latest checkpoint (before the first, the state's bytes and Orbax's metadata).
  Stopping here leaves no partial save, and the run stops at the step it would have saved."""
  steps = checkpoint_steps(workdir)
  if steps:
    latest = os.path.join(workdir, CHECKPOINT_DIR, str(steps[-1]))
    need = sum(os.path.getsize(os.path.join(root, f)) for root, _, names in os.walk(latest) for f in names)
  else:
    need = int(1.25 * sum(np.size(x) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(state))) + (256 << 10)
  free = shutil.disk_usage(workdir).free
  if free < need:
    raise disk_full(workdir, f'{free / 2**20:.1f} MiB free on its file system, a checkpoint needs about '
                             f'{need / 2**20:.1f} MiB')


@contextlib.contextmanager
def unless_full(e: BaseException | None) -> Iterator[None]:
  """Runs the block; while handling ``e``, a full file system's, the block's own failure of the same kind
  (closing a file that cannot be flushed) is not an error of its own."""
  try:
    yield
  except Exception as again:  # noqa: BLE001
    if not (out_of_space(e) and out_of_space(again)):
      raise


def quarantine(workdir: str, step: int) -> str:
  """Moves checkpoint ``step`` to ``checkpoints_corrupt/`` (never deletes it); returns where it went."""
  corrupt = os.path.join(workdir, CORRUPT_DIR)
  os.makedirs(corrupt, exist_ok=True)
  target = os.path.join(corrupt, f'{step}_{int(time.time())}')
  shutil.move(os.path.join(workdir, CHECKPOINT_DIR, str(step)), target)
  return os.path.relpath(target, workdir)


def unreadable_metrics(workdir: str) -> list[int]:
  """Checkpoints whose stored validation metrics do not parse (Orbax reads them all when it opens the
  folder, and stops at the first that fails)."""
  bad = []
  for step in checkpoint_steps(workdir):
    path = os.path.join(workdir, CHECKPOINT_DIR, str(step), 'metrics', 'metrics')
    if os.path.exists(path):
      try:
        with open(path) as f:
          json.load(f)
      except (OSError, ValueError):
        bad.append(step)
  return bad


def checkpoint_manager(workdir: str, keep: int, best_metric: str) -> ocp.CheckpointManager:
  """The trainer's manager: keeps the last ``keep_checkpoints`` plus the best by the validation metric
  ``best_metric``. The metrics are stored with every checkpoint (Orbax's ``best_fn``), so a resumed run
  still knows which one is best and keeps it. Checkpoints whose stored metrics are damaged are moved to
  ``checkpoints_corrupt/`` first (process 0), each with one line on stderr."""
  if jax.process_index() == 0:
    for step in unreadable_metrics(workdir):
      print(f'WARNING: checkpoint at step {step} is corrupt or partial (its stored metrics do not parse); moved '
            f'to {quarantine(workdir, step)}', file=sys.stderr)
  return _manager(workdir, keep, best_metric, read_only=False)


def _manager(workdir: str, keep: int, metric: str, read_only: bool) -> ocp.CheckpointManager:
  import orbax.checkpoint as ocp
  from orbax.checkpoint.checkpoint_managers import preservation_policy as pp
  mode = BEST_METRICS[metric]
  policy = pp.AnyPreservationPolicy([
      pp.LatestN(keep),
      pp.BestN(get_metric_fn=lambda m: m[metric], reverse=mode == 'min', n=1,
               keep_checkpoints_without_metrics=False),
  ])
  directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))

  def seal():  # runs after the manager below is made, on its commit thread
    # Orbax updates the step metadata from a thread of its own (the manager's non-blocking metadata store)
    # and waits for it only at the rename, after this callback. The manifest reads that file, so it waits
    # for the same writes first: otherwise it may read the file half-written (the save fails, and the other
    # processes wait at Orbax's barrier) or before its last update (the checkpoint then fails its checksum).
    manager._non_blocking_metadata_store.wait_until_finished()
    checksums.seal_pending(directory)

  # Each checkpoint's manifest is written into it just before Orbax commits it (symjax.run.checksums).
  sealing = None if read_only else ocp.AsyncOptions(post_finalization_callback=seal)
  with quiet_orbax():  # read_only options log a notice when made
    options = ocp.CheckpointManagerOptions(preservation_policy=policy, best_fn=lambda m: m[metric],
                                           best_mode=mode, read_only=read_only, create=not read_only,
                                           enable_async_checkpointing=not read_only, async_options=sealing)
    manager = ocp.CheckpointManager(directory, options=options)
  if not read_only and not hasattr(manager, '_non_blocking_metadata_store'):
    manager.close()
    raise RuntimeError(f'orbax-checkpoint {ocp.__version__} has no CheckpointManager._non_blocking_metadata_store, '
                       f'which symjax waits on before writing checksums.json (0.11.17 and 0.12.8 have it)')
  return manager


def best_step(workdir: str, best_metric: str) -> int | None:
  """The kept step with the best stored validation metric (Orbax's own tracking, read-only), or None when
  there is none or the stored metrics cannot be read."""
  if unreadable_metrics(workdir):
    return None
  manager = _manager(workdir, 1, best_metric, read_only=True)
  try:
    with quiet_orbax():
      return manager.best_step()
  finally:
    manager.close()


def read_every_array(workdir: str, step: int) -> None:
  """Reads and decodes every array that checkpoint ``step`` of ``workdir`` lists in its ``_METADATA``, with
  TensorStore directly, waiting for every read, and raises ``ValueError`` naming the first array that does
  not read. Why: Orbax's restore stops at the first read that fails and closes its event loop while the
  other reads are in flight; each then reports "Event loop is closed" from a TensorStore thread, dozens per
  damaged checkpoint. A checkpoint that passes this check gives Orbax nothing to fail on, so a damaged one
  is found here and never handed to Orbax. Local reads of a checkpoint are fast next to the restore."""
  root = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR, str(step), 'default'))
  try:
    with open(os.path.join(root, '_METADATA')) as f:
      tree = json.load(f)['tree_metadata']
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f'its _METADATA does not read ({type(e).__name__})') from None
  # Orbax reads these beside the arrays, so one that fails also leaves reads in flight.
  listed = os.path.join(root, 'array_metadatas')
  for name in sorted(os.listdir(listed)) if os.path.isdir(listed) else []:
    try:
      with open(os.path.join(listed, name)) as f:
        json.load(f)['array_metadatas']
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ValueError(f'its array_metadatas/{name} does not read ({type(e).__name__})') from None
  names = ['.'.join(str(k['key']) for k in entry['key_metadata']) for entry in tree.values()
           if not entry['value_metadata'].get('skip_deserialize')]
  ocdbt = os.path.exists(os.path.join(root, 'manifest.ocdbt')) or any(
      n.startswith('ocdbt.process_') for n in os.listdir(root))

  def spec(name):
    kvstore = {'driver': 'ocdbt', 'base': f'file://{root}', 'path': f'{name}/'} if ocdbt else {
        'driver': 'file', 'path': os.path.join(root, name) + '/'}
    zarr3 = not ocdbt and os.path.exists(os.path.join(root, name, 'zarr.json'))
    return {'driver': 'zarr3' if zarr3 else 'zarr', 'kvstore': kvstore, 'open': True}

  import tensorstore as ts
  reads = []
  for name in names:
    try:
      reads.append((name, ts.open(spec(name)).result().read()))
    except Exception as e:  # pylint: disable=broad-except
      reads.append((name, e))
  failed = None
  for name, read in reads:  # every read is waited for, so none is left in flight
    try:
      if isinstance(read, Exception):
        raise read
      read.result()
    except Exception as e:  # pylint: disable=broad-except
      failed = failed or f'array {name} does not read: {" ".join(str(e).split())[:120]}'
  if failed:
    raise ValueError(failed)


_UNVERIFIED_NOTED: set[str] = set()


def check_checkpoint(workdir: str, step: int) -> None:
  """Raises ``ValueError`` naming what is wrong with checkpoint ``step`` of ``workdir``: a file that does not
  match the checksum written with it, or an array that does not read. A checkpoint written before symjax kept
  checksums is read unverified, and one line says so once per work directory."""
  folder = os.path.join(workdir, CHECKPOINT_DIR, str(step))
  if not checksums.verify(folder) and os.path.abspath(workdir) not in _UNVERIFIED_NOTED:
    _UNVERIFIED_NOTED.add(os.path.abspath(workdir))
    if jax.process_index() == 0:
      print(f'note: checkpoints in {workdir!r} were written without checksums (by an earlier symjax); they are '
            f'restored unverified', file=sys.stderr)
  read_every_array(workdir, step)


def restore_first_valid(restore: Callable[[int], Any], steps: Sequence[int], workdir: str,
                        quarantine_failed: bool = True, check: Callable[[int], None] | None = None):
  """``restore(step)`` for the first of ``steps`` that succeeds, or None. Before each, ``check(step)`` (by
  default ``check_checkpoint`` of ``workdir``: its checksums, then every array read) reads the checkpoint,
  so a damaged one fails there and never reaches Orbax. Each step that fails is reported in one line on
  stderr and, with ``quarantine_failed`` (the trainer, process 0), moved to ``checkpoints_corrupt/``;
  Orbax's own log records are not printed."""
  check = check or (lambda step: check_checkpoint(workdir, step))
  steps = list(steps)
  for i, step in enumerate(steps):
    try:
      check(step)
      with quiet_orbax():
        return restore(step)
    except Exception as e:  # pylint: disable=broad-except
      what = f'{type(e).__name__}: {" ".join(str(e).split())[:160]}'
      moved = ''
      if quarantine_failed and jax.process_index() == 0:
        moved = f'; moved to {quarantine(workdir, step)}'
      following = f'trying step {steps[i + 1]}' if i + 1 < len(steps) else 'no other checkpoint is left'
      print(f'WARNING: checkpoint at step {step} is corrupt or partial ({what}){moved}; {following}',
            file=sys.stderr)
  return None


def save_state(manager: ocp.CheckpointManager, step: int, state, metrics: dict[str, float]) -> None:
  """Starts saving ``state`` as checkpoint ``step`` with its validation ``metrics`` (asynchronously), once
  ``check_space`` finds room for it."""
  import orbax.checkpoint as ocp
  check_space(os.path.dirname(os.fspath(manager.directory)), state)
  manager.save(step, args=ocp.args.StandardSave(state), metrics=metrics, custom_metadata=checksums.CUSTOM_METADATA)


def restore_state(manager: ocp.CheckpointManager, step: int, abstract_state):
  """Checkpoint ``step``, restored into ``abstract_state``'s shapes, dtypes and shardings."""
  import orbax.checkpoint as ocp
  return manager.restore(step, args=ocp.args.StandardRestore(abstract_state))


def restore_params(workdir: str, step: int, params_shapes) -> tuple[int, Any]:
  """(step, parameters) of checkpoint ``step``, restored onto one device whatever mesh the run trained on,
  without a checkpoint manager (for reading a folder, never writing it). The arrays' shapes come from the
  checkpoint's own metadata, so reading needs no optimiser; the parameters must have ``params_shapes``' tree,
  shapes and dtypes (the model of the folder's run.json), else ValueError."""
  import orbax.checkpoint as ocp
  path = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR, str(step), 'default'))
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  with ocp.StandardCheckpointer() as checkpointer:
    metadata = checkpointer.metadata(path)
    tree = getattr(metadata, 'item_metadata', metadata)
    tree = getattr(tree, 'tree', tree)
    state = checkpointer.restore(path, jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), tree))
  describe = lambda t: jax.tree.map(lambda a: (tuple(a.shape), jnp.dtype(a.dtype)), t)
  if describe(state['params']) != describe(params_shapes):
    raise ValueError(f'its parameters are not those of the model its {RUN_FILE} describes')
  return int(state['step']), state['params']


def _record(line: str) -> dict | None:
  try:
    record = json.loads(line)
  except ValueError:
    return None
  return record if isinstance(record, dict) and 'step' in record and 'split' in record else None


class MetricWriter:
  """One JSON line per record in ``metrics.jsonl`` plus TensorBoard events; process 0 only. Opening it
  for a run that resumes at ``resume_step`` first drops the records of later steps (steps the resumed run
  replays, validation of checkpoints that were never finished, the test record this run writes again), so
  the file holds each (step, split) once."""

  def __init__(self, workdir: str, resume_step: int = 0):
    self.active = jax.process_index() == 0
    if not self.active:
      return
    path = os.path.join(workdir, METRICS_FILE)
    if os.path.isfile(path):
      with open(path) as f:
        records = [(line, _record(line)) for line in f]
      # The final test record of the step resumed from is written again when this run ends; a line a
      # killed run left half-written (the last, without its line end) does not parse and goes too. Any
      # other line that does not parse was changed after it was written: it is kept aside, not dropped.
      kept = [line for line, r in records if r is not None and
              (r['step'] < resume_step or (r['step'] == resume_step and r['split'] != 'test'))]
      unreadable = [line for line, r in records if r is None and line.endswith('\n') and line.strip()]
      if unreadable:
        with open(path + UNREADABLE_SUFFIX, 'a') as f:
          f.writelines(unreadable)
        print(f'WARNING: {len(unreadable)} line(s) of {path} are not metric records; moved to '
              f'{path + UNREADABLE_SUFFIX}', file=sys.stderr)
      files.write_atomically(path, ''.join(kept))
    self.jsonl = open(path, 'a')
    self._tb_args = (os.path.join(workdir, 'tensorboard'), resume_step + 1)
    self.tb = None  # made at the first record: importing tensorboardX would hold up the first step

  def _tensorboard(self):
    if self.tb is None:
      folder, purge_step = self._tb_args
      self.tb = summary_writer_class()(folder, purge_step=purge_step)
    return self.tb

  def write(self, step: int, split: str, metrics: dict[str, float]) -> None:
    if not self.active:
      return
    self.jsonl.write(json.dumps({'step': step, 'split': split, 'time': round(time.time(), 3), **metrics}) + '\n')
    self.jsonl.flush()
    tb = self._tensorboard()
    for k, v in metrics.items():
      tb.add_scalar(f'{split}/{k}', v, step)
    tb.flush()

  def close(self) -> None:
    if self.active:
      self.jsonl.close()
      if self.tb is not None:
        self.tb.close()


def summary_writer_class():
  """tensorboardX's ``SummaryWriter``, imported without PyTorch.

  tensorboardX imports PyTorch whenever it is installed, only to accept PyTorch tensors; a run logs floats, and
  would pay PyTorch's import on every start (a second, and much of the trainer's resident memory, where
  PyTorch is installed beside it). Unless PyTorch is already imported, the import is hidden from
  tensorboardX for that one import.
  """
  if 'torch' in sys.modules or 'tensorboardX' in sys.modules:
    from tensorboardX import SummaryWriter
    return SummaryWriter
  sys.modules['torch'] = None  # `import torch` raises ImportError, which tensorboardX expects without PyTorch
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules['torch']
  return SummaryWriter


# ----------------------------------------------------------------------------------------------------------
# Reading a finished (or running) work directory back.
# ----------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Loaded:
  model: Transformer
  params: Any
  config: ml_collections.ConfigDict     # the run's config
  model_config: ModelConfig
  tokenizer: Any                         # .vocab, and .encode/.decode for text tasks
  step: int                              # training step of the restored checkpoint
  task: str
  seq_len: int                           # training sequence length
  language_model: bool                   # targets are next tokens: sampling makes sense
  workdir: str = ''                      # where it was loaded from

  def batches(self, split: str = 'validation', n: int | None = None, batch_size: int | None = None) -> list[dict]:
    """Every batch the run scores ``split`` on, exactly as its evaluation reads them (``n``: the first
    ``n`` of them; 'train': the fixed sample of training batches it scores), each ``{'inputs', 'targets',
    'weights', 'key_mask', ...}`` of ``[batch_size, seq_len]``; ``batch_size`` defaults to the run's, which
    is also what makes them the run's own. A text run needs its corpus where it was trained from
    (``config.text_path`` or ``config.token_path``)."""
    import itertools
    task = tasks.get_task(self.config, self.workdir or None)
    if split not in ('train', 'validation', 'test', *task.eval_splits):
      raise InputError(f"split must be one of {['train', 'validation', 'test', *task.eval_splits]}, got {split!r}")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
      raise InputError(f'n must be an integer >= 1 (or None: every batch), got {n!r}')
    scored = task.scored_batches(split, batch_size or self.config.batch_size, self.config.data_seed)
    return list(scored if n is None else itertools.islice(scored, n))

  def evaluate(self, split: str = 'validation', hooks: dict | None = None) -> dict[str, float]:
    """The run's metrics of ``split`` (loss, perplexity, accuracy, top-k, sequence accuracy) over exactly the
    batches its evaluation reads (``batches``), scored as the trainer scores them (``symjax.ops.scoring``),
    with ``hooks`` {site: ``fn(value, name)``} applied where given: e.g. the change in validation loss when
    a head is zeroed, ``run.evaluate(hooks={'blocks.1.attn.z': interpret.zero_head(0)})``."""
    from symjax.model import intermediates as names
    from symjax.ops import readout, scoring
    top_ks = tuple(self.config.get('top_ks', ()))
    vocab = self.model_config.vocab_size
    cfg = self.model_config
    hooks = {names.from_transformer_lens(n, cfg.num_layers): fn for n, fn in (hooks or {}).items()}
    sites = cfg.sites()
    bad = [n for n, fn in hooks.items() if n not in sites or not callable(fn)]
    if bad:
      raise InputError(f'hooks must map site names to functions fn(value, name); {bad[0]!r} is not one of this '
                       f'model\'s sites ({sites[0]}, ..., {sites[-1]}; symjax.model.intermediates lists them)'
                       if bad[0] not in sites else f'the hook at {bad[0]!r} is not a function')

    def sums(params, batch):
      with names.session(hooks or {}, lambda name: False) if hooks else contextlib.nullcontext():
        logits = self.model.apply({'params': params}, batch['inputs'], batch['key_mask'], edges=batch.get('edges'))
      loss, _, above, tied = readout.logit_stats(logits[..., :vocab].astype(jnp.float32), batch['targets'])
      return scoring.weighted_metrics(loss, above, tied, batch, top_ks)
    step = jax.jit(sums)
    return scoring.evaluate(step, self.params, self.batches(split), top_ks)

  def loss(self, text_or_tokens) -> float:
    """The mean next-token cross-entropy (nats) of a language model on a text or a sequence of token ids:
    every token after the first, predicted from those before it."""
    if not self.language_model:
      raise InputError(f'task {self.task!r} is a tagging task: its targets are tags, not next tokens; score it with '
                       f'batches() and the model instead')
    ids = (self.tokenizer.encode(text_or_tokens) if isinstance(text_or_tokens, str)
           else np.asarray(text_or_tokens, np.int32).reshape(-1))
    if ids.size < 2:
      raise InputError(f'the loss needs at least 2 tokens (one to predict from, one to predict), got {ids.size}')
    model_lib.check_token_ids(ids, self.model_config.vocab_size)
    logits = self.model.apply({'params': self.params}, jnp.asarray(ids[None, :-1]))
    logp = jax.nn.log_softmax(logits[0].astype(jnp.float32), -1)
    return float(-jnp.take_along_axis(logp, jnp.asarray(ids[1:, None]), -1).mean())


def load(workdir: str, which: str | int = 'best') -> Loaded:
  """Loads the ``'best'`` (by the run's ``best_metric``) or ``'latest'`` checkpoint of ``workdir``, or the one
  saved at step ``which`` (an int; ``checkpoint_steps(workdir)`` lists them). A checkpoint that does not
  restore is reported in one line and the next one is tried (``'best'``, ``'latest'``); nothing is moved.
  JAX's persistent compilation cache is turned on in the run's ``compilation_cache_dir``, unless the process
  already has one (``symjax.system.host.use_compilation_cache``)."""
  if which not in ('best', 'latest') and (isinstance(which, bool) or not isinstance(which, int)):
    raise InputError(f"which must be 'best', 'latest' or a checkpointed step number, got {which!r}")
  for name in (CONFIG_FILE, RUN_FILE, tasks.VOCAB_FILE):
    if not os.path.isfile(os.path.join(workdir, name)):
      raise FileNotFoundError(f'{workdir!r} is not a symjax work directory: {name} is missing')
  config = ml_collections.ConfigDict(files.read_json(os.path.join(workdir, CONFIG_FILE), CONFIG_HINT))
  # The run's compilation cache serves its analysis too: a later process's forward passes, sweeps and
  # decompiling load what an earlier one compiled instead of compiling it again.
  host.use_compilation_cache(config.get('compilation_cache_dir', ''))
  host.retain_freed_memory()  # the analysis passes' temporaries, as the trainer's steps' (symjax.system.host)
  run = files.read_json(os.path.join(workdir, RUN_FILE))
  vocab_json = files.read_json(os.path.join(workdir, tasks.VOCAB_FILE))
  tokenizer = tokenizer_from_json(vocab_json) if vocab_json['type'] in ('char', 'bpe') else TokenVocab(
      tasks.Vocab(vocab_json['tokens']))
  model_config = model_lib.for_backend(ModelConfig.from_dict(run['model']))
  model = model_lib.build(model_config)

  edges = jnp.zeros((1, 1, 1), jnp.int32) if model_config.attention.relational else None  # edge projections
  params_shapes = nn.meta.unbox(jax.eval_shape(
      lambda k: model.init(k, jnp.zeros((1, 1), jnp.int32), edges=edges)['params'], jax.random.key(0)))
  steps = sorted(checkpoint_steps(workdir), reverse=True)
  if not steps:
    raise FileNotFoundError(f'no checkpoint in {os.path.join(workdir, CHECKPOINT_DIR)}')
  if isinstance(which, int):
    if which not in steps:
      raise InputError(f'{workdir!r} has no checkpoint at step {which}; it has steps {sorted(steps)}')
    steps = [which]
  elif which == 'best':
    best = best_step(workdir, config.best_metric)
    steps = [best] + [s for s in steps if s != best] if best is not None else steps
  restored = restore_first_valid(lambda step: restore_params(workdir, step, params_shapes), steps, workdir,
                                 quarantine_failed=False)
  if restored is None:
    raise InputError(f'no checkpoint in {workdir!r} could be restored (each is named above); its '
                     f'{CHECKPOINT_DIR}/ folder is as it was')
  step, params = restored
  return Loaded(model, params, config, model_config, tokenizer, step, run['task'], run['seq_len'],
                run['language_model'], workdir)


class TokenVocab:
  """A task vocabulary with the tokenizer interface: text is space-separated tokens."""

  kind = 'tokens'

  def __init__(self, vocab: tasks.Vocab):
    self.vocab = vocab

  def encode(self, text: str):
    return self.vocab.encode(text.split())

  def decode(self, ids) -> str:
    """The tokens of ``ids`` (one id or a sequence of them), separated by spaces."""
    return ' '.join(self.vocab.decode(ids))
