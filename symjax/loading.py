"""``symjax.load(workdir)``: a trained model back from its work directory, without the training data."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from symjax import tasks, train
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
  saved at step ``which`` (an int; ``checkpoint_steps(workdir)`` lists them)."""
  if which not in ('best', 'latest') and (isinstance(which, bool) or not isinstance(which, int)):
    raise ValueError(f"which must be 'best', 'latest' or a checkpointed step number, got {which!r}")
  for name in (train.CONFIG_FILE, train.RUN_FILE, tasks.VOCAB_FILE):
    if not os.path.isfile(os.path.join(workdir, name)):
      raise FileNotFoundError(f'{workdir!r} is not a symjax work directory: {name} is missing')
  with open(os.path.join(workdir, train.CONFIG_FILE)) as f:
    config = ml_collections.ConfigDict(json.load(f))
  with open(os.path.join(workdir, train.RUN_FILE)) as f:
    run = json.load(f)
  with open(os.path.join(workdir, tasks.VOCAB_FILE)) as f:
    vocab_json = json.load(f)
  tokenizer = tokenizer_from_json(vocab_json) if vocab_json['type'] in ('char', 'bpe') else TokenVocab(
      tasks.Vocab(vocab_json['tokens']))
  model_config = ModelConfig.from_dict(run['model'])
  model = model_lib.build(model_config)

  tx = train.make_optimizer(config)
  # Restored onto one device, whatever mesh the run trained on.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                          nn.meta.unbox(jax.eval_shape(lambda k: train.init_state(model, tx, k, 1),
                                                       jax.random.key(0))))
  manager = train.checkpoint_manager(workdir, config, read_only=True)
  steps = sorted(manager.all_steps(), reverse=True)
  if not steps:
    raise FileNotFoundError(f'no checkpoint in {os.path.join(workdir, train.CHECKPOINT_DIR)}')
  if isinstance(which, int):
    if which not in steps:
      manager.close()
      raise ValueError(f'{workdir!r} has no checkpoint at step {which}; it has steps {sorted(steps)}')
    steps = [which]
  elif which == 'best':
    best = best_step(workdir, config)
    steps = [best] + [s for s in steps if s != best] if best is not None else steps
  state = None
  for step in steps:
    try:
      state = manager.restore(step, args=train.ocp.args.StandardRestore(abstract))
      break
    except Exception as e:  # pylint: disable=broad-except
      print(f'WARNING: checkpoint at step {step} could not be restored ({type(e).__name__}: '
            f'{str(e)[:200]}); trying another')
  manager.close()
  if state is None:
    raise RuntimeError(f'no checkpoint in {workdir!r} could be restored')
  return Loaded(model, state.params, config, model_config, tokenizer, int(state.step), run['task'],
                run['seq_len'], run['language_model'])


def checkpoint_steps(workdir: str) -> list[int]:
  """The steps at which ``workdir`` holds a finished checkpoint, ascending."""
  folder = os.path.join(workdir, train.CHECKPOINT_DIR)
  if not os.path.isdir(folder):
    return []
  return sorted(int(name) for name in os.listdir(folder) if name.isdigit())


def best_step(workdir: str, config: ml_collections.ConfigDict) -> int | None:
  """The checkpointed step with the best validation ``best_metric``, from metrics.jsonl."""
  path = os.path.join(workdir, train.METRICS_FILE)
  if not os.path.isfile(path):
    return None
  available = set(os.listdir(os.path.join(workdir, train.CHECKPOINT_DIR)))
  sign = 1 if train.config_lib.BEST_METRICS[config.best_metric] == 'max' else -1
  best = None
  with open(path) as f:
    for line in f:
      record = json.loads(line)
      if record.get('split') == 'validation' and str(record['step']) in available:
        score = sign * record[config.best_metric]
        if best is None or score > best[0] or (score == best[0] and record['step'] > best[1]):
          best = (score, record['step'])
  return None if best is None else best[1]


class TokenVocab:
  """A task vocabulary with the tokenizer interface: text is space-separated tokens."""

  kind = 'tokens'

  def __init__(self, vocab: tasks.Vocab):
    self.vocab = vocab

  def encode(self, text: str):
    return self.vocab.encode(text.split())

  def decode(self, ids) -> str:
    return ' '.join(self.vocab.decode(ids))
