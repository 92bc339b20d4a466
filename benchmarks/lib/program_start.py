"""A RASP task's Transformer Program trained from a start set by hand: the diagnostics
``benchmarks/analysis/*_from_*`` run ``symjax.main``'s command, every flag the same, with the task's fresh
parameters changed first."""

from __future__ import annotations

from typing import Callable

from symjax.model import ModelConfig
from symjax.tasks import rasp

Start = Callable[[dict, ModelConfig, list[str]], dict]  # (fresh parameters, model config, vocabulary) -> parameters


def train_from(task: str, start: Start) -> None:
  """The training command of ``symjax.main`` (its flags from the command line), with ``start`` applied to task
  ``task``'s fresh parameters; another task or model kind is refused in one line."""
  def initial_params(self, params, model_config):
    if self.name != task or model_config.kind != 'program':
      raise SystemExit(f'error: this diagnostic trains task {task} with model=program, got task {self.name!r} '
                       f'and model.kind {model_config.kind!r}')
    return start(params, model_config, list(self.vocab.tokens))

  rasp.RaspTask.initial_params = initial_params
  from symjax.cli import train
  train.run()
