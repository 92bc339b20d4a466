"""The three model families: standard, Token-Factored and Symbolic Transformer.

"Symbolic Transformers" (Kerce & Fox 2025):
- Token-Factored block (§4, eqs. 6-15): the hidden state is two streams X = X_t + X_e. Attention reads
  LayerNorm(X_t + X_e) for queries and keys, takes values from X_t alone through the Kronecker-lifted map,
  and updates only X_t; the FFN reads LayerNorm(X_t + X_e) and updates only X_e. X_t^0 is the token
  embedding, X_e^0 = 0, and positions enter only through ALiBi.
- Symbolic block (§5, Algorithm 1): the same with channel-wise LayerNorm, values VocabProj(X_t W̃_V)
  (eq. 27) and the VocabFFN (eq. 19), so every update is a convex mixture of each channel's embeddings.
- Standard block: a pre-LayerNorm GPT-style block, the baseline.

``Transformer(config)`` builds any of them; ``ModelConfig.symbolic_layers`` applies the symbolic constraints
to selected layers only (the paper's "selective constraint application", §6.3.3), the others being
Token-Factored.

Intermediates sown into the ``intermediates`` collection (read them with
``model.apply(variables, tokens, mutable=['intermediates'])``); every value is a 1-tuple:

  ``x_t_0``, ``x_e_0``                       [batch, time, d_model]  two-stream models: X_t^0, X_e^0
  ``x_0``                                    [batch, time, d_model]  standard model: input to layer 0
  ``layer_{l}/x_t_attn``, ``x_e_attn``       [batch, time, d_model]  streams after layer l's attention
  ``layer_{l}/x_t_ffn``, ``x_e_ffn``         [batch, time, d_model]  streams after layer l's FFN
  ``layer_{l}/x_attn``, ``x_ffn``            [batch, time, d_model]  standard blocks: the residual stream
  ``layer_{l}/attention/weights``            [batch, heads, time, time]
  ``layer_{l}/value_projection/mixture``     [batch, time, heads, vocab]  symbolic: α of the values
  ``layer_{l}/ffn/projection/mixture``       [batch, time, heads, vocab]  symbolic: α of the FFN update
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from symjax import attention as attn
from symjax import symbolic

Array = jax.Array

MODEL_KINDS = ('standard', 'token_factored', 'symbolic', 'lstm')  # lstm: a recurrent baseline
POSITIONS = ('alibi', 'learned')
VALUE_MAPS = ('kronecker_identity', 'kronecker_normal', 'none')
CHANNEL_NORM_SCALES = ('vector', 'scalar')
SYMBOLIC_SITES = ('both', 'values', 'ffn')  # which sites of a symbolic layer are vocabulary-projected
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
REMAT_POLICIES = {'full': None, 'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable}
# Logical axis names of parameters (mapped to mesh axes by the config's sharding rules).
from symjax.mesh import EMBED, VOCAB  # noqa: E402  (logical axis names of the parameters)
from symjax.mesh import MLP as MLP_AXIS  # noqa: E402


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Everything that defines a model. ``d_model = num_heads * head_dim``."""

  kind: str = 'symbolic'               # one of MODEL_KINDS
  vocab_size: int = 16
  num_layers: int = 2
  num_heads: int = 4
  head_dim: int = 16
  ff_dim: int = 256                    # FFN hidden width (standard and Token-Factored blocks)
  ff_dim_per_head: int = 64            # VocabFFN hidden width per channel (symbolic blocks)
  max_len: int = 64                    # longest sequence accepted (learned positions need it)
  causal: bool = True                  # causal or bidirectional attention
  window: int = 0                      # > 0: also restrict attention to |i - j| < window
  # Any mask of the algebra (symjax.attention.MASK_GRAMMAR), e.g. 'causal & (window(8) | stride(8))', or
  # per-head masks 'causal & window(8); causal & stride(8)' (the heads split evenly between them). Empty:
  # causal or full as the task needs, with ``window``. It replaces both; a causal task needs a causal mask.
  mask: str = ''
  attention_block: int = 0             # > 0: score only the (query, key) blocks of this size the mask
                                       # allows (saves work for local masks; the same result)
  # Dense attention: 'explicit' (einsum, float32 scores; always used where weights are read), 'xla' or
  # 'cudnn' (jax.nn.dot_product_attention; 'cudnn' is the fused flash kernel, NVIDIA GPU and bfloat16).
  attention_impl: str = 'explicit'
  relational: bool = False             # Relational Attention over the task's graph edges (graph tasks)
  positions: str = 'alibi'             # standard model only; factored models always use ALiBi
  learned_slopes: bool = True          # ALiBi slopes learned (paper) or fixed at the reference sequence
  value_map: str = 'kronecker_identity'  # W̃_V = W_head ⊗ I with W_head = I or N(0, 0.02²); or V = X_t
  channel_norm_scale: str = 'vector'   # γ_h, β_h per feature ('vector') or per channel ('scalar')
  symbolic_layers: tuple[int, ...] | None = None  # symbolic model: which layers are symbolic (None: all)
  # Opt-in variants of the symbolic layers (the paper's model is 'both' without gain; see README, "The
  # Symbolic Transformer against the baselines"): which sites go through the vocabulary projection —
  # 'both' (values and FFN, Algorithm 1), 'values' (the FFN is the Token-Factored MLP) or 'ffn' (values are
  # W_head ⊗ I of X_t, unprojected) — and whether each projection is scaled by a learned per-channel gain
  # g_h = exp(log_gain_h) > 0, so that every projected vector is g_h times a convex mixture.
  symbolic_sites: str = 'both'
  projection_gain: bool = False
  # What each channel's VocabFFN reads: 'channel' (eq. 20, FFN_h(x_h), width ff_dim_per_head) or 'dense'
  # (opt-in: one d_model -> ff_dim -> d_model MLP reads the whole state and channel h of its output is
  # projected; every update is still a convex mixture of the channel's embeddings, so nothing is lost to
  # the token reading).
  vocab_ffn: str = 'channel'
  # The weights of the FFN's vocabulary projections: 'convex' (eq. 22, softmax: every update a convex
  # mixture of the channel's embeddings) or 'nonnegative' (opt-in: softplus(z Eᵀ/τ)/|V|, so every update is
  # a non-negative combination of the channel's embeddings whose mass the model chooses per token; values
  # stay convex). Direct projection only.
  ffn_mixture: str = 'convex'
  # Opt-in, not the paper (where positions enter only through ALiBi): a learned absolute position embedding
  # added to the input of every factored layer's queries and keys — never to the streams or the values, so
  # a symbolic model's streams stay exact token mixtures. Factored kinds only; lengths up to max_len.
  qk_positions: bool = False
  tau_init: float = 1.0                # initial vocabulary-projection temperature τ_h
  vocab_projection: str = 'direct'     # 'direct' or 'streamed' (memory O(tokens·heads·chunk)), see symbolic
  vocab_chunk_size: int = 1024         # vocabulary rows per step of the streamed projection
  vocab_pad_multiple: int = 1          # embedding rows padded to a multiple (the 'vocab' mesh axis size);
                                       # padding rows never receive weight or probability
  remat: str = 'none'                  # rematerialise each block in the backward pass: 'none', 'full',
                                       # or 'dots' (keep matrix products, recompute the rest)
  tie_embeddings: bool = True          # readout uses the input embedding table
  embed_init_std: float = 0.02         # std of the token embedding initialisation
  dropout_rate: float = 0.0            # on the residual updates
  attention_dropout_rate: float = 0.0  # on the attention weights
  layer_norm_epsilon: float = 1e-5
  dtype: str = 'float32'               # compute dtype; parameters stay float32

  @property
  def d_model(self) -> int:
    return self.num_heads * self.head_dim

  @property
  def padded_vocab_size(self) -> int:
    return -(-self.vocab_size // self.vocab_pad_multiple) * self.vocab_pad_multiple

  @property
  def num_valid_rows(self) -> int | None:
    """The real vocabulary size when the table is padded, else None (no masking needed)."""
    return self.vocab_size if self.padded_vocab_size != self.vocab_size else None

  @classmethod
  def from_dict(cls, d: Any) -> ModelConfig:
    """Builds and validates a config from a mapping (e.g. a ``ConfigDict``'s ``model`` field)."""
    d = dict(d)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
      raise ValueError(f'unknown model config field(s) {unknown}; known fields: {sorted(names)}')
    if d.get('symbolic_layers') is not None:
      d['symbolic_layers'] = tuple(int(l) for l in d['symbolic_layers'])
    config = cls(**d)
    config.validate()
    return config

  def validate(self) -> None:
    """Raises ValueError naming the first field that is wrong and what is allowed."""
    def choice(name, allowed):
      if getattr(self, name) not in allowed:
        raise ValueError(f"model.{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")

    def positive(name, strict=True):
      v = getattr(self, name)
      if not isinstance(v, (int, float)) or isinstance(v, bool) or (v <= 0 if strict else v < 0):
        raise ValueError(f"model.{name} must be {'> 0' if strict else '>= 0'}, got {v!r}")

    for f in dataclasses.fields(self):  # a NaN would pass every range check below
      v = getattr(self, f.name)
      if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f'model.{f.name} must be a finite number, got {v!r}')
    choice('kind', MODEL_KINDS)
    choice('positions', POSITIONS)
    choice('value_map', VALUE_MAPS)
    choice('channel_norm_scale', CHANNEL_NORM_SCALES)
    choice('vocab_projection', tuple(symbolic.VOCAB_PROJECTIONS))
    choice('dtype', tuple(DTYPES))
    choice('attention_impl', attn.ATTENTION_IMPLS)
    for name in ('attention_impl', 'vocab_projection'):
      if getattr(self, name) == 'cudnn' and self.dtype != 'bfloat16':
        raise ValueError(f"model.{name}='cudnn' needs model.dtype='bfloat16' (cuDNN's fused attention "
                         f"takes 16-bit inputs), got model.dtype={self.dtype!r}")
    choice('symbolic_sites', SYMBOLIC_SITES)
    choice('vocab_ffn', symbolic.VOCAB_FFN_MIXING)
    choice('ffn_mixture', symbolic.FFN_MIXTURES)
    if self.ffn_mixture == 'nonnegative' and self.vocab_projection != 'direct':
      raise ValueError(f"model.ffn_mixture='nonnegative' is computed by the direct projection only; set "
                       f"model.vocab_projection='direct', got {self.vocab_projection!r}")
    choice('remat', ('none', *REMAT_POLICIES))
    for name in ('vocab_size', 'num_layers', 'num_heads', 'head_dim', 'ff_dim', 'ff_dim_per_head',
                 'max_len', 'tau_init', 'embed_init_std', 'layer_norm_epsilon', 'vocab_chunk_size',
                 'vocab_pad_multiple'):
      positive(name)
    positive('window', strict=False)
    positive('attention_block', strict=False)
    if self.mask:
      if self.window:
        raise ValueError(f'model.mask {self.mask!r} and model.window = {self.window} both set: write the '
                         f'window into the mask (e.g. "causal & window({self.window})") and set window = 0')
      # Over every position a sequence can have, so that e.g. stride(n) with n > 64 is caught too.
      static = attn.head_mask_matrix(self.mask_predicates(), self.max_len, self.max_len)
      if self.causal and np.triu(static.any(0), 1).any():
        raise ValueError(f'model.mask {self.mask!r} lets a position read later positions, but this task is '
                         f"causal (it predicts the next token): add 'causal &' to the mask")
    if self.relational and self.kind == 'lstm':
      raise ValueError("model.relational needs an attention model: use 'standard', 'token_factored' or "
                       "'symbolic', not 'lstm'")
    if self.relational and self.attention_block:
      raise ValueError('model.relational and model.attention_block cannot be combined: relational attention '
                       'reads a [nodes × nodes] graph, set attention_block = 0')
    for name in ('dropout_rate', 'attention_dropout_rate'):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f'model.{name} must be in [0, 1), got {getattr(self, name)!r}')
    if self.kind == 'lstm' and not self.causal:
      raise ValueError("model.kind 'lstm' reads left to right and needs a causal task; this task is "
                       "bidirectional: use 'standard', 'token_factored' or 'symbolic'")
    if self.kind != 'symbolic' and (self.symbolic_sites != 'both' or self.projection_gain
                                    or self.vocab_ffn != 'channel' or self.ffn_mixture != 'convex'):
      raise ValueError(f"model.symbolic_sites, model.projection_gain, model.vocab_ffn and model.ffn_mixture "
                       f"are only for kind 'symbolic', got kind {self.kind!r}")
    if self.qk_positions and self.kind not in ('token_factored', 'symbolic'):
      raise ValueError(f"model.qk_positions is for the factored kinds 'token_factored' and 'symbolic' (the "
                       f"standard model has model.positions='learned'), got kind {self.kind!r}")
    if self.symbolic_layers is not None:
      if self.kind != 'symbolic':
        raise ValueError(f"model.symbolic_layers is only for kind 'symbolic', got kind {self.kind!r}")
      bad = [l for l in self.symbolic_layers if not 0 <= l < self.num_layers]
      if bad:
        raise ValueError(f'model.symbolic_layers {bad} out of range: layers are 0..{self.num_layers - 1}')

  def layer_kinds(self) -> tuple[str, ...]:
    """The block kind of every layer: 'standard', 'token_factored' or 'symbolic'."""
    if self.kind != 'symbolic':
      return (self.kind,) * self.num_layers
    chosen = range(self.num_layers) if self.symbolic_layers is None else self.symbolic_layers
    return tuple('symbolic' if l in chosen else 'token_factored' for l in range(self.num_layers))

  def projects(self, layer: int, site: str) -> bool:
    """Whether ``site`` ('values' or 'ffn') of ``layer`` goes through the vocabulary projection."""
    return self.layer_kinds()[layer] == 'symbolic' and self.symbolic_site(site)

  def symbolic_site(self, site: str) -> bool:
    """Whether a symbolic layer projects ``site`` ('values' or 'ffn')."""
    return self.symbolic_sites in ('both', site)

  @property
  def exact_mixtures(self) -> bool:
    """Every stream a convex mixture of token embeddings after every layer: every layer symbolic, both
    sites projected, no gain, convex FFN mixtures (the paper's model, with either ``vocab_ffn``)."""
    return (self.kind == 'symbolic' and self.layer_kinds() == ('symbolic',) * self.num_layers
            and self.symbolic_sites == 'both' and not self.projection_gain and self.ffn_mixture == 'convex')

  @property
  def paper_symbolic(self) -> bool:
    """Algorithm 1 exactly: exact mixtures, each channel's FFN reads its own channel (eq. 20), and positions
    enter only through ALiBi."""
    return self.exact_mixtures and self.vocab_ffn == 'channel' and not self.qk_positions

  def mask_predicates(self) -> tuple[attn.Mask, ...]:
    """The attention mask of every head (one entry when all heads share it)."""
    if self.mask:
      return attn.parse_head_masks(self.mask, self.num_heads)
    mask = attn.causal if self.causal else attn.full
    return (mask & attn.sliding_window(self.window) if self.window else mask,)

  @property
  def compute_dtype(self):
    return DTYPES[self.dtype]


class MLP(nn.Module):
  """W2 gelu(W1 x + b1) + b2, d_model -> ff_dim -> d_model (GELU: tanh approximation)."""

  ff_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    init = lambda names: nn.with_logical_partitioning(nn.initializers.normal(0.02), names)
    h = nn.gelu(nn.Dense(self.ff_dim, dtype=self.dtype, kernel_init=init((EMBED, MLP_AXIS)), name='wi')(x))
    return nn.Dense(x.shape[-1], dtype=self.dtype, kernel_init=init((MLP_AXIS, EMBED)), name='wo')(h)


def _attention(config: ModelConfig, output_projection: bool, alibi: bool) -> attn.Attention:
  masks = config.mask_predicates()
  return attn.Attention(config.num_heads, config.head_dim, mask=masks[0] if len(masks) == 1 else masks,
                        alibi=alibi, learned_slopes=config.learned_slopes, output_projection=output_projection,
                        dropout_rate=config.attention_dropout_rate, block_size=config.attention_block,
                        impl=config.attention_impl, dtype=config.compute_dtype, name='attention')


class StandardBlock(nn.Module):
  """Pre-LayerNorm block: x += Attn(LN(x)); x += MLP(LN(x))."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, key_mask: Array | None = None, deterministic: bool = True,
               edges: attn.Edges | None = None) -> Array:
    cfg = self.config
    drop = nn.Dropout(cfg.dropout_rate, deterministic=deterministic)
    ln = lambda name: nn.LayerNorm(cfg.layer_norm_epsilon, dtype=cfg.compute_dtype, name=name)
    x = x + drop(_attention(cfg, True, cfg.positions == 'alibi')(
        ln('norm_attn')(x), key_mask=key_mask, deterministic=deterministic, edges=edges))
    self.sow('intermediates', 'x_attn', x)
    x = x + drop(MLP(cfg.ff_dim, cfg.compute_dtype, name='ffn')(ln('norm_ffn')(x)))
    self.sow('intermediates', 'x_ffn', x)
    return x


class FactoredBlock(nn.Module):
  """Token-Factored block (eqs. 6-15), or with ``symbolic=True`` the Symbolic block (Algorithm 1).

  Takes and returns the streams ``(x_t, x_e)``, each ``[batch, time, d_model]``; ``table`` is the input
  embedding table ``[vocab, d_model]`` that the symbolic vocabulary projections mix.
  """

  config: ModelConfig
  symbolic: bool = False

  @nn.compact
  def __call__(self, x_t: Array, x_e: Array, table: Array, key_mask: Array | None = None,
               deterministic: bool = True, edges: attn.Edges | None = None) -> tuple[Array, Array]:
    cfg = self.config
    drop = nn.Dropout(cfg.dropout_rate, deterministic=deterministic)
    if self.symbolic:
      norm = lambda name: symbolic.ChannelLayerNorm(cfg.num_heads, cfg.channel_norm_scale,
                                                    cfg.layer_norm_epsilon, name=name)
    else:
      norm = lambda name: nn.LayerNorm(cfg.layer_norm_epsilon, dtype=cfg.compute_dtype, name=name)

    # Attention: values from X_t alone (eq. 8 / eq. 27); update X_t only (eq. 12 / eq. 28).
    if cfg.value_map == 'none':
      value_map = lambda x: symbolic.split_channels(x, cfg.num_heads)
    else:
      value_map = symbolic.KroneckerValue(cfg.num_heads, cfg.value_map.removeprefix('kronecker_'),
                                          name='value_map')
    project = self.symbolic and cfg.symbolic_site('values')
    if project:
      projection = symbolic.VocabProjection(cfg.num_heads, cfg.tau_init, cfg.vocab_projection,
                                            cfg.vocab_chunk_size, cfg.num_valid_rows, cfg.projection_gain,
                                            name='value_projection')
    value = lambda x: projection(value_map(x), table) if project else value_map(x)
    values = value(x_t)
    if edges is not None:
      # Relational attention: the value node i reads from node j is v_j + ve_ij with ve_ij the same value
      # map of the edge's token embedding (computed once per vocabulary row, gathered per pair), so a value stays a combination of token embeddings. Symbolic
      # values average the two projected mixtures, ½(α_j E + α_ij E), which is again a convex mixture.
      edge_values = value(edges.table)              # per edge token: [vocab, heads, head_dim]
      if project:
        values, edge_values = 0.5 * values, 0.5 * edge_values
      edges = attn.Edges(edges.ids, edges.table, edge_values)
    x_attn = norm('norm_attn')(x_t + x_e)
    if cfg.qk_positions:
      # Scale comparable to the unit-variance LayerNorm output it is added to (std 0.5 is what was measured).
      pos = self.param('qk_position', nn.with_logical_partitioning(nn.initializers.normal(0.5), (None, EMBED)),
                       (cfg.max_len, cfg.d_model))
      x_attn = x_attn + pos[:x_t.shape[-2]].astype(x_attn.dtype)
    delta_t = _attention(cfg, False, True)(x_attn, values=values,
                                           key_mask=key_mask, deterministic=deterministic, edges=edges)
    x_t = x_t + drop(delta_t)
    self.sow('intermediates', 'x_t_attn', x_t)
    self.sow('intermediates', 'x_e_attn', x_e)

    # FFN: reads the whole state, updates X_e only (eqs. 13-15 / Algorithm 1 lines 6-8).
    x_ffn = norm('norm_ffn')(x_t + x_e)
    if self.symbolic and cfg.symbolic_site('ffn'):
      width = cfg.ff_dim if cfg.vocab_ffn == 'dense' else cfg.ff_dim_per_head
      delta_e = symbolic.VocabFFN(cfg.num_heads, width, cfg.tau_init, cfg.vocab_projection,
                                  cfg.vocab_chunk_size, cfg.num_valid_rows, cfg.compute_dtype,
                                  gain=cfg.projection_gain, mixing=cfg.vocab_ffn, weights=cfg.ffn_mixture,
                                  name='ffn')(x_ffn, table)
    else:
      delta_e = MLP(cfg.ff_dim, cfg.compute_dtype, name='ffn')(x_ffn)
    x_e = x_e + drop(delta_e)
    self.sow('intermediates', 'x_t_ffn', x_t)
    self.sow('intermediates', 'x_e_ffn', x_e)
    return x_t, x_e


class Transformer(nn.Module):
  """A language model / tagger over token ids; returns logits ``[batch, time, vocab]`` in float32.

  Readout: LN_f(X_t + X_e) Eᵀ with the input embedding table E when ``tie_embeddings`` (channel LayerNorm
  for symbolic models), else a separate ``[vocab, d_model]`` table. With ``return_hidden=True`` it returns
  ``(LN_f(X_t + X_e), readout table)`` instead, for losses that stream over the vocabulary.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, tokens: Array, key_mask: Array | None = None, deterministic: bool = True,
               return_hidden: bool = False, edges: Array | None = None):
    """tokens: ``[batch, time]`` ints; key_mask: ``[batch, time]``, False for padding keys; edges (with
    ``relational``): ``[batch, time, time]`` token ids of the edge i -> j, -1 where there is none."""
    cfg = self.config
    time = tokens.shape[-1]
    if time > cfg.max_len:
      raise ValueError(f'sequence length {time} exceeds model.max_len = {cfg.max_len}; '
                       f'shorten the input or raise model.max_len')
    embed = _embed(cfg)
    x = embed(tokens)
    table = embed.embedding
    graph = None
    if cfg.relational:
      if edges is None or edges.shape != (*tokens.shape, time):
        raise ValueError(f'model.relational needs edges of shape {(*tokens.shape, time)} (a graph task), '
                         f'got {None if edges is None else edges.shape}')
      graph = attn.Edges(edges, table)

    if cfg.kind == 'standard':
      if cfg.positions == 'learned':
        pos = self.param('pos_embedding', nn.initializers.normal(0.02), (cfg.max_len, cfg.d_model))
        x = x + pos[:time].astype(x.dtype)
      self.sow('intermediates', 'x_0', x)
      block = _remat(StandardBlock, cfg, static_argnums=(3,))
      for l in range(cfg.num_layers):
        x = block(cfg, name=f'layer_{l}')(x, key_mask, deterministic, graph)
      h = nn.LayerNorm(cfg.layer_norm_epsilon, dtype=cfg.compute_dtype, name='norm_final')(x)
    else:
      x_t, x_e = x, jnp.zeros_like(x)
      self.sow('intermediates', 'x_t_0', x_t)
      self.sow('intermediates', 'x_e_0', x_e)
      block = _remat(FactoredBlock, cfg, static_argnums=(5,))
      for l, kind in enumerate(cfg.layer_kinds()):
        x_t, x_e = block(cfg, kind == 'symbolic', name=f'layer_{l}')(x_t, x_e, table, key_mask, deterministic,
                                                                     graph)
      if cfg.kind == 'symbolic':
        h = symbolic.ChannelLayerNorm(cfg.num_heads, cfg.channel_norm_scale, cfg.layer_norm_epsilon,
                                      name='norm_final')(x_t + x_e)
      else:
        h = nn.LayerNorm(cfg.layer_norm_epsilon, dtype=cfg.compute_dtype, name='norm_final')(x_t + x_e)

    return _readout(self, cfg, h, table, return_hidden)


def check_token_ids(ids, vocab_size: int, what: str = 'token ids') -> None:
  """ValueError naming the ids of concrete ``ids`` outside ``[0, vocab_size)``: out of range, JAX's embedding
  lookup gives NaN rather than an error (the tools and the sampler check their inputs with this)."""
  ids = np.asarray(ids)
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    bad = sorted({int(t) for t in ids.ravel() if not 0 <= t < vocab_size})
    raise ValueError(f"{what} must be in [0, {vocab_size}) (the model's vocabulary), got {bad[:10]}")


def _embed(cfg: ModelConfig) -> nn.Embed:
  table_init = nn.with_logical_partitioning(nn.initializers.normal(cfg.embed_init_std), (VOCAB, EMBED))
  return nn.Embed(cfg.padded_vocab_size, cfg.d_model, dtype=cfg.compute_dtype, embedding_init=table_init,
                  name='embed')


def _readout(module: nn.Module, cfg: ModelConfig, h: Array, table: Array, return_hidden: bool):
  """Logits h Eᵀ over the real vocabulary, or (h, table) for a streamed loss; a separate table when
  embeddings are untied."""
  if not cfg.tie_embeddings:
    table = module.param('readout', nn.with_logical_partitioning(nn.initializers.normal(0.02), (VOCAB, EMBED)),
                         (cfg.padded_vocab_size, cfg.d_model))
  if return_hidden:
    return h, table
  logits = jnp.einsum('btd,vd->btv', h, table.astype(h.dtype), preferred_element_type=jnp.float32)
  return logits[..., :cfg.vocab_size]


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
    return _readout(self, cfg, h, embed.embedding, return_hidden)


def for_backend(config: ModelConfig, backend: str | None = None) -> ModelConfig:
  """The config with its cuDNN kernels replaced by portable ones of the same mathematics (explicit
  attention, streamed projection) when ``backend`` (default: JAX's) is not a GPU: a model trained with them
  on a GPU then loads, samples and is read anywhere."""
  if (backend or jax.default_backend()) == 'gpu':
    return config
  return dataclasses.replace(
      config, attention_impl='explicit' if config.attention_impl == 'cudnn' else config.attention_impl,
      vocab_projection='streamed' if config.vocab_projection == 'cudnn' else config.vocab_projection)


def build(config: ModelConfig) -> nn.Module:
  """The model ``config.kind`` names."""
  return LSTM(config) if config.kind == 'lstm' else Transformer(config)


def _remat(block_cls, cfg: ModelConfig, static_argnums):
  """The block class, rematerialised by ``cfg.remat`` (argument indices count ``self`` as 0)."""
  if cfg.remat == 'none':
    return block_cls
  return nn.remat(block_cls, policy=REMAT_POLICIES[cfg.remat], static_argnums=static_argnums)


def param_shapes(config: ModelConfig, seq_len: int = 8) -> Any:
  """The parameter tree as ``jax.ShapeDtypeStruct``s, without allocating anything."""
  tokens = jax.ShapeDtypeStruct((1, min(seq_len, config.max_len)), jnp.int32)
  return nn.meta.unbox(jax.eval_shape(build(config).init, jax.random.key(0), tokens)['params'])


def count_params(config: ModelConfig) -> int:
  """Number of parameters, from shapes alone."""
  return sum(int(x.size) for x in jax.tree.leaves(param_shapes(config)))
