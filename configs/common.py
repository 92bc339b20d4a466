"""Pieces of recipe that the model kinds share, so that the kinds are compared on equal terms.

Each kind's file (``standard.py``, ``token_factored.py``, ``symbolic.py``) is ``base`` (the defaults at the
size asked for), ``task`` (the task's recipe with the kind's two tuned text fields) and ``finish``, and sets
only the fields in which its recipe differs, each with its reason.
"""

import ml_collections

import symjax.configs as configs
from symjax.train import config as config_lib

TASKS = ('induction', 'text')


def base(kind: str, arg: str | None, **extra_args) -> tuple[ml_collections.ConfigDict, ml_collections.ConfigDict]:
  """(config, parsed arguments) for ``arg`` = ``task=induction|text,size=...,runlocal=true|false``."""
  a = config_lib.parse_arg(arg, task='induction', size='small', runlocal=False, **extra_args)
  if a.task not in TASKS:
    raise ValueError(f'task must be one of {list(TASKS)}, got {a.task!r}')
  # runlocal is a smoke test: the tiny shape whatever size says.
  config = config_lib.default_config(kind=kind, shape=configs.shape('tiny' if a.runlocal else a.size))
  return config, a


def induction(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The in-context learning task of "Learning Transformer Programs": the classic induction-head circuit,
  small enough to train to 100% on a laptop CPU in about a minute."""
  config.task = 'induction'
  config.batch_size = 64
  config.total_steps = 3000        # every kind reaches its plateau well within this budget
  config.learning_rate = 3e-3
  config.warmup_steps = 100
  config.adam_b2 = 0.98            # short runs: a shorter second-moment memory adapts faster
  config.weight_decay = 0.01
  config.eval_every_steps = 500
  config.best_metric = 'accuracy'  # the task is judged by exact answers
  return config


def text(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """nanoGPT's published CPU recipe for shakespeare_char (a baseline researchers know), on any UTF-8 file
  given as ``--config.text_path``: first 90% for training, next 5% validation, last 5% test."""
  config.task = 'text'
  config.seq_len = 64              # nanoGPT's CPU context
  # Room to sample past the training window (ALiBi extrapolates); a reference, so that overriding seq_len
  # moves it too unless model.max_len is set as well.
  config.model.max_len = 4 * config.get_ref('seq_len')
  config.batch_size = 12           # nanoGPT's CPU batch
  config.total_steps = 2000        # nanoGPT's CPU budget
  config.warmup_steps = 100
  config.adam_b2 = 0.99            # nanoGPT's β2 for its small character models
  config.weight_decay = 0.1        # nanoGPT's
  config.eval_every_steps = 250    # eight points on the curve within the budget
  config.best_metric = 'loss'      # a language model is judged by its validation loss
  return config


def task(config: ml_collections.ConfigDict, name: str, text_learning_rate: float, text_tied: bool
         ) -> ml_collections.ConfigDict:
  """The task's shared recipe, and the two fields every kind tunes on text: its learning rate and whether
  the readout is the embedding table (chosen per kind on validation loss by the 3-seed sweep of the kinds'
  grid). On induction every kind reads out through its embedding table."""
  if name == 'induction':
    induction(config)
    config.model.tie_embeddings = True
  else:
    text(config)
    config.learning_rate = text_learning_rate
    config.model.tie_embeddings = text_tied
  return config


def finish(config: ml_collections.ConfigDict, a: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The seconds-long version when ``runlocal=true`` (``config_lib.runlocal``)."""
  return config_lib.runlocal(config) if a.runlocal else config
