"""A Transformer Program ("Learning Transformer Programs", §3): a transformer whose residual stream is a set of
named categorical variables, each module reading a few of them, so that it decompiles into code a person reads
(``symjax.proj.program_code``).

Every variable is a one-hot vector over ``cardinality`` values at each position (a token id, a position or a
count):

  tokens, positions    the input (one-hot, fixed)
  attn_{l}_{h}         what head h of layer l writes
  mlp_{l}_{m}          what MLP m of layer l writes

A module reads a variable through a selection: a learned distribution over the variables written before it
(its logits ``select_*``), taken as its argmax (§3.1, "reading from the residual stream"):

- a categorical head (§3.2) selects a query, a key and a value variable; its predicate maps each query value to
  one key value (one row-wise argmax of a ``[cardinality, cardinality]`` table); each query reads the closest
  key whose value the predicate names (the earlier of two at the same distance, itself last, position 0 where
  no key matches; Appendix A.1) and copies that key's value variable;
- a numerical head (§3.3) selects a query and a key variable (with ``model.numerical_positions = False`` any
  but ``positions``); its predicate holds for every (query value, key value) whose entry of a
  ``[cardinality, cardinality]`` table is above 0 (several key values per query value,
  the entry-wise form of Appendix C); it writes how many keys it selects, or with ``model.numerical_values``
  the sum over them of a numerical variable it selects (``ones``, whose sum is that count, or a lower layer's
  numerical head), saturating at cardinality − 1;
- an MLP (§3.3) selects two variables and writes the argmax of a one-hidden-layer network of their one-hots:
  a lookup table from pairs of values to a value;
- the readout is linear in every variable's one-hot (the classifier of §3.4), or with
  ``model.numerical_readout='linear'`` in a numerical variable's value, as that paper's programs weigh theirs;
  with ``model.readout_reads = k`` it reads only the k variables that k selections choose.

The forward pass is exactly the program: every argmax is one-hot, and the gradient is the softmax's
(straight-through; ``hard + (soft − stop_gradient(soft))`` is ``hard`` exactly, so no rounding ever moves a
choice). While training, the selections, predicates, attention and MLP outputs may be sampled with Gumbel
noise (``model.gumbel_scale``, annealed to ``gumbel_scale_end``). With ``model.relaxed`` training takes the
relaxation instead, as that paper trains its programs: every choice is the Gumbel-softmax sample
softmax((logits + g) / τ), τ annealed on the same schedule, and attention weighs keys by the softmax of
log(match) plus a closeness bias (``relaxed_attention``), so that as τ falls the relaxed model becomes the
program; evaluation always runs the program.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from symjax.model import intermediates as names
from symjax.model.config import ModelConfig
from symjax.model.program import GUMBEL_RNG
from symjax.system.errors import InputError

Array = jax.Array

# The logit of a selection or predicate entry that ``position_counts`` sets (−it for an entry that does not
# hold, 0 for the selections not made): far beyond the relaxation's noise, so its samples start on the count.
SET_LOGIT = 10.0

# Sharpness of the soft attention whose gradient the hard choice takes: logits β·S_ij·rank_ij/(max_len + 1).
ATTENTION_SHARPNESS = 8.0


def cardinality(cfg: ModelConfig) -> int:
  """The values every variable ranges over: token ids, positions and counts (0…max_len) all fit."""
  return max(cfg.vocab_size, cfg.max_len + 1)


def variable_names(cfg: ModelConfig, upto_layer: int | None = None, with_heads_of: int | None = None
                   ) -> list[str]:
  """The variables in the order the model writes them: those a module of layer ``upto_layer`` can read
  (its own layer's heads too with ``with_heads_of``, for MLPs); all of them by default."""
  names = ['tokens', 'positions']
  for l in range(cfg.num_layers if upto_layer is None else upto_layer):
    names += [f'attn_{l}_{h}' for h in range(cfg.num_heads)] + [f'mlp_{l}_{m}' for m in range(cfg.program.mlps)]
  if with_heads_of is not None:
    names += [f'attn_{with_heads_of}_{h}' for h in range(cfg.num_heads)]
  return names


def head_reads(cfg: ModelConfig, layer: int, numerical: bool) -> list[str]:
  """The variables a head of ``layer`` selects its query and key among: every one written before it, but
  ``positions`` for a numerical head under ``model.numerical_positions = False``, whose count then cannot
  depend on where its query or its keys stand."""
  names = variable_names(cfg, layer)
  return [n for n in names if n != 'positions'] if numerical and not cfg.program.numerical_positions else names


def numerical_names(cfg: ModelConfig, layer: int) -> list[str]:
  """The numerical variables a numerical head of ``layer`` can sum (``model.numerical_values``): the constant
  ``ones`` and every numerical head of the layers below."""
  first = cfg.num_heads - cfg.program.numerical_heads
  return ['ones'] + [f'attn_{l}_{h}' for l in range(layer) for h in range(first, cfg.num_heads)]


def sets_counts(cfg: ModelConfig) -> bool:
  """Whether fresh parameters start with counts set (``model.position_counts``, ``model.symbol_counts``)."""
  return cfg.kind == 'program' and (cfg.program.position_counts or cfg.program.symbol_counts)


def set_counts(params: dict, cfg: ModelConfig, symbol_ids: tuple[int, ...]) -> dict:
  """``params`` with the counts ``model.position_counts`` and ``model.symbol_counts`` ask for set: those of
  positions on layer 0's first three numerical heads, then one of each of the task's symbols (``symbol_ids``,
  its content tokens) on the numerical heads after them; traceable."""
  params = position_counts(params, cfg) if cfg.program.position_counts else params
  return symbol_counts(params, cfg, symbol_ids) if cfg.program.symbol_counts else params


def position_counts(params: dict, cfg: ModelConfig) -> dict:
  """``params`` with layer 0's first three numerical heads counting, over positions, the keys at or after the
  query (n − i), at or before it (i + 1) and all of them (n) (``model.position_counts``); traceable."""
  card, first = cardinality(cfg), cfg.num_heads - cfg.program.numerical_heads
  q, k = jnp.arange(card)[:, None], jnp.arange(card)[None, :]
  reads = head_reads(cfg, 0, numerical=True)
  positions = jnp.where(jnp.arange(len(reads)) == reads.index('positions'), SET_LOGIT, 0.0)
  params = dict(params)
  for h, holds in enumerate([k >= q, k <= q, jnp.ones((card, card), bool)]):
    head = {**params[f'attn_0_{first + h}'], 'select_query': positions, 'select_key': positions,
            'predicate': jnp.where(holds, SET_LOGIT, -SET_LOGIT)}
    if cfg.program.numerical_values:  # the sum of `ones`: the count
      head['select_value'] = jnp.where(jnp.arange(len(numerical_names(cfg, 0))) == 0, SET_LOGIT, 0.0)
    params[f'attn_0_{first + h}'] = head
  return params


def symbol_counts(params: dict, cfg: ModelConfig, symbol_ids: tuple[int, ...]) -> dict:
  """``params`` with one numerical head per symbol (``symbol_ids``) counting, at every query, the keys that hold
  it: a histogram of the input at every position (``model.symbol_counts``). The heads are the numerical ones
  in order of layer, after the three ``position_counts`` sets; the query reads ``positions`` and no predicate
  row depends on it, so training may make a count depend on where it is read. Traceable."""
  first = cfg.num_heads - cfg.program.numerical_heads
  heads = [(l, h) for l in range(cfg.num_layers) for h in range(first, cfg.num_heads)]
  heads = heads[3:] if cfg.program.position_counts else heads
  if not symbol_ids:
    raise InputError('model.symbol_counts counts the symbols of the task, and this task names none (the RASP '
                     'tasks do); set model.symbol_counts=false')
  if len(heads) < len(symbol_ids):
    raise InputError(f'model.symbol_counts starts one numerical head per symbol of the task: it has '
                     f'{len(symbol_ids)} symbols and the model {len(heads)} numerical heads free to count them; '
                     f'raise model.num_heads or model.numerical_heads, or set model.symbol_counts=false')
  card, params = cardinality(cfg), dict(params)
  for (l, h), symbol in zip(heads, symbol_ids):
    reads = head_reads(cfg, l, numerical=True)
    choose = lambda name: jnp.where(jnp.arange(len(reads)) == reads.index(name), SET_LOGIT, 0.0)
    holds = jnp.broadcast_to(jnp.arange(card) == symbol, (card, card))   # [query value, key value]
    head = {**params[f'attn_{l}_{h}'], 'select_query': choose('positions'), 'select_key': choose('tokens'),
            'predicate': jnp.where(holds, SET_LOGIT, -SET_LOGIT)}
    if cfg.program.numerical_values:  # the sum of `ones`: the count
      head['select_value'] = jnp.where(jnp.arange(len(numerical_names(cfg, l))) == 0, SET_LOGIT, 0.0)
    params[f'attn_{l}_{h}'] = head
  return params


def exact_straight_through(hard: Array, soft: Array) -> Array:
  """``hard`` in the forward pass, exactly, with the gradient of ``soft``."""
  return hard + (soft - jax.lax.stop_gradient(soft))


def one_hot_argmax(logits: Array, noise: Array | None) -> Array:
  """The straight-through one-hot argmax of ``logits`` over the last axis (of ``logits + noise`` while
  sampling): ties to the first index, as NumPy's argmax."""
  if noise is not None:
    logits = logits + noise
  soft = jax.nn.softmax(logits, -1)
  return exact_straight_through(jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=soft.dtype), soft)


def closest_rank(n: int, max_len: int) -> Array:
  """``[n, n]``: how strongly query i prefers key j among the keys its predicate matches: max_len + 1 − |i − j|
  for another key (closer first), 1 for itself (last)."""
  i, j = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
  return jnp.where(i == j, 1, max_len + 1 - jnp.abs(i - j)).astype(jnp.float32)


class _Noise:
  """Gumbel noise for the argmaxes of one call, or none (evaluation, or no scale). ``relaxed``: the call trains
  the relaxation instead, every choice a Gumbel-softmax sample at temperature ``scale``."""

  def __init__(self, module: nn.Module, scale: Any, relaxed: bool = False):
    self.module = module
    self.on = scale is not None and module.has_rng(GUMBEL_RNG)
    self.relaxed = relaxed and self.on
    self.scale = 1.0 if self.relaxed else scale  # relaxed: unit noise, the schedule is the temperature
    self.temperature = scale

  def gumbel(self, shape) -> Array | None:
    return self.scale * jax.random.gumbel(self.module.make_rng(GUMBEL_RNG), shape) if self.on else None

  def logistic(self, shape) -> Array | None:
    return self.scale * jax.random.logistic(self.module.make_rng(GUMBEL_RNG), shape) if self.on else None

  def choose(self, logits: Array) -> Array:
    """One value out of the last axis: the (sampled) straight-through argmax, or, relaxed, the Gumbel-softmax
    sample softmax((logits + g) / τ)."""
    if self.relaxed:
      return jax.nn.softmax((logits + self.gumbel(logits.shape)) / self.temperature, -1)
    return one_hot_argmax(logits, self.gumbel(logits.shape))

  def sample(self, logits: Array) -> Array:
    """The Gumbel-softmax sample softmax((logits + g) / τ) while training (τ the schedule's scale, g unit
    noise), whatever ``relaxed``; the one-hot argmax otherwise."""
    if not self.on:
      return one_hot_argmax(logits, None)
    noise = jax.random.gumbel(self.module.make_rng(GUMBEL_RNG), logits.shape)
    return jax.nn.softmax((logits + noise) / self.temperature, -1)


def relaxed_attention(matches: Array, allowed: Array, max_len: int, tie: float = 1e-3) -> Array:
  """The log-scores whose softmax relaxes select_closest: log(match) plus a bias in (−1, 0] for being close
  (itself last), so that as the temperature falls the weight goes to the key the hard head reads; where no
  key matches, position 0 (whose floor is e² times the others'). ``tie``: what the later of two keys at the
  same distance loses."""
  n = matches.shape[-1]
  i, j = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
  # Of two keys at the same distance the hard head reads the earlier one: the later loses a little.
  bias = closest_rank(n, max_len) / (max_len + 1) - 1.0 - tie * (j > i)
  floor = jnp.where(jnp.arange(n) == 0, 1e-9 * jnp.e ** 2, 1e-9)
  return jnp.where(allowed, jnp.log(matches + floor) + bias, -1e9)


def _select(module: nn.Module, name: str, stack: Array, noise: _Noise) -> Array:
  """The variable a module reads: ``stack`` is ``[variables, batch, time, cardinality]``; the selection is
  the one-hot argmax of the learned logits ``select_{name}`` (sampled while training)."""
  logits = module.param(f'select_{name}', nn.initializers.normal(1.0), (stack.shape[0],))
  # The variables as this input reads them: a hook session may give one input other values of a variable than
  # the rest of the model sees (edge patching, ``symjax.interpret.edges``). Outside one this is ``stack``.
  stack = names.tap(module, f'{module.name}.{name}', stack)
  weights = noise.choose(logits)
  return jnp.einsum('v,vbtk->btk', weights, stack)


class CategoricalHead(nn.Module):
  """select_closest(key, query, predicate) then aggregate(value): one key per query, its value copied."""

  max_len: int
  noise: Any = None
  relaxed: bool = False
  attention_noise: bool = True  # relaxed: the pattern a Gumbel-softmax sample, or the softmax at τ

  @nn.compact
  def __call__(self, stack: Array, allowed: Array) -> Array:
    noise = _Noise(self, self.noise, self.relaxed)
    q, k, v = (_select(self, name, stack, noise) for name in ('query', 'key', 'value'))
    card = stack.shape[-1]
    psi = self.param('predicate', nn.initializers.normal(1.0), (card, card))
    predicate = noise.choose(psi)                                     # row a: the key value query a matches
    matches = jnp.einsum('bik,kl,bjl->bij', q, predicate, k)          # 0 or 1, exactly (unless relaxed)
    if noise.relaxed:
      if self.attention_noise:
        pattern = noise.choose(relaxed_attention(matches, allowed, self.max_len))
      else:  # a tie lost by half a step of distance, so that the softmax settles it as τ falls
        scores = relaxed_attention(matches, allowed, self.max_len, tie=0.5 / (self.max_len + 1))
        pattern = jax.nn.softmax(scores / noise.temperature, -1)
      self.sow('intermediates', 'pattern', pattern)
      return jnp.einsum('bij,bjk->bik', pattern, v)
    rank = closest_rank(q.shape[1], self.max_len)
    # The closest match, itself last; no match (or no allowed key scoring above 0) reads position 0.
    hard_choice = jnp.argmax(jnp.where(allowed, matches * rank, -1.0), -1)
    # A finite floor: an empty row (an evaluation batch's filler) must not make the soft weights NaN.
    logits = jnp.where(allowed, ATTENTION_SHARPNESS * matches * rank / (self.max_len + 1), -1e9)
    extra = noise.gumbel(logits.shape)
    soft = jax.nn.softmax(logits if extra is None else logits + extra, -1)
    pattern = exact_straight_through(jax.nn.one_hot(hard_choice, q.shape[1], dtype=soft.dtype), soft)
    pattern = names.tap(self, f'{self.name}.pattern', pattern)  # a hook's gradient there (AtP*'s fix)
    self.sow('intermediates', 'pattern', pattern)
    return jnp.einsum('bij,bjk->bik', pattern, v)


class NumericalHead(nn.Module):
  """select(key, query, predicate) then aggregate_sum(ones): how many keys the predicate holds for; given
  ``numbers`` (``model.numerical_values``), aggregate_sum of the numerical variable it selects among them."""

  noise: Any = None
  relaxed: bool = False
  positions: bool = True  # False: query and key are selected among every variable but positions (head_reads)

  @nn.compact
  def __call__(self, stack: Array, allowed: Array, numbers: Array | None = None) -> Array:
    """``numbers``: ``[variables, batch, time, 1]``, the values of ``numerical_names`` at every position."""
    noise = _Noise(self, self.noise, self.relaxed)
    readable = stack if self.positions else jnp.concatenate([stack[:1], stack[2:]])  # positions: variable 1
    q, k = (_select(self, name, readable, noise) for name in ('query', 'key'))
    card = stack.shape[-1]
    psi = self.param('predicate', nn.initializers.normal(1.0), (card, card))
    score = jnp.einsum('bik,kl,bjl->bij', q, psi, k)                  # psi[q value, k value], exactly
    extra = noise.logistic(score.shape)
    noisy = score if extra is None else score + extra
    soft = jnp.where(allowed, jax.nn.sigmoid(noisy / (noise.temperature if noise.relaxed else 1.0)), 0.0)
    values = jnp.arange(card, dtype=soft.dtype)
    # What each key adds: 1 (a count), or the value of the numerical variable selected, an integer exactly.
    added = 1.0 if numbers is None else _select(self, 'value', numbers, noise)[..., 0][:, None, :]
    if noise.relaxed:  # the relaxed sum, one-hot at the nearest integer as τ falls
      self.sow('intermediates', 'pattern', soft)
      total = jnp.minimum((soft * added).sum(-1), card - 1)
      return jax.nn.softmax(-(values - total[..., None]) ** 2 / noise.temperature, -1)
    selected = exact_straight_through((allowed & (noisy > 0)).astype(soft.dtype), soft)
    selected = names.tap(self, f'{self.name}.pattern', selected)
    self.sow('intermediates', 'pattern', selected)
    # An integer, exactly; a sum saturates at the largest value a variable holds.
    count = jnp.minimum((selected * added).sum(-1), card - 1)
    soft_count = jax.nn.softmax(-(values - count[..., None]) ** 2, -1)
    hard_count = jax.nn.one_hot(jax.lax.stop_gradient(count).astype(jnp.int32), card, dtype=count.dtype)
    return exact_straight_through(hard_count, soft_count)


def mlp_logits(p, x: Array) -> Array:
  """An MLP's scores of the value it writes, from the concatenated one-hots ``x`` of its two inputs: one hidden
  ReLU layer (the model and its decompiled table call this one function)."""
  h = nn.relu(x @ p['hidden_kernel'] + p['hidden_bias'])
  return h @ p['out_kernel'] + p['out_bias']


class ProgramMLP(nn.Module):
  """A lookup table from the values of two selected variables to a value, learned as a small MLP."""

  hidden: int
  noise: Any = None
  relaxed: bool = False

  @nn.compact
  def __call__(self, stack: Array) -> Array:
    noise = _Noise(self, self.noise, self.relaxed)
    x = jnp.concatenate([_select(self, name, stack, noise) for name in ('first', 'second')], -1)
    card = stack.shape[-1]
    shapes = {'hidden_kernel': (2 * card, self.hidden), 'hidden_bias': (self.hidden,),
              'out_kernel': (self.hidden, card), 'out_bias': (card,)}
    p = {name: self.param(name, nn.initializers.lecun_normal() if name.endswith('kernel') else nn.initializers.zeros,
                          shape) for name, shape in shapes.items()}
    return noise.choose(mlp_logits(p, x))


def is_numerical(cfg: ModelConfig) -> list[bool]:
  """Per variable of ``variable_names(cfg)``: whether it holds a number (a numerical head's)."""
  first = cfg.num_heads - cfg.program.numerical_heads
  return [name.startswith('attn_') and int(name.rsplit('_', 1)[1]) >= first for name in variable_names(cfg)]


def readout_table(weights: Array, cfg: ModelConfig) -> Array:
  """The classifier as a row per value of every variable, ``[vocab, variables · card + 1]`` (the bias last),
  from its parameter ``weights``: that table itself, or with ``model.numerical_readout='linear'`` the
  categorical variables' rows, one column per numerical variable and the bias, a value v of a numerical
  variable reading v times its column."""
  if cfg.program.numerical_readout != 'linear':
    return weights
  card, at, blocks = cardinality(cfg), 0, []
  for numerical in is_numerical(cfg):
    if numerical:
      blocks.append(weights[:, at:at + 1] * jnp.arange(card, dtype=weights.dtype))
      at += 1
    else:
      blocks.append(weights[:, at:at + card])
      at += card
  return jnp.concatenate(blocks + [weights[:, at:]], -1)


def readout_mask(weights: list[Array], card: int) -> Array:
  """The readout table's columns that the chosen variables own (model.readout_reads): 1 − Π_i (1 − w_i) per
  variable over the selections' one-hots ``w_i`` (a variable two of them choose counts once; exactly 0 or 1
  in the forward pass, the selections' gradients through it), repeated over its ``card`` values, and 1 for
  the bias."""
  chosen = 1.0 - jnp.prod(1.0 - jnp.stack(weights), 0)
  return jnp.concatenate([jnp.repeat(chosen, card), jnp.ones((1,), chosen.dtype)])


def readout_of(params, cfg: ModelConfig) -> Array:
  """The classifier the program runs, ``[vocab, variables · card + 1]``, from the model's ``params``: the
  ``readout_table``, zero outside the variables that the selections ``select_readout_{i}`` choose (their
  argmax) where ``model.readout_reads`` is set."""
  table = readout_table(params['readout'], cfg)
  if not cfg.program.readout_reads:
    return table
  n = len(variable_names(cfg))
  chosen = [jax.nn.one_hot(jnp.argmax(params[f'select_readout_{i}']), n, dtype=table.dtype)
            for i in range(cfg.program.readout_reads)]
  return table * readout_mask(chosen, cardinality(cfg))


def readout_group_norm(table: Array, card: int) -> Array:
  """Σ_v ‖W_v‖₂ over the readout ``table`` [vocab, variables · card + 1]: W_v the columns that variable v's
  one-hot reads (the bias column left out). A group lasso on it drives whole variables out of the classifier
  (``config.readout_sparsity``); the 1e-12 keeps its gradient finite at W_v = 0."""
  blocks = table[:, :-1].reshape(table.shape[0], -1, card)
  return jnp.sqrt(jnp.square(blocks).sum((0, 2)) + 1e-12).sum()


class TransformerProgram(nn.Module):
  """A Transformer Program over token ids; returns logits ``[batch, time, vocab]`` (float32). Same interface as
  ``Transformer``; with ``return_hidden`` it returns (every variable's one-hot and a 1, the readout table)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, tokens: Array, key_mask: Array | None = None, deterministic: bool = True,
               return_hidden: bool = False, edges: Array | None = None, gumbel_scale: Any = None):
    del deterministic, edges
    cfg = self.config
    batch, time = tokens.shape
    if time > cfg.max_len:
      raise InputError(f'sequence length {time} exceeds model.max_len = {cfg.max_len}; '
                       f'shorten the input or raise model.max_len')
    if time == 0:
      raise InputError('sequence length 0: give at least one token')
    card = cardinality(cfg)
    scale = cfg.program.gumbel_scale if gumbel_scale is None else gumbel_scale
    scale = scale if cfg.samples_argmaxes else None
    relaxed = cfg.program.relaxed
    positions = jnp.broadcast_to(jnp.arange(time), (batch, time))
    stack = [jax.nn.one_hot(tokens, card), jax.nn.one_hot(positions, card)]
    allowed = jnp.ones((batch, time, time), bool) if key_mask is None else jnp.broadcast_to(
        key_mask[:, None, :].astype(bool), (batch, time, time))
    if cfg.causal:
      allowed = allowed & jnp.tril(jnp.ones((time, time), bool))
    first_numerical = cfg.num_heads - cfg.program.numerical_heads
    numbers = [jnp.ones((batch, time, 1))]            # numerical_names: ones, then the numerical heads'
    for l in range(cfg.num_layers):
      read = jnp.stack(stack)
      read_numbers = jnp.stack(numbers) if cfg.program.numerical_values else None
      for h in range(cfg.num_heads):
        if h < first_numerical:
          stack.append(CategoricalHead(cfg.max_len, scale, relaxed, cfg.program.attention_noise,
                                       name=f'attn_{l}_{h}')(read, allowed))
        else:
          stack.append(NumericalHead(scale, relaxed, cfg.program.numerical_positions, name=f'attn_{l}_{h}')(
              read, allowed, read_numbers))
          if cfg.program.numerical_values:
            numbers.append(stack[-1] @ jnp.arange(card, dtype=stack[-1].dtype)[:, None])  # its value, a number
      read = jnp.stack(stack)
      for m in range(cfg.program.mlps):
        stack.append(ProgramMLP(cfg.program.mlp_hidden, scale, relaxed, name=f'mlp_{l}_{m}')(read))
    if names.active():  # the variables as the readout reads them (edge patching); the training pass skips it
      stack = list(names.tap(self, 'readout', jnp.stack(stack)))
    hidden = jnp.concatenate(stack + [jnp.ones((batch, time, 1))], -1)
    numerical = sum(is_numerical(cfg)) if cfg.program.numerical_readout == 'linear' else 0
    width = hidden.shape[-1] - numerical * (card - 1)  # a linear numerical variable: one column, not card
    table = readout_table(self.param('readout', nn.initializers.normal(0.1), (cfg.vocab_size, width)), cfg)
    if cfg.program.readout_reads:
      # The variables the classifier reads: their argmax in evaluation (the program), a Gumbel-softmax sample
      # while training even where the rest is straight-through. A hard choice trains only the rows of the
      # variable it holds, so no other variable's rows could ever win it (docs/results/programs_steps.md).
      noise = _Noise(self, scale, relaxed)
      chosen = [noise.sample(self.param(f'select_readout_{i}', nn.initializers.normal(1.0), (len(stack),)))
                for i in range(cfg.program.readout_reads)]
      table = table * readout_mask(chosen, card)
    if return_hidden:
      return hidden, table
    return jnp.einsum('btd,vd->btv', hidden, table)
