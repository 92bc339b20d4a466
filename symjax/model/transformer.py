"""The three model families: standard, Token-Factored and Symbolic Transformer.

"Symbolic Transformers" (Kerce & Fox 2025):
- Token-Factored block (§4, eqs. 6-15): the hidden state is two streams X = X_t + X_e. Attention reads
  LayerNorm(X_t + X_e) for queries and keys, takes values from X_t alone through the Kronecker-lifted map,
  and updates only X_t; the FFN reads LayerNorm(X_t + X_e) and updates only X_e. X_t^0 is the token
  embedding, X_e^0 = 0, and positions enter only through ALiBi.
- Symbolic block (§5, Algorithm 1): the same with channel-wise LayerNorm, values VocabProj(X_t W̃_V)
  (eq. 27) and the VocabFFN (eq. 19), so every update is a convex mixture of each channel's embeddings.
- Standard block: a pre-LayerNorm GPT-style block, the baseline.

``Transformer(config)`` builds any of them; ``ModelConfig.symbolic.symbolic_layers`` applies the symbolic constraints
to selected layers only (the paper's "selective constraint application", §6.3.3), the others being
Token-Factored.

The intermediates every block sows are listed, with their shapes, in ``symjax.model.intermediates``.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen.dtypes import promote_dtype

from symjax.model import attention as attn
from symjax.model import intermediates as names
from symjax.model import mixing, relational, symbolic
from symjax.model.config import (  # noqa: F401  (re-exported)
  CHANNEL_NORM_SCALES,
  DTYPES,
  MODEL_KINDS,
  POSITIONS,
  REMAT_POLICIES,
  SYMBOLIC_SITES,
  VALUE_MAPS,
  ModelConfig,
)
from symjax.model.transformer_program import TransformerProgram
from symjax.ops import dense, readout
from symjax.system.errors import InputError
from symjax.system.mesh import EMBED, VOCAB  # logical axis names of the parameters
from symjax.system.mesh import MLP as MLP_AXIS

Array = jax.Array
# The collection per-layer supervision reads: LN_f of every block's decoded state, ``decoded_{l}``.
PLS = 'pls'


class Dense(nn.Dense):
  """``nn.Dense`` with a bias (the same parameters, names and initialisers) computed by
  ``ops.dense.biased_dense``. It reads the fields the MLP sets: features, dtype, param_dtype and the
  initialisers."""

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    if not self.use_bias or self.precision is not None:
      raise ValueError('model.transformer.Dense has a bias and the default precision; use nn.Dense otherwise')
    kernel = self.param('kernel', self.kernel_init, (jnp.shape(inputs)[-1], self.features), self.param_dtype)
    bias = self.param('bias', self.bias_init, (self.features,), self.param_dtype)
    inputs, kernel, bias = promote_dtype(inputs, kernel, bias, dtype=self.dtype)
    return dense.biased_dense(inputs, kernel, bias)


class MLP(nn.Module):
  """W2 gelu(W1 x + b1) + b2, d_model -> ff_dim -> d_model (GELU: tanh approximation)."""

  ff_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    init = lambda names: nn.with_logical_partitioning(nn.initializers.normal(0.02), names)
    h = nn.gelu(Dense(self.ff_dim, dtype=self.dtype, kernel_init=init((EMBED, MLP_AXIS)), name='wi')(x))
    h = names.hook(self, 'ffn.hidden', h)
    return Dense(x.shape[-1], dtype=self.dtype, kernel_init=init((MLP_AXIS, EMBED)), name='wo')(h)


def attention_layer(config: ModelConfig, output_projection: bool, gumbel_scale=None) -> attn.Attention:
  """The attention layer a block of ``config`` builds: with the output projection (standard blocks) or without
  it (factored blocks, which may map their heads' outputs by ``head_mixing``); positions by ALiBi or RoPE."""
  masks, kernels, program = config.mask_predicates(), config.kernels, config.program
  positions, streams = config.attention.positions, config.streams
  return attn.Attention(config.num_heads, config.head_dim, mask=masks[0] if len(masks) == 1 else masks,
                        alibi=positions == 'alibi', learned_slopes=config.attention.learned_slopes,
                        output_projection=output_projection, dropout_rate=config.training.attention_dropout_rate,
                        block_size=kernels.attention_block, impl=kernels.attention_impl, dtype=config.compute_dtype,
                        hard=program.hard, numerical_heads=program.numerical_heads, gumbel_scale=gumbel_scale,
                        numerical_positions=program.numerical_positions, rope=positions == 'rope',
                        gate=streams.gate, head_mixing=streams.head_mixing, name='attention')


def ffn_layer(config: ModelConfig) -> nn.Module:
  """The MLP FFN of standard and Token-Factored layers: dense, or one per channel (``ffn_mixing``)."""
  if config.streams.ffn_mixing == 'independent':
    return mixing.ChannelMLP(config.num_heads, config.ff_dim, config.compute_dtype, name='ffn')
  return MLP(config.ff_dim, config.compute_dtype, name='ffn')


class StandardBlock(nn.Module):
  """Pre-LayerNorm block: x += Attn(LN(x)); x += MLP(LN(x))."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, key_mask: Array | None = None, deterministic: bool = True,
               edges: relational.Edges | None = None, prefix: tuple[Array, Array] | None = None) -> Array:
    cfg = self.config
    drop = nn.Dropout(cfg.training.dropout_rate, deterministic=deterministic)
    ln = lambda name: nn.LayerNorm(cfg.layer_norm_epsilon, dtype=cfg.compute_dtype, name=name)
    norm = ln('norm_attn')
    # Each head's query, key and value from an input of its own (edge patching), through the same norm.
    split = tuple(norm(names.tap(self, f'attn.{p}_input', names.per_head(x, cfg.num_heads))) for p in 'qkv') \
        if names.splits(self) else None
    x = x + drop(attention_layer(cfg, True)(norm(x), key_mask=key_mask, deterministic=deterministic,
                                            edges=edges, prefix=prefix, split=split))
    x = names.hook(self, 'resid_mid', x)
    pre = names.hook(self, 'ffn.pre', ln('norm_ffn')(names.tap(self, 'ffn.in', x)))
    x = x + drop(names.hook(self, 'ffn.out', ffn_layer(cfg)(pre)))
    return names.hook(self, 'resid', x)


class FactoredBlock(nn.Module):
  """Token-Factored block (eqs. 6-15), or with ``symbolic=True`` the Symbolic block (Algorithm 1).

  ``model.stream`` chooses the stream each sublayer writes (the dual-stream family's modes): attention X_t
  and the FFN X_e (the paper's), both X_e with X_t left as the embedding ('cascade'), or both X_t ('single').

  Takes and returns the streams ``(x_t, x_e)``, each ``[batch, time, d_model]``; ``table`` is the input
  embedding table ``[vocab, d_model]`` that the symbolic vocabulary projections mix. ``prefix`` (both
  blocks): the attention's keys and values of earlier positions (``attention.Attention``).
  """

  config: ModelConfig
  symbolic: bool = False
  gumbel_scale: Any = None  # program training's noise scale in this call (Transformer's gumbel_scale)

  @nn.compact
  def __call__(self, x_t: Array, x_e: Array, table: Array, key_mask: Array | None = None,
               deterministic: bool = True, edges: relational.Edges | None = None,
               prefix: tuple[Array, Array] | None = None) -> tuple[Array, Array]:
    cfg = self.config
    drop = nn.Dropout(cfg.training.dropout_rate, deterministic=deterministic)
    stream = cfg.streams.stream
    # Attention: values from X_t alone (eq. 8 / eq. 27); the paper's stream updates X_t only (eq. 12 / eq. 28).
    # Edge patching gives each head's query, key and value an input of its own (``names.splits``).
    split = names.splits(self)
    heads = lambda p, x: names.tap(self, f'attn.{p}_input', names.per_head(x, cfg.num_heads))
    values, edges = self._values(heads('v', x_t) if split else x_t, table, edges)
    offset = 0 if prefix is None else prefix[0].shape[1]
    norm = self._norm('norm_attn')
    own = tuple(norm(heads(p, x_t + x_e)) for p in 'qk') if split else ()
    x_attn, positions, own = self._attention_input(norm(x_t + x_e), offset, own)
    split = (*own, None) if split else None
    delta = attention_layer(cfg, False, self.gumbel_scale)(x_attn, values=values, key_mask=key_mask,
                                                           deterministic=deterministic, edges=edges,
                                                           positions=positions, prefix=prefix,
                                                           gate_input=self._gate_input(x_t), split=split)
    delta = drop(self._counts(delta, table))
    x_t, x_e = (x_t, x_e + delta) if stream == 'cascade' else (x_t + delta, x_e)
    x_t, x_e = names.hook(self, 'x_t_mid', x_t), names.hook(self, 'x_e_mid', x_e)
    if names.active():
      names.hook(self, 'resid_mid', x_t + x_e, replaceable=False)
    # FFN: reads the whole state; the paper's stream updates X_e only (eqs. 13-15 / Algorithm 1 lines 6-8).
    x_ffn = names.hook(self, 'ffn.pre', self._norm('norm_ffn')(names.tap(self, 'ffn.in', x_t + x_e)))
    delta = drop(names.hook(self, 'ffn.out', self._ffn(x_ffn, table)))
    x_t, x_e = (x_t + delta, x_e) if stream == 'single' else (x_t, x_e + delta)
    x_t, x_e = names.hook(self, 'x_t', x_t), names.hook(self, 'x_e', x_e)
    if names.active():
      names.hook(self, 'resid', x_t + x_e, replaceable=False)
    return x_t, x_e

  def _norm(self, name: str) -> nn.Module:
    """Channel-wise LayerNorm in a symbolic block (eq. 20) and with ``channel_norm``, LayerNorm over the
    whole state otherwise."""
    cfg = self.config
    if self.symbolic or (cfg.kind == 'token_factored' and cfg.streams.channel_norm):
      return symbolic.ChannelLayerNorm(cfg.num_heads, cfg.symbolic.channel_norm_scale, cfg.layer_norm_epsilon,
                                       name=name)
    return nn.LayerNorm(cfg.layer_norm_epsilon, dtype=cfg.compute_dtype, name=name)

  def _gate_input(self, x_t: Array) -> Array | None:
    """What the 'symbolic' attention gate reads: the channel LayerNorm of X_t, ``[batch, time, heads,
    head_dim]``."""
    cfg = self.config
    if cfg.streams.gate != 'symbolic':
      return None
    norm = symbolic.ChannelLayerNorm(cfg.num_heads, cfg.symbolic.channel_norm_scale, cfg.layer_norm_epsilon,
                                     name='norm_gate')
    return symbolic.split_channels(norm(x_t), cfg.num_heads)

  def _values(self, x_t: Array, table: Array, edges: relational.Edges | None):
    """The values W_head ⊗ I applied to X_t (eq. 8), projected onto the vocabulary in a symbolic block
    (eq. 27); with edges, each edge token's value too."""
    cfg, options, kernels = self.config, self.config.symbolic, self.config.kernels
    if options.value_map == 'none':
      value_map = lambda x: symbolic.split_channels(x, cfg.num_heads)
    elif options.value_map.startswith('kronecker_'):
      value_map = symbolic.KroneckerValue(cfg.num_heads, options.value_map.removeprefix('kronecker_'),
                                          name='value_map')
    else:
      value_map = mixing.head_map(options.value_map, cfg.num_heads, 'value_map')
    project = self.symbolic and cfg.symbolic_site('values')
    if project:
      projection = symbolic.VocabProjection(cfg.num_heads, options.tau_init, kernels.vocab_projection,
                                            kernels.vocab_chunk_size, cfg.num_valid_rows, options.projection_gain,
                                            hard=cfg.program.hard, gumbel_scale=self.gumbel_scale,
                                            name='value_projection')
    # A per-head input [..., heads, d_model] (edge patching): head h's value is channel h of its own input's map.
    own = lambda v, x: jnp.diagonal(v, axis1=-3, axis2=-2).swapaxes(-1, -2) if x.ndim == 4 and edges is None else v
    value = lambda x: projection(own(value_map(x), x), table) if project else own(value_map(x), x)
    values = value(x_t)
    if edges is None:
      return values, None
    # Relational attention: the value node i reads from node j is v_j + ve_ij with ve_ij the same value map
    # of the edge's token embedding (computed once per vocabulary row, gathered per pair), so a value stays a
    # combination of token embeddings. Symbolic values average the two projected mixtures, ½(α_j E + α_ij E),
    # which is again a convex mixture.
    edge_values = value(edges.table)              # per edge token: [vocab, heads, head_dim]
    if project:
      values, edge_values = 0.5 * values, 0.5 * edge_values
    return values, relational.Edges(edges.ids, edges.table, edge_values)

  def _attention_input(self, x_attn: Array, offset: int = 0, heads: tuple = ()
                       ) -> tuple[Array, Array | None, tuple]:
    """(the attention's input, position rows for its categorical heads alone or None, ``heads``): learned position
    rows (``model.qk_positions``, from row ``offset``) are added to the input, or passed apart without
    ``numerical_positions``; ``heads``, per-head inputs ``[batch, time, heads, d_model]`` (edge patching), get
    the same rows."""
    cfg = self.config
    if not cfg.attention.qk_positions:
      return x_attn, None, heads
    # Scale comparable to the unit-variance LayerNorm output it is added to (std 0.5 is what was measured).
    pos = self.param('qk_position', nn.with_logical_partitioning(nn.initializers.normal(0.5), (None, EMBED)),
                     (cfg.max_len, cfg.d_model))
    positions = pos[offset:offset + x_attn.shape[-2]].astype(x_attn.dtype)
    if not cfg.program.numerical_positions:
      return x_attn, positions, heads
    return x_attn + positions, None, tuple(h + positions[:, None] for h in heads)

  def _counts(self, delta_t: Array, table: Array) -> Array:
    """A numerical head's count becomes a token of its channel (a mixture when soft)."""
    cfg = self.config
    if not cfg.program.numerical_heads:
      return delta_t
    first = cfg.num_heads - cfg.program.numerical_heads
    counts = symbolic.CountProjection(cfg.num_heads, first, cfg.max_len, cfg.num_valid_rows, cfg.program.hard,
                                      self.gumbel_scale, name='count_projection')
    return symbolic.merge_channels(counts(symbolic.split_channels(delta_t, cfg.num_heads), table))

  def _ffn(self, x_ffn: Array, table: Array) -> Array:
    """The FFN update of X_e: the vocabulary FFN in a symbolic block (Algorithm 1 lines 6-8), else an MLP."""
    cfg, options, kernels = self.config, self.config.symbolic, self.config.kernels
    if self.symbolic and cfg.symbolic_site('ffn'):
      width = cfg.ff_dim if options.vocab_ffn == 'dense' else options.ff_dim_per_head
      return symbolic.VocabFFN(cfg.num_heads, width, options.tau_init, kernels.vocab_projection,
                               kernels.vocab_chunk_size, cfg.num_valid_rows, cfg.compute_dtype,
                               gain=options.projection_gain, mixing=options.vocab_ffn, weights=options.ffn_mixture,
                               hard=cfg.program.hard, gumbel_scale=self.gumbel_scale, name='ffn')(x_ffn, table)
    return ffn_layer(cfg)(x_ffn)


class Transformer(nn.Module):
  """A language model / tagger over token ids; returns logits ``[batch, time, vocab]`` in float32.

  Readout: LN_f(X_t + X_e) Eᵀ with the input embedding table E when ``tie_embeddings`` (channel LayerNorm
  for symbolic models), else a separate ``[vocab, d_model]`` table. With ``return_hidden=True`` it returns
  ``(LN_f(X_t + X_e), readout table)`` instead, for losses that stream over the vocabulary.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, tokens: Array, key_mask: Array | None = None, deterministic: bool = True,
               return_hidden: bool = False, edges: Array | None = None, gumbel_scale: Any = None):
    """tokens: ``[batch, time]`` ints; key_mask: ``[batch, time]``, False for padding keys; edges (with
    ``relational``): ``[batch, time, time]`` token ids of the edge i -> j, -1 where there is none.
    gumbel_scale: program training's noise scale for this call (the trainer's annealed value; default
    ``model.gumbel_scale``); it is drawn only when the call is given the ``program.GUMBEL_RNG`` stream."""
    cfg = self.config
    time = tokens.shape[-1]
    if time > cfg.max_len:
      raise InputError(f'sequence length {time} exceeds model.max_len = {cfg.max_len}; '
                       f'shorten the input or raise model.max_len')
    if time == 0:
      raise InputError('sequence length 0: give at least one token')
    embed = _embed(cfg)
    x = embed(tokens)
    table = embed.embedding
    graph = None
    if cfg.attention.relational:
      if edges is None or edges.shape != (*tokens.shape, time):
        raise InputError(f'model.relational needs edges of shape {(*tokens.shape, time)} (a graph task), '
                         f'got {None if edges is None else edges.shape}')
      graph = relational.Edges(edges, table)
    if cfg.kind == 'standard':
      if cfg.attention.positions == 'learned':
        pos = self.param('pos_embedding', nn.initializers.normal(0.02), (cfg.max_len, cfg.d_model))
        x = x + pos[:time].astype(x.dtype)
      state = names.hook(self, 'embed', x)
    else:
      state = names.hook(self, 'embed', input_stream(cfg, x)), jnp.zeros_like(x)
    decode = cfg.streams.pls_weight > 0 and (names.active() or self.is_mutable_collection(PLS))
    h, layers = blocks(self, state, table, key_mask, deterministic, graph, gumbel_scale, decode_layers=decode)
    if layers and self.is_mutable_collection(PLS):
      for l, h_l in enumerate(layers):
        self.sow(PLS, f'decoded_{l}', h_l)
    out_table = _readout_table(self, cfg, table)
    if layers and names.active():  # each layer's readout through the shared head, as PLS trains it
      for l, h_l in enumerate(layers):
        names.hook(self, f'blocks.{l}.pls.logits', readout.logits(h_l, out_table)[..., :cfg.vocab_size])
    return _readout(self, cfg, names.hook(self, 'final.norm', h), out_table, return_hidden)


class Suffix(nn.Module):
  """Blocks ``first``… of the ``Transformer`` of the same config and parameters, over positions P… of an
  input whose first P positions are given as each block's attention keys and values (``prefix``). In a
  causal model, positions before P do not depend on those after, so this is the pass over a suffix when the
  prefix is unchanged: patching sweeps recompute only what follows a patched position with it. Returns the
  logits ``[batch, time − P, vocab]``."""

  config: ModelConfig
  first: int = 0

  @nn.compact
  def __call__(self, state, prefix: dict[int, tuple[Array, Array]], key_mask: Array | None = None) -> Array:
    """state: the input of block ``first`` at positions P…: x (standard) or (x_t, x_e), each ``[batch,
    time − P, d_model]``; prefix: {block: (keys, values) ``[batch, P, heads, head_dim]``}; key_mask:
    ``[batch, time]``."""
    table = _embed(self.config).embedding
    h, _ = blocks(self, state, table, key_mask, first=self.first, prefix=prefix)
    return _readout(self, self.config, names.hook(self, 'final.norm', h), _readout_table(self, self.config, table),
                    False)


def blocks(module: nn.Module, state, table: Array, key_mask: Array | None = None, deterministic: bool = True,
           graph: relational.Edges | None = None, gumbel_scale: Any = None, first: int = 0,
           prefix: dict[int, tuple[Array, Array]] | None = None, decode_layers: bool = False):
  """LN_f of the state after blocks ``first``… of ``module`` (a ``Transformer`` or ``Suffix``): ``state`` is x
  (standard) or (x_t, x_e) entering block ``first``; ``prefix`` {block: its earlier positions' keys and
  values}. With ``decode_layers`` (per-layer supervision) it returns (that, [LN_f of each block's decoded
  state]) — the same norm, whose parameters every layer shares — and (that, []) otherwise; a ``Suffix``
  takes the first alone."""
  cfg, prefix = module.config, prefix or {}
  if gumbel_scale is None and cfg.program.gumbel_scale > 0:
    gumbel_scale = cfg.program.gumbel_scale
  norm = final_norm(cfg)
  layers = []
  if cfg.kind == 'standard':
    x, block = state, _remat(StandardBlock, cfg, static_argnums=(3,))
    for l in range(first, cfg.num_layers):
      x = block(cfg, name=f'layer_{l}')(x, key_mask, deterministic, graph, prefix.get(l))
      if decode_layers:
        layers.append(norm(x))
    return norm(names.tap(module, 'final.in', x)), layers
  (x_t, x_e), block = state, _remat(FactoredBlock, cfg, static_argnums=(5,))
  for l, kind in enumerate(cfg.layer_kinds()):
    if l >= first:
      x_t, x_e = block(cfg, kind == 'symbolic', gumbel_scale, name=f'layer_{l}')(x_t, x_e, table, key_mask,
                                                                                 deterministic, graph, prefix.get(l))
      if decode_layers:
        layers.append(norm(x_e if cfg.streams.pls_source == 'x_e' else x_t + x_e))
  return norm(names.tap(module, 'final.in', x_t + x_e)), layers


def final_norm(cfg: ModelConfig) -> nn.Module:
  """LN_f: a channel LayerNorm where the blocks' norms are (``ModelConfig.channel_norms``), else LayerNorm."""
  if cfg.channel_norms:
    return symbolic.ChannelLayerNorm(cfg.num_heads, cfg.symbolic.channel_norm_scale, cfg.layer_norm_epsilon,
                                     name='norm_final')
  return nn.LayerNorm(cfg.layer_norm_epsilon, dtype=cfg.compute_dtype, name='norm_final')


def input_stream(cfg: ModelConfig, x: Array) -> Array:
  """X_t⁰ from the token embeddings ``[..., d_model]``: themselves, or in 'cascade' with ``cascade_norm``
  their channel LayerNorm, without parameters (the frozen token stream then has unit scale per channel)."""
  if not cfg.streams.cascade_norm:
    return x
  xh = symbolic.split_channels(x, cfg.num_heads).astype(jnp.float32)
  mean = xh.mean(-1, keepdims=True)
  std = jnp.sqrt(jnp.square(xh - mean).mean(-1, keepdims=True))
  return symbolic.merge_channels((xh - mean) / (std + cfg.layer_norm_epsilon)).astype(x.dtype)


def check_token_ids(ids, vocab_size: int, what: str = 'token ids') -> None:
  """ValueError naming the ids of concrete ``ids`` outside ``[0, vocab_size)``: out of range, JAX's embedding
  lookup gives NaN rather than an error (the tools and the sampler check their inputs with this)."""
  ids = np.asarray(ids)
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    bad = sorted({int(t) for t in ids.ravel() if not 0 <= t < vocab_size})
    raise InputError(f"{what} must be in [0, {vocab_size}) (the model's vocabulary), got {bad[:10]}")


def _embed(cfg: ModelConfig) -> nn.Embed:
  table_init = nn.with_logical_partitioning(nn.initializers.normal(cfg.training.embed_init_std), (VOCAB, EMBED))
  return nn.Embed(cfg.padded_vocab_size, cfg.d_model, dtype=cfg.compute_dtype, embedding_init=table_init,
                  name='embed')


def _readout(module: nn.Module, cfg: ModelConfig, h: Array, table: Array, return_hidden: bool):
  """Logits h Eᵀ over the real vocabulary with the readout's ``table`` (``_readout_table``), or (h, table) for
  a streamed loss."""
  if return_hidden:
    return h, table
  return names.hook(module, 'final.logits', readout.logits(h, table)[..., :cfg.vocab_size])


def _readout_table(module: nn.Module, cfg: ModelConfig, table: Array) -> Array:
  """The readout's table: the input embedding table when tied, else the ``readout`` parameter."""
  if cfg.tie_embeddings:
    return table
  return module.param('readout', nn.with_logical_partitioning(nn.initializers.normal(0.02), (VOCAB, EMBED)),
                      (cfg.padded_vocab_size, cfg.d_model))


class LSTM(nn.Module):
  """The recurrent baseline: embedding, ``num_layers`` LSTMs of width d_model, LayerNorm, tied readout.
  Same interface as ``Transformer`` (``key_mask`` is unused: it reads left to right; ``edges`` too: the
  config refuses ``relational`` for it)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, tokens: Array, key_mask: Array | None = None, deterministic: bool = True,
               return_hidden: bool = False, edges: Array | None = None):
    del key_mask, deterministic, edges
    cfg = self.config
    embed = _embed(cfg)
    x = embed(tokens)
    for l in range(cfg.num_layers):
      x = nn.RNN(nn.OptimizedLSTMCell(cfg.d_model, param_dtype=jnp.float32), name=f'lstm_{l}')(x)
    h = nn.LayerNorm(cfg.layer_norm_epsilon, dtype=cfg.compute_dtype, name='norm_final')(x)
    return _readout(self, cfg, h, _readout_table(self, cfg, embed.embedding), return_hidden)


def for_backend(config: ModelConfig, backend: str | None = None) -> ModelConfig:
  """The config with its cuDNN kernels replaced by portable ones of the same mathematics (explicit
  attention, streamed projection) when ``backend`` (default: JAX's) is not a GPU: a model trained with them
  on a GPU then loads, samples and is read anywhere."""
  if (backend or jax.default_backend()) == 'gpu':
    return config
  kernels = config.kernels
  return config.replace(
      attention_impl='explicit' if kernels.attention_impl == 'cudnn' else kernels.attention_impl,
      vocab_projection='streamed' if kernels.vocab_projection == 'cudnn' else kernels.vocab_projection)


def build(config: ModelConfig) -> nn.Module:
  """The model ``config.kind`` names."""
  if config.kind == 'program':
    return TransformerProgram(config)
  return LSTM(config) if config.kind == 'lstm' else Transformer(config)


def _remat(block_cls, cfg: ModelConfig, static_argnums):
  """The block class, rematerialised by ``cfg.kernels.remat`` (argument indices count ``self`` as 0)."""
  if cfg.kernels.remat == 'none':
    return block_cls
  return nn.remat(block_cls, policy=REMAT_POLICIES[cfg.kernels.remat], static_argnums=static_argnums)


def param_shapes(config: ModelConfig, seq_len: int = 8) -> Any:
  """The parameter tree as ``jax.ShapeDtypeStruct``s, without allocating anything."""
  tokens = jax.ShapeDtypeStruct((1, min(seq_len, config.max_len)), jnp.int32)
  return nn.meta.unbox(jax.eval_shape(build(config).init, jax.random.key(0), tokens)['params'])


def count_params(config: ModelConfig) -> int:
  """Number of parameters, from shapes alone."""
  return sum(int(x.size) for x in jax.tree.leaves(param_shapes(config)))
