"""Generation with a key–value cache: the prompts' pass, then one position per new token, in one compiled loop.

The prompts run once (``Transformer``), their keys and values kept per block. Each new token then runs
``symjax.model.Suffix`` over its one position, its attention reading the kept keys and values, which the
step extends by its own: the work of a token is one position, not the whole buffer. The cache is kept
right-aligned — slot ``P − 1`` holds the latest token of every row, whatever the row's prompt length — so
that the distance between the new query and each kept key is their distance in the row, and ALiBi's biases
and relative masks are exactly those of the full pass. Hooks run on every pass: on the prompts' positions,
then on each new position alone (``[batch, 1, ...]``), as TransformerLens's key–value cache runs them.

It applies to causal models whose masks depend on the distance alone (``applies``); others run the full
pass per token (``HookedModel.generate(use_past_kv_cache=False)``).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from symjax.interpret import core, engine
from symjax.model import Suffix, Transformer
from symjax.model import intermediates as names
from symjax.model.masks import head_mask_matrix
from symjax.model.transformer import input_stream
from symjax.run import sample


def applies(model: Transformer, total: int) -> bool:
  """Whether the key–value cache computes what the full pass computes: a causal model (no relational edges,
  no learned query–key positions) whose attention masks depend only on the distance between positions."""
  cfg = model.config
  if cfg.kind not in ('standard', 'token_factored', 'symbolic') or cfg.attention.relational or (
      cfg.attention.qk_positions):
    return False
  m = head_mask_matrix(tuple(cfg.mask_predicates()), total, total)
  return not np.triu(m, 1).any() and bool((m[:, 1:, 1:] == m[:, :-1, :-1]).all())


def _choose(logits, rng, mode: str, temperature, top_k: int, top_p):
  """The next token of every row: as ``HookedModel.generate``'s loop chooses it, key for key."""
  if mode == 'greedy':
    return jnp.argmax(logits, -1), rng
  rng, key = jax.random.split(rng)
  filtered = jax.vmap(lambda x: sample.filter_logits(x, mode, temperature, top_k, top_p))(logits)
  return jax.random.categorical(key, filtered), rng


def _program(model: Transformer, prompt_len: int, max_new: int, mode: str, top_k: int) -> Callable:
  """``make(hooks)`` for the engine: the compiled generation of ``max_new`` tokens after prompts of
  ``prompt_len`` positions (shorter rows padded at the end)."""
  cfg = model.config
  L = cfg.num_layers
  P = prompt_len + max_new - 2  # the kept positions a new token's query reads besides its own

  def make(fns):
    def session(capture: dict):
      """The user's hooks, and after them at every block's keys and values, a capture of their value."""
      out = dict(fns)
      for l in range(L):
        for s in ('k', 'values'):
          name, inner = f'blocks.{l}.attn.{s}', fns.get(f'blocks.{l}.attn.{s}')

          def keep(v, hook, name=name, inner=inner):
            v = v if inner is None else names.call_hook(inner, v, name)
            capture[name] = v
            return v
          out[name] = keep
      return names.session(out, lambda name: False)

    def run(params, ids, lengths, rng, temperature, top_p, stop):
      rows = jnp.arange(ids.shape[0])
      seen = {}
      with session(seen):
        logits = model.apply({'params': params}, ids)[rows, lengths - 1]
      token, rng = _choose(logits, rng, mode, temperature, top_k, top_p)
      tokens = jnp.zeros((ids.shape[0], max_new), jnp.int32).at[:, 0].set(token)
      done = token == stop
      count = jnp.ones_like(lengths)
      if max_new == 1:
        return tokens, count
      # Right-aligned cache: row i's prompt at slots P − n_i … P − 1.
      src = jnp.arange(P)[None, :] - (P - lengths[:, None])                    # [batch, P]
      valid = src >= 0
      gather = lambda x: jnp.take_along_axis(x, jnp.clip(src, 0, prompt_len - 1)[:, :, None, None], axis=1)
      cache = {l: tuple(jnp.where(valid[:, :, None, None], gather(seen[f'blocks.{l}.attn.{s}']), 0)
                        for s in ('k', 'values')) for l in range(L)}
      table = params['embed']['embedding']

      def step(s, carry):
        cache, valid, token, rng, tokens, done, count = carry
        x = table[token][:, None].astype(cfg.compute_dtype)                      # [batch, 1, d_model]
        if cfg.kind == 'standard' and cfg.attention.positions == 'learned':
          x = x + params['pos_embedding'][lengths + s - 1][:, None].astype(x.dtype)
        x = x if cfg.kind == 'standard' else input_stream(cfg, x)
        if 'embed' in fns:
          x = names.call_hook(fns['embed'], x, 'embed')
        state = x if cfg.kind == 'standard' else (x, jnp.zeros_like(x))
        seen = {}
        with session(seen):
          logits = Suffix(cfg, 0).apply({'params': params}, state, cache,
                                        jnp.concatenate([valid, jnp.ones_like(valid[:, :1])], 1))[:, 0]
        cache = {l: tuple(jnp.concatenate([kept[:, 1:], seen[f'blocks.{l}.attn.{s}'].astype(kept.dtype)], 1)
                          for kept, s in zip(cache[l], ('k', 'values'))) for l in range(L)}
        valid = jnp.concatenate([valid[:, 1:], jnp.ones_like(valid[:, :1])], 1)
        new, rng = _choose(logits, rng, mode, temperature, top_k, top_p)
        live = ~done
        tokens = tokens.at[:, s].set(jnp.where(live, new, 0))
        count = count + live
        done = done | (live & (new == stop))
        return cache, valid, new, rng, tokens, done, count

      carry = (cache, valid, token, rng, tokens, done, count)
      carry = jax.lax.fori_loop(1, max_new, step, carry)
      return carry[4], carry[6]
    return run
  return make


def generate(model: Transformer, params, ids: np.ndarray, lengths: np.ndarray, max_new: int, fns: dict,
             mode: str, temperature: float, top_k: int, top_p: float, stop: int | None, seed: int,
             eagerly: Callable[[dict], list[np.ndarray]]) -> list[np.ndarray]:
  """Each row's prompt (its first ``lengths[i]`` ids) followed by its new tokens, up to ``max_new`` and
  through ``stop``: one compiled program per model, shapes, mode and hook structure, the hooks' numbers its
  arguments (``symjax.interpret.engine``); ``eagerly(fns)`` where a hook needs concrete values."""
  analysis = core.analysis_model(model)
  make = _program(analysis, ids.shape[1], max_new, mode, top_k if mode == 'top_k' else 0)
  args = (core.unboxed(params), np.asarray(ids, np.int32), np.asarray(lengths, np.int32), jax.random.key(seed),
          np.float32(temperature), np.float32(top_p), np.int32(-1 if stop is None else stop))
  key = ('generate', analysis, ids.shape, max_new, mode, top_k if mode == 'top_k' else 0)
  out = engine.hooked(key, fns, make, args, lambda fns: eagerly(fns))
  if isinstance(out, list):
    return out
  tokens, count = (np.asarray(x) for x in out)
  return [np.concatenate([ids[i, :lengths[i]], tokens[i, :count[i]]]) for i in range(len(ids))]
