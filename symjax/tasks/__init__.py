"""Tasks by name. ``get_task(config)`` builds the one ``config.task`` names."""

from __future__ import annotations

import os

from symjax.tasks.base import Task, Vocab
from symjax.tasks import fol, graph, rasp
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


def get_task(config, workdir: str | None = None) -> Task:
  """The task ``config.task`` names. A text task reuses ``workdir/vocab.json`` when it exists."""
  if config.task not in TASKS:
    raise ValueError(f'config.task must be one of {sorted(TASKS)}, got {config.task!r}')
  return TASKS[config.task](config, workdir)


__all__ = ['Task', 'Vocab', 'get_task', 'TASKS', 'VOCAB_FILE']
