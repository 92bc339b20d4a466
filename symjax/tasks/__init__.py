"""Tasks by name. ``get_task(config)`` builds the one ``config.task`` names."""

from __future__ import annotations

import os

from symjax.system.errors import InputError
from symjax.tasks import fol, graph, rasp
from symjax.tasks.base import FixedSetTask, Task, Vocab
from symjax.tasks.induction import InductionTask
from symjax.tasks.text import TextTask

VOCAB_FILE = 'vocab.json'


def _induction(config, workdir):
  del workdir
  return InductionTask(data_seed=config.data_seed)


def _text(config, workdir):
  vocab_file = os.path.join(workdir, VOCAB_FILE) if workdir else None
  return TextTask(config.text_path, config.seq_len, config.tokenizer, config.bpe_vocab_size,
                  config.eval_windows, vocab_file=vocab_file, token_path=config.get('token_path', ''))


def _rasp(config, workdir):
  del workdir
  return rasp.RaspTask(config.task, data_seed=config.data_seed)


def _fol(config, workdir):
  del workdir
  return fol.FOLTask(data_seed=config.data_seed, numeral_glyph_init=config.numeral_glyph_init)


def _graph(config, workdir):
  del workdir
  return graph.GraphDistanceTask(data_seed=config.data_seed)


TASKS = {'induction': _induction, 'text': _text, 'fol': _fol, 'graph_distance': _graph,
         **{name: _rasp for name in rasp.TASKS}}


def check_name(name: str) -> None:
  """InputError naming the tasks when ``name`` (``config.task``) is none of them."""
  if name not in TASKS:
    raise InputError(f'config.task must be one of {sorted(TASKS)}, got {name!r}')


def get_task(config, workdir: str | None = None) -> Task:
  """The task ``config.task`` names. A text task reuses ``workdir/vocab.json`` when it exists."""
  check_name(config.task)
  task = TASKS[config.task](config, workdir)
  if config.get('length_balance', 0.0):
    if not isinstance(task, FixedSetTask):
      raise InputError(f'config.length_balance is for tasks of fixed sequences (induction, the RASP tasks, fol, '
                       f'graph_distance); task {config.task!r} trains on windows of one length: set it to 0')
    task.length_balance = config.length_balance
  return task


def vocab_json(task: Task) -> dict:
  """What a work directory's vocab.json holds: a text task's tokenizer, the fixed vocabulary of the others."""
  return task.tokenizer.to_json() if hasattr(task, 'tokenizer') else task.vocab.to_json()


__all__ = ['Task', 'Vocab', 'get_task', 'check_name', 'vocab_json', 'TASKS', 'VOCAB_FILE']
