"""Sampling from a trained language model: greedy, temperature, top-k and top-p (nucleus) decoding.

  python -m symjax.cli.sample --workdir=runs/... --prompt="ROMEO:" --num_tokens=200 --mode=top_p --top_p=0.9

The whole generation is one jit-compiled loop over a fixed-size buffer. Prompts may be longer than the
training context (ALiBi extrapolates) up to ``model.max_len``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from symjax import model as model_lib
from symjax.system.errors import InputError
from symjax.tasks import fol

MODES = ('greedy', 'temperature', 'top_k', 'top_p')


def filter_logits(logits: jax.Array, mode: str, temperature: float, top_k: int, top_p: float) -> jax.Array:
  """Logits ``[vocab]`` with the excluded tokens at -inf, scaled by 1 / temperature."""
  logits = logits.astype(jnp.float32) / temperature
  if mode == 'top_k':
    kth = jnp.sort(logits)[-top_k]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  elif mode == 'top_p':
    sorted_logits = jnp.sort(logits)[::-1]
    probs = jax.nn.softmax(sorted_logits)
    # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is < top_p.
    keep = (jnp.cumsum(probs) - probs) < top_p
    threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf))
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return logits


@functools.partial(jax.jit, static_argnames=('model', 'total_len', 'mode', 'top_k'))
def _generate(model, params, buffer, prompt_len, rng, *, total_len, mode, temperature, top_k, top_p):
  def body(i, carry):
    buffer, rng = carry
    logits = model.apply({'params': params}, buffer[None])[0, i - 1]
    rng, key = jax.random.split(rng)
    if mode == 'greedy':
      token = jnp.argmax(logits)
    else:
      token = jax.random.categorical(key, filter_logits(logits, mode, temperature, top_k, top_p))
    return buffer.at[i].set(token.astype(buffer.dtype)), rng

  buffer, _ = jax.lax.fori_loop(prompt_len, total_len, body, (buffer, rng))
  return buffer


def generate(model, params, prompt_ids, num_tokens: int, *, mode: str = 'greedy', temperature: float = 1.0,
             top_k: int = 40, top_p: float = 0.9, seed: int = 0) -> np.ndarray:
  """Returns the prompt followed by ``num_tokens`` generated token ids."""
  if mode not in MODES:
    raise InputError(f'mode must be one of {list(MODES)}, got {mode!r}')
  prompt_ids = np.asarray(prompt_ids, np.int32)
  if prompt_ids.ndim != 1:
    raise InputError(f'generate continues one prompt, a 1-D sequence of token ids; got an array of shape '
                     f'{prompt_ids.shape} (generate each row of a batch in turn)')
  max_len = model.config.max_len
  vocab_size = model.config.vocab_size
  if len(prompt_ids) == 0:
    raise InputError('the prompt is empty: give at least one token')
  model_lib.check_token_ids(prompt_ids, vocab_size, 'prompt token ids')
  if num_tokens < 1:
    raise InputError(f'num_tokens must be >= 1, got {num_tokens}')
  total = len(prompt_ids) + num_tokens
  if total > max_len:
    raise InputError(f'prompt of {len(prompt_ids)} tokens plus {num_tokens} new tokens = {total} exceeds '
                     f'model.max_len = {max_len}, the longest sequence this model accepts')
  if not (math.isfinite(temperature) and temperature > 0):
    raise InputError(f'temperature must be a finite number > 0, got {temperature} (use mode=greedy for '
                     f'argmax decoding)')
  if mode == 'top_k' and not 1 <= top_k <= vocab_size:
    raise InputError(f'top_k must be in [1, {vocab_size}], got {top_k}')
  if mode == 'top_p' and not 0 < top_p <= 1:
    raise InputError(f'top_p must be in (0, 1], got {top_p}')
  buffer = jnp.zeros((total,), jnp.int32).at[:len(prompt_ids)].set(prompt_ids)
  out = _generate(model, params, buffer, len(prompt_ids), jax.random.key(seed), total_len=total, mode=mode,
                  temperature=temperature, top_k=top_k, top_p=top_p)
  return np.asarray(out)


def sample_text(loaded, prompt: str, num_tokens: int, **kw) -> str:
  """Decodes ``generate`` on a loaded run (see ``symjax.load``); returns prompt + continuation."""
  if not loaded.language_model:
    raise InputError(f'task {loaded.task!r} is a tagging task, not a language model: its targets are tags, '
                     f'so sampling continuations is meaningless; sample from a run of task "text"')
  ids = loaded.tokenizer.encode(prompt)
  return loaded.tokenizer.decode(generate(loaded.model, loaded.params, ids, num_tokens, **kw))


def fol_validity(model, params, num_samples: int = 100, temperature: float = 1.0, seed: int = 0
                 ) -> dict[str, float]:
  """Samples formulas from ``<s>`` (ancestral, at ``temperature``) and checks each with
  ``symjax.tasks.fol.validate``: the syntactic validity of "Technical Architecture: FOL Symbolic
  Transformer". A sample with no ``</s>`` within the model's length counts as invalid."""
  v = fol.vocab()
  bos, eos = v.id(fol.base.BOS), v.id(fol.base.EOS)
  length = model.config.max_len - 1
  valid = ended = 0
  for i in range(num_samples):
    ids = generate(model, params, [bos], length, mode='temperature', temperature=temperature,
                   seed=seed + i)[1:].tolist()
    if eos in ids:
      ended += 1
      valid += fol.is_valid(v.decode(ids[:ids.index(eos)]))
  return {'valid': valid / num_samples, 'ended': ended / num_samples}
