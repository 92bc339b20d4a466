"""Where a prediction comes from: direct logit attribution to the streams, stream ablations, and token
importance per block.

Direct logit attribution (``stream_attribution``). The final state is a sum of terms,
X = X_t^0 + Σ_l ΔX_t^l + Σ_l ΔX_e^l (embedding, attention updates, FFN updates; the standard model's
residual stream likewise). The final normalisation is LN_f(X) = a(X) ⊙ (X − μ(X)) + β with a = γ / s(X)
(``core.final_norm_affine``). Evaluating a at the actual X and holding it fixed, LN_f is linear, so
  logits = Σ_c [a ⊙ (c − μ(c))] Eᵀ + β Eᵀ
exactly: each term c gets the contribution a ⊙ (c − μ(c)) Eᵀ, and β Eᵀ is the 'bias' term. This is the
direct effect of each term on the logits; what a term does through later layers is not in it (the
ablations measure that).

Token importance per block, ``[batch, time (query), time (input position)]`` for each block:
  - ``native``: the flow of positions through the X_t path. In the two-stream models values come from X_t
    alone and attention is the only place positions mix, so channel h of X_t^l at position i holds
    X_t^{l-1}[i] plus Σ_s A_h[i, s] (W_head X_t^{l-1}[s])_h. Tracking which input positions each channel
    holds: F_h^l = ½ (F_h^{l-1} + A_h^l Σ_g |W_head[h, g]| F_g^{l-1} / Σ_g |W_head[h, g]|), F^0 = I; the
    importance after block l is the mean over channels of F^l (rows sum to 1). For the standard model,
    whose values mix all channels, this is attention rollout with the heads averaged.
  - ``input_x_gradient``: |Σ_d x_j,d ∂ log p(y_i) / ∂x_j,d| over input embeddings x_j.
  - ``integrated_gradients``: |Σ_d (x_j,d − x'_d) ∫₀¹ ∂ log p(y_i)/∂x_j,d (x' + α(x − x')) dα|, midpoint
    rule. The baseline x' is by default the mean embedding row at every position (the uniform mixture of
    all tokens): a zero baseline is degenerate here, because LayerNorm makes the model nearly invariant to
    the scale of its input, so the whole path integral piles up next to 0. The signed attributions of a
    query sum to log p(y_i)(x) − log p(y_i)(x') up to the rule's error. Gradient methods are about the output,
    so they are given for the last block only.
"""

from __future__ import annotations

import functools
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from symjax.interpret import circuits, core, decomposition, engine, interventions
from symjax.model import Transformer
from symjax.model import intermediates as names
from symjax.model.transformer import input_stream
from symjax.system.errors import InputError
from symjax.tasks import base, induction
from symjax.train import metrics


@core.takes_hooked_model
def stream_attribution(model: Transformer, params, tokens, key_mask=None) -> dict[str, np.ndarray]:
  """Direct logit attribution: {term name: logits contribution ``[batch, time, vocab]``} with the terms
  of ``core.components`` and 'bias'. They sum to the model's logits."""
  model = core.analysis_model(model)
  _, inter = core.run(model, params, tokens, key_mask)
  return decomposition.attribution_of(model.config, params, inter)


def group_attribution(parts: dict[str, np.ndarray], two_stream: bool = True) -> dict[str, np.ndarray]:
  """Sums the terms of ``stream_attribution`` into 'embedding', 'x_t' (all attention updates), 'x_e' (all
  FFN updates) and 'bias'; for a standard model the middle two are named 'attention' and 'mlp'."""
  t, e = ('x_t', 'x_e') if two_stream else ('attention', 'mlp')
  out = {'embedding': parts['embedding']}
  out[t] = sum(v for k, v in parts.items() if k.startswith('attention_'))
  out[e] = sum(v for k, v in parts.items() if k.startswith('ffn_'))
  out['bias'] = parts['bias']
  return out


@core.takes_hooked_model
def stream_ablations(model: Transformer, params, batches: Sequence[dict[str, np.ndarray]]
                     ) -> dict[str, float]:
  """Accuracy of a two-stream model with each stream removed, over ``batches`` (task format):

  ``none``                 the model as it is
  ``readout_without_x_e``  the readout reads LN_f(X_t) (X_e zeroed at the readout only: direct effect)
  ``readout_without_x_t``  the readout reads LN_f(X_e)
  ``x_e_mean``             every FFN update (all of X_e) replaced by its mean over the batch's positions
  ``x_t_mean``             every attention update (X_t apart from the embedding) replaced by its mean
  """
  model = core.analysis_model(model)
  cfg = model.config
  if cfg.kind == 'standard':
    raise InputError('stream ablations need a two-stream model (token_factored or symbolic)')
  L = cfg.num_layers
  sums: dict[str, float] = {}
  count = 0.0
  for batch in batches:
    logits, inter = core.run(model, params, batch['inputs'], batch['key_mask'])
    last = core.streams(cfg, inter)[-1]
    variants = {'none': logits,
                'readout_without_x_e': core.readout(cfg, params, last['x_t']),
                'readout_without_x_t': core.readout(cfg, params, last['x_e'])}
    for stream, site in (('x_e', 'ffn'), ('x_t', 'attention')):
      variants[f'{stream}_mean'], _ = interventions.run_with(
          model, params, batch['inputs'], [interventions.Ablation(site, l, mode='mean') for l in range(L)],
          batch['key_mask'], reference=batch['inputs'], reference_mask=batch['key_mask'])
    w = batch['weights']
    count += float(w.sum())
    for name, lg in variants.items():
      sums[name] = sums.get(name, 0.0) + metrics.token_metrics(lg, batch['targets'], w)['accuracy'] * float(w.sum())
  return {k: v / max(count, 1e-12) for k, v in sums.items()}


# --- Token importance ---------------------------------------------------------------------------------

@core.takes_hooked_model
def native_importance(model: Transformer, params, tokens, key_mask=None) -> np.ndarray:
  """``[blocks, batch, time, time]``: row i of block l is the share of each input position in what
  position i holds after block l (see the module docstring). Rows sum to 1."""
  model = core.analysis_model(model)
  cfg = model.config
  _, inter = core.run(model, params, tokens, key_mask)
  attention = core.attention_weights(cfg, inter)
  w_head = None if cfg.kind == 'standard' else core.head_parameters(cfg, params).w_head
  return attention_flow(attention, w_head)


def attention_flow(attention: np.ndarray, w_head: np.ndarray | None) -> np.ndarray:
  """The flow recursion of the module docstring on attention ``[layers, batch, heads, time, time]``, with
  per-layer value maps ``w_head`` ``[layers, heads, heads]`` (None: every head's values mix all channels,
  as in a standard block). Returns ``[layers, batch, time, time]``."""
  L, b, H, t, _ = attention.shape
  flow = np.broadcast_to(np.eye(t), (b, H, t, t)).copy()            # per channel: [b, h, i, input j]
  blocks = []
  for l in range(L):
    if w_head is None:
      mixed = np.broadcast_to(flow.mean(1, keepdims=True), flow.shape)
    else:
      m = np.abs(w_head[l])
      m = m / np.maximum(m.sum(1, keepdims=True), 1e-30)
      mixed = np.einsum('hg,bgsj->bhsj', m, flow)
    flow = 0.5 * (flow + np.einsum('bhis,bhsj->bhij', attention[l], mixed))
    blocks.append(flow.mean(1))
  return np.stack(blocks)


def _target_logprob(model: Transformer, params, embeddings, tokens, key_mask, targets):
  """log p(target_i) ``[batch, time]`` with the embedding lookup's output replaced by ``embeddings``: a hook
  at the input state ``embed`` (learned positions, where the model has them, added as it adds them)."""
  cfg = model.config

  def replace(value, name):
    state = embeddings.astype(value.dtype)
    if cfg.kind == 'standard' and cfg.attention.positions == 'learned':
      state = state + params['pos_embedding'][:value.shape[1]].astype(value.dtype)
    return state if cfg.kind == 'standard' else input_stream(cfg, state)
  with names.session({'embed': replace}, lambda name: False):
    logits = model.apply({'params': params}, tokens, key_mask)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  return jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]


def _per_query_grads(model, params, emb, tokens, key_mask, targets):
  """∂ log p(y_i) / ∂ embeddings for every query i: ``[batch, time (i), time (j), d]``."""
  def one(e, tok, km, tgt):
    return jax.jacrev(lambda e_: _target_logprob(model, params, e_[None], tok[None], km[None], tgt[None])[0])(e)
  return jax.vmap(one)(emb, tokens, key_mask, targets)


# Compiled by the engine, one program per model (and steps): the engine's cache keeps them with every other pass.
def _compiled(fn, model, *static):
  return engine.compiled((fn.__name__, model, *static), lambda: functools.partial(fn, model, *static))


def _integrated_gradients(model, steps, params, emb, base, tokens, key_mask, targets):
  # Midpoint rule: the integrand is never taken at the baseline itself (with a zero baseline, where
  # LayerNorm's σ has no gradient).
  alphas = (jnp.arange(steps) + 0.5) / steps
  def body(total, a):
    return total + _per_query_grads(model, params, base + a * (emb - base), tokens, key_mask, targets), None
  zero = jnp.zeros(emb.shape[:2] + emb.shape[1:], jnp.float32)
  total, _ = jax.lax.scan(body, zero, alphas)
  return jnp.einsum('bjd,bijd->bij', emb - base, total / steps)


def _input_x_gradient(model, params, emb, tokens, key_mask, targets):
  return jnp.einsum('bjd,bijd->bij', emb, _per_query_grads(model, params, emb, tokens, key_mask, targets))


def _embeddings(model: Transformer, params, tokens) -> jax.Array:
  table = nn.meta.unbox(params)['embed']['embedding']
  return jnp.asarray(table, jnp.float32)[jnp.asarray(tokens)]


BASELINES = ('mean', 'zero')


def baseline_embeddings(params, tokens, baseline: str) -> jax.Array:
  """The integrated-gradients baseline for every position: 'mean', the mean row of the embedding table
  (the uniform mixture of all tokens: no token in particular), or 'zero'."""
  if baseline not in BASELINES:
    raise InputError(f'baseline must be one of {list(BASELINES)}, got {baseline!r}')
  table = jnp.asarray(nn.meta.unbox(params)['embed']['embedding'], jnp.float32)
  row = table.mean(0) if baseline == 'mean' else jnp.zeros(table.shape[1])
  return jnp.broadcast_to(row, tuple(np.shape(tokens)) + (table.shape[1],))


@core.takes_hooked_model
def gradient_importance(model: Transformer, params, tokens, targets, key_mask=None,
                        method: str = 'integrated_gradients', steps: int = 128, signed: bool = False,
                        baseline: str = 'mean') -> np.ndarray:
  """``[batch, time (query i), time (input j)]`` attribution of log p(targets_i) to input token j by
  ``'input_x_gradient'`` or ``'integrated_gradients'`` (``steps`` midpoint-rule intervals from the
  ``baseline``); absolute values unless ``signed``."""
  model = core.analysis_model(model)
  tokens = core.as_batch(tokens, model.config.vocab_size)
  targets = np.asarray(targets, np.int32).reshape(tokens.shape)
  km = core.valid_keys(tokens, key_mask)
  p = nn.meta.unbox(params)
  emb = _embeddings(model, p, tokens)
  args = (jnp.asarray(tokens), jnp.asarray(km), jnp.asarray(targets))
  if method == 'input_x_gradient':
    out = _compiled(_input_x_gradient, model)(p, emb, *args)
  elif method == 'integrated_gradients':
    if steps < 1:
      raise InputError(f'integrated gradients needs steps >= 1, got {steps}')
    out = _compiled(_integrated_gradients, model, steps)(p, emb, baseline_embeddings(p, tokens, baseline), *args)
  else:
    raise InputError(f"method must be 'input_x_gradient' or 'integrated_gradients', got {method!r}")
  out = np.asarray(out, np.float64)
  return out if signed else np.abs(out)


@core.takes_hooked_model
def target_logprob(model: Transformer, params, tokens, targets, key_mask=None, baseline: str | None = None
                   ) -> np.ndarray:
  """log p(targets_i) ``[batch, time]``; with ``baseline``, at the integrated-gradients baseline input
  instead of the tokens' embeddings."""
  model = core.analysis_model(model)
  tokens = core.as_batch(tokens, model.config.vocab_size)
  km = core.valid_keys(tokens, key_mask)
  p = nn.meta.unbox(params)
  emb = _embeddings(model, p, tokens) if baseline is None else baseline_embeddings(p, tokens, baseline)
  return np.asarray(_compiled(_target_logprob, model)(p, emb, jnp.asarray(tokens), jnp.asarray(km),
                      jnp.asarray(np.asarray(targets, np.int32).reshape(tokens.shape))), np.float64)


# --- Evaluation against known ground truth ------------------------------------------------------------

# Gradient attributions are ranked by their signed value (evidence for the target), and also by their
# absolute value (the '|…|' entries), which a large negative attribution can top.
METHODS = ('native', 'integrated_gradients', 'input_x_gradient', '|integrated_gradients|',
           '|input_x_gradient|', 'random')


def candidates(tokens: np.ndarray, key_mask: np.ndarray | None, causal: bool) -> np.ndarray:
  """``[batch, i, j]``: the input positions j that may explain query i (readable keys, j ≠ i)."""
  b, t = tokens.shape
  km = core.valid_keys(tokens, key_mask)
  allowed = np.tril(np.ones((t, t), bool), -1) if causal else ~np.eye(t, dtype=bool)
  return allowed[None] & km[:, None, :]


def precision_at_k(scores: np.ndarray, truth: np.ndarray, candidates: np.ndarray, queries: np.ndarray | None = None,
                   k: int | None = None) -> float:
  """Mean over queries of |top-k candidates by score ∩ truth| / k: the one precision@k of the attribution
  benchmarks and of alignment ("Towards by-design interpretable transformers", appendix eq. 12, per query).

  scores, truth, candidates: ``[..., queries, keys]`` (candidates may broadcast); ``queries``: ``[...,
  queries]`` bool, by default every query with a true source; ``k``: an integer, or by default each query's
  number of true sources. Ties are broken by position. NaN when there is no query."""
  candidates = np.broadcast_to(candidates, scores.shape)
  ranked = np.where(candidates, scores, -np.inf)
  order = np.argsort(-ranked, axis=-1, kind='stable')
  rank_of = np.empty_like(order)
  np.put_along_axis(rank_of, order, np.broadcast_to(np.arange(scores.shape[-1]), order.shape), axis=-1)
  per_query_k = truth.sum(-1) if k is None else np.full(scores.shape[:-1], k)
  if queries is None:
    queries = per_query_k > 0
  hits = (truth & candidates & (rank_of < per_query_k[..., None])).sum(-1)
  queries = queries & (per_query_k > 0)
  return float((hits[queries] / per_query_k[queries]).mean()) if queries.any() else float('nan')


def random_precision_at_k(truth: np.ndarray, cands: np.ndarray, queries: np.ndarray, k: int = 1) -> float:
  """The expected precision@k of a uniformly random ranking: |truth ∩ candidates| / |candidates|."""
  vals = [(truth[b, i] & cands[b, i]).sum() / cands[b, i].sum() for b, i in zip(*np.nonzero(queries))]
  return float(np.mean(vals)) if vals else 0.0


def induction_truth(tokens: np.ndarray, vocab) -> tuple[np.ndarray, np.ndarray]:
  """For the induction task: queries are letters seen earlier; the truth is every earlier occurrence of
  the same letter and the number that followed it. Returns (truth ``[b, i, j]``, queries ``[b, i]``)."""
  letters = np.isin(tokens, [vocab.id(s) for s in induction.LETTERS])
  numbers = np.isin(tokens, [vocab.id(s) for s in induction.NUMBERS])
  # circuits.induction_targets marks s where s − 1 is an earlier occurrence of tokens[i]: here the number
  # after an earlier occurrence of the query letter; the truth adds that occurrence itself (s − 1).
  after = circuits.induction_targets(tokens) & letters[:, :, None] & numbers[:, None, :]
  truth = after.copy()
  truth[:, :, :-1] |= after[:, :, 1:]
  return truth, truth.any(-1)


def reverse_truth(tokens: np.ndarray, vocab) -> tuple[np.ndarray, np.ndarray]:
  """For RASP reverse (``<s> x_1 .. x_n </s>``): position i's tag is x_{n+1-i}, so the truth is the
  mirrored position n + 1 − i. Queries are content positions other than the middle one (which mirrors
  itself)."""
  eos = vocab.id(base.EOS)
  b, t = tokens.shape
  truth = np.zeros((b, t, t), bool)
  for n in range(b):
    ends = np.nonzero(tokens[n] == eos)[0]
    if not len(ends):
      continue
    length = int(ends[0]) - 1
    for i in range(1, length + 1):
      j = length + 1 - i
      if j != i:
        truth[n, i, j] = True
  return truth, truth.any(-1)


TRUTHS = {'induction': induction_truth, 'reverse': reverse_truth}


@core.takes_hooked_model
def importance_scores(model: Transformer, params, batch: dict[str, np.ndarray], steps: int = 128
                      ) -> dict[str, np.ndarray]:
  """Every method's ``[batch, i, j]`` scores for the final block on a task batch (targets: the tags)."""
  tokens, km = batch['inputs'], batch['key_mask']
  ig = gradient_importance(model, params, tokens, batch['targets'], km, 'integrated_gradients', steps,
                           signed=True)
  ixg = gradient_importance(model, params, tokens, batch['targets'], km, 'input_x_gradient', signed=True)
  return {'native': native_importance(model, params, tokens, km)[-1], 'integrated_gradients': ig,
          'input_x_gradient': ixg, '|integrated_gradients|': np.abs(ig), '|input_x_gradient|': np.abs(ixg)}


@core.takes_hooked_model
def evaluate_importance(model: Transformer, params, batches, task: str, vocab, causal: bool,
                        k: int = 1, steps: int = 128) -> dict[str, float]:
  """precision@k of each method (and the expected precision of a random ranking) against the task's
  ground truth, over the queries of ``batches`` that carry a target."""
  if task not in TRUTHS:
    raise InputError(f'ground truth is known for tasks {sorted(TRUTHS)}, not {task!r}')
  hits = {m: 0.0 for m in METHODS}
  n = 0
  for batch in batches:
    truth, queries = TRUTHS[task](batch['inputs'], vocab)
    queries = queries & (batch['weights'] > 0)
    q = int(queries.sum())
    if not q:
      continue
    cands = candidates(batch['inputs'], batch['key_mask'], causal)
    for m, s in importance_scores(model, params, batch, steps).items():
      hits[m] += precision_at_k(s, truth, cands, queries, k) * q
    hits['random'] += random_precision_at_k(truth, cands, queries, k) * q
    n += q
  out = {m: v / max(n, 1) for m, v in hits.items()}
  out['queries'] = n
  return out
