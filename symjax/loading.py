"""``symjax.load(workdir)``: a trained model back from its work directory, without the training data."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from symjax import optim, rundir, tasks
from symjax import model as model_lib
from symjax.model import ModelConfig, Transformer
from symjax.tasks.text import tokenizer_from_json


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


def load(workdir: str, which: str | int = 'best') -> Loaded:
  """Loads the ``'best'`` (by the run's ``best_metric``) or ``'latest'`` checkpoint of ``workdir``, or the one
  saved at step ``which`` (an int; ``checkpoint_steps(workdir)`` lists them). A checkpoint that does not
  restore is reported in one line and the next one is tried (``'best'``, ``'latest'``); nothing is moved."""
  if which not in ('best', 'latest') and (isinstance(which, bool) or not isinstance(which, int)):
    raise ValueError(f"which must be 'best', 'latest' or a checkpointed step number, got {which!r}")
  for name in (rundir.CONFIG_FILE, rundir.RUN_FILE, tasks.VOCAB_FILE):
    if not os.path.isfile(os.path.join(workdir, name)):
      raise FileNotFoundError(f'{workdir!r} is not a symjax work directory: {name} is missing')
  with open(os.path.join(workdir, rundir.CONFIG_FILE)) as f:
    config = ml_collections.ConfigDict(json.load(f))
  with open(os.path.join(workdir, rundir.RUN_FILE)) as f:
    run = json.load(f)
  with open(os.path.join(workdir, tasks.VOCAB_FILE)) as f:
    vocab_json = json.load(f)
  tokenizer = tokenizer_from_json(vocab_json) if vocab_json['type'] in ('char', 'bpe') else TokenVocab(
      tasks.Vocab(vocab_json['tokens']))
  model_config = ModelConfig.from_dict(run['model'])
  model = model_lib.build(model_config)

  tx = optim.make_optimizer(config)
  # Restored onto one device, whatever mesh the run trained on.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                          nn.meta.unbox(jax.eval_shape(lambda k: optim.init_state(model, tx, k, 1),
                                                       jax.random.key(0))))
  steps = sorted(rundir.checkpoint_steps(workdir), reverse=True)
  if not steps:
    raise FileNotFoundError(f'no checkpoint in {os.path.join(workdir, rundir.CHECKPOINT_DIR)}')
  if isinstance(which, int):
    if which not in steps:
      raise ValueError(f'{workdir!r} has no checkpoint at step {which}; it has steps {sorted(steps)}')
    steps = [which]
  elif which == 'best':
    best = rundir.best_step(workdir, config)
    steps = [best] + [s for s in steps if s != best] if best is not None else steps
  state = rundir.restore_first_valid(lambda step: rundir.restore_params_only(workdir, step, abstract), steps,
                                     workdir, quarantine_failed=False)
  if state is None:
    raise RuntimeError(f'no checkpoint in {workdir!r} could be restored')
  return Loaded(model, state.params, config, model_config, tokenizer, int(state.step), run['task'],
                run['seq_len'], run['language_model'])


checkpoint_steps = rundir.checkpoint_steps


class TokenVocab:
  """A task vocabulary with the tokenizer interface: text is space-separated tokens."""

  kind = 'tokens'

  def __init__(self, vocab: tasks.Vocab):
    self.vocab = vocab

  def encode(self, text: str):
    return self.vocab.encode(text.split())

  def decode(self, ids) -> str:
    return ' '.join(self.vocab.decode(ids))
