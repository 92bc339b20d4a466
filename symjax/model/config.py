"""The model's configuration: one frozen dataclass that names every architectural choice.

``ModelConfig`` is built once from the run's ConfigDict (``ModelConfig.from_dict``) and passed to every
module; its ``__post_init__`` checks each field and names the allowed values.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from symjax.model import masks, symbolic
from symjax.ops import attention as attention_ops
from symjax.system.errors import InputError

MODEL_KINDS = ('standard', 'token_factored', 'symbolic', 'lstm')  # lstm: a recurrent baseline
POSITIONS = ('alibi', 'learned')
VALUE_MAPS = ('kronecker_identity', 'kronecker_normal', 'none')
CHANNEL_NORM_SCALES = ('vector', 'scalar')
SYMBOLIC_SITES = ('both', 'values', 'ffn')  # which sites of a symbolic layer are vocabulary-projected
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
REMAT_POLICIES = {'full': None, 'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


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
  # Any mask of the algebra (symjax.model.masks.MASK_GRAMMAR), e.g. 'causal & (window(8) | stride(8))', or
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
  # Opt-in variants of the symbolic layers (the paper's model is 'both' without gain; the docs' results
  # page "The Symbolic Transformer against the baselines" measures each): which sites go through the
  # vocabulary projection —
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
  # Program training (opt-in, symbolic only; "Learning Transformer Programs" trains its categorical model
  # toward the same end): the forward pass takes every vocabulary mixture and every attention pattern as its
  # argmax, one-hot, so the model computes exactly what its decompiled program computes
  # (symjax.proj.decompile); gradients flow through the softmaxes (straight-through).
  hard: bool = False
  # Program training's Gumbel noise (opt-in, with hard): while training, every argmax above (attention keys,
  # tokens of the vocabulary projections and count tables) is taken of the log-weights plus s × Gumbel
  # noise, a sample rather than the mode, and numerical predicates' scores get s × logistic noise
  # ("Learning Transformer Programs" train theirs on Gumbel-softmax samples, annealed geometrically from 3 to
  # 0.01). s goes geometrically from gumbel_scale at the first step to gumbel_scale_end at the last (None:
  # constant). Evaluation and the decompiled program take the noiseless argmax. 0 = off.
  gumbel_scale: float = 0.0
  gumbel_scale_end: float | None = None
  # Numerical heads (opt-in, symbolic only; the numerical attention of "Learning Transformer Programs",
  # §3.2, which its programs count with): the last numerical_heads heads of every layer count the keys whose
  # score is above 0 (a learned predicate; sigmoid weights in the soft model) and write a token chosen by
  # that count from a learned table (symbolic.CountProjection). A categorical (softmax) head reads one key
  # when hard, so it cannot count.
  numerical_heads: int = 0
  # Whether numerical heads see positions (the ALiBi bias and, with qk_positions, the position rows) like the
  # other heads. False: their predicate is over the tokens a position holds alone, so a count such as
  # "keys holding my token" cannot depend on where the keys are (opt-in, per task; the categorical heads keep
  # their positions).
  numerical_positions: bool = True
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
      raise InputError(f'unknown model config field(s) {unknown}; known fields: {sorted(names)}')
    if d.get('symbolic_layers') is not None:
      d['symbolic_layers'] = tuple(int(l) for l in d['symbolic_layers'])
    config = cls(**d)
    config.validate()
    return config

  def validate(self) -> None:
    """Raises ValueError naming the first field that is wrong and what is allowed."""
    self._check_values()
    self._check_attention()
    self._check_kinds()
    self._check_program()
    self._check_layers()

  def _check_values(self) -> None:
    """Every number finite and in range, every named choice one of its options."""
    def choice(name, allowed):
      if getattr(self, name) not in allowed:
        raise InputError(f"model.{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")

    def positive(name, strict=True):
      v = getattr(self, name)
      if not isinstance(v, (int, float)) or isinstance(v, bool) or (v <= 0 if strict else v < 0):
        raise InputError(f"model.{name} must be {'> 0' if strict else '>= 0'}, got {v!r}")

    for f in dataclasses.fields(self):  # a NaN would pass every range check below
      v = getattr(self, f.name)
      if isinstance(v, float) and not math.isfinite(v):
        raise InputError(f'model.{f.name} must be a finite number, got {v!r}')
    choice('kind', MODEL_KINDS)
    choice('positions', POSITIONS)
    choice('value_map', VALUE_MAPS)
    choice('channel_norm_scale', CHANNEL_NORM_SCALES)
    choice('vocab_projection', tuple(symbolic.VOCAB_PROJECTIONS))
    choice('dtype', tuple(DTYPES))
    choice('attention_impl', attention_ops.ATTENTION_IMPLS)
    for name in ('attention_impl', 'vocab_projection'):
      if getattr(self, name) == 'cudnn' and self.dtype != 'bfloat16':
        raise InputError(f"model.{name}='cudnn' needs model.dtype='bfloat16' (cuDNN's fused attention "
                         f"takes 16-bit inputs), got model.dtype={self.dtype!r}")
    choice('symbolic_sites', SYMBOLIC_SITES)
    choice('vocab_ffn', symbolic.VOCAB_FFN_MIXING)
    choice('ffn_mixture', symbolic.FFN_MIXTURES)
    if self.ffn_mixture == 'nonnegative' and self.vocab_projection != 'direct':
      raise InputError(f"model.ffn_mixture='nonnegative' is computed by the direct projection only; set "
                       f"model.vocab_projection='direct', got {self.vocab_projection!r}")
    choice('remat', ('none', *REMAT_POLICIES))
    for name in ('vocab_size', 'num_layers', 'num_heads', 'head_dim', 'ff_dim', 'ff_dim_per_head',
                 'max_len', 'tau_init', 'embed_init_std', 'layer_norm_epsilon', 'vocab_chunk_size',
                 'vocab_pad_multiple'):
      positive(name)
    positive('window', strict=False)
    positive('attention_block', strict=False)

  def _check_attention(self) -> None:
    """The mask, relational attention and dropout."""
    if self.mask:
      if self.window:
        raise InputError(f'model.mask {self.mask!r} and model.window = {self.window} both set: write the '
                         f'window into the mask (e.g. "causal & window({self.window})") and set window = 0')
      # Over every position a sequence can have, so that e.g. stride(n) with n > 64 is caught too.
      static = masks.head_mask_matrix(self.mask_predicates(), self.max_len, self.max_len)
      if self.causal and np.triu(static.any(0), 1).any():
        raise InputError(f'model.mask {self.mask!r} lets a position read later positions, but this task is '
                         f"causal (it predicts the next token): add 'causal &' to the mask")
    if self.relational and self.kind == 'lstm':
      raise InputError("model.relational needs an attention model: use 'standard', 'token_factored' or "
                       "'symbolic', not 'lstm'")
    if self.relational and self.attention_block:
      raise InputError('model.relational and model.attention_block cannot be combined: relational attention '
                       'reads a [nodes × nodes] graph, set attention_block = 0')
    for name in ('dropout_rate', 'attention_dropout_rate'):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise InputError(f'model.{name} must be in [0, 1), got {getattr(self, name)!r}')

  def _check_kinds(self) -> None:
    """Options that only some kinds have."""
    if self.kind == 'lstm' and not self.causal:
      raise InputError("model.kind 'lstm' reads left to right and needs a causal task; this task is "
                       "bidirectional: use 'standard', 'token_factored' or 'symbolic'")
    if self.kind != 'symbolic' and (self.symbolic_sites != 'both' or self.projection_gain
                                    or self.vocab_ffn != 'channel' or self.ffn_mixture != 'convex'):
      raise InputError(f"model.symbolic_sites, model.projection_gain, model.vocab_ffn and model.ffn_mixture "
                       f"are only for kind 'symbolic', got kind {self.kind!r}")
    if self.qk_positions and self.kind not in ('token_factored', 'symbolic'):
      raise InputError(f"model.qk_positions is for the factored kinds 'token_factored' and 'symbolic' (the "
                       f"standard model has model.positions='learned'), got kind {self.kind!r}")

  def _check_program(self) -> None:
    """Program training and numerical heads: the computations they take their argmaxes from."""
    # What program training and numerical heads both need: the explicit, dense, one-piece computations that
    # the forward pass takes its argmaxes and predicates from.
    needs = (('kind', 'symbolic', self.kind), ('symbolic_sites', 'both', self.symbolic_sites),
             ('vocab_projection', 'direct', self.vocab_projection), ('attention_impl', 'explicit', self.attention_impl),
             ('attention_block', 0, self.attention_block), ('relational', False, self.relational),
             ('symbolic_layers', None, self.symbolic_layers))
    unmet = lambda pairs: '; '.join(f'model.{name} = {got!r} (needs {want!r})' for name, want, got in pairs
                                    if got != want)
    if self.hard:
      wrong = unmet(needs + (('projection_gain', False, self.projection_gain),
                             ('ffn_mixture', 'convex', self.ffn_mixture)))
      if wrong:
        raise InputError(f'model.hard (program training) needs the paper\'s symbolic model with the direct '
                         f'projection and explicit attention: {wrong}')
    if not (math.isfinite(self.gumbel_scale) and self.gumbel_scale >= 0):
      raise InputError(f'model.gumbel_scale must be a finite number >= 0 (0 = off), got {self.gumbel_scale!r}')
    end = self.gumbel_scale_end
    if end is not None and not (self.gumbel_scale > 0 and math.isfinite(end) and end > 0):
      raise InputError(f'model.gumbel_scale_end must be a finite number > 0 with model.gumbel_scale > 0 (or None: '
                       f'constant), got {end!r} with model.gumbel_scale = {self.gumbel_scale!r}')
    if self.gumbel_scale and not self.hard:
      raise InputError(f'model.gumbel_scale samples the argmaxes of program training: it needs model.hard = '
                       f'True, got model.hard = {self.hard!r}')
    if self.numerical_heads:
      if not 0 <= self.numerical_heads <= self.num_heads:
        raise InputError(f'model.numerical_heads must be in [0, model.num_heads = {self.num_heads}], got '
                         f'{self.numerical_heads!r}')
      wrong = unmet(needs)
      if wrong:
        raise InputError(f'model.numerical_heads needs the symbolic model with the direct projection and '
                         f'explicit attention: {wrong}')
    if not self.numerical_positions and not self.numerical_heads:
      raise InputError('model.numerical_positions = False removes positions from numerical heads: it needs '
                       f'model.numerical_heads >= 1, got {self.numerical_heads!r}')

  def _check_layers(self) -> None:
    if self.symbolic_layers is not None:
      if self.kind != 'symbolic':
        raise InputError(f"model.symbolic_layers is only for kind 'symbolic', got kind {self.kind!r}")
      bad = [l for l in self.symbolic_layers if not 0 <= l < self.num_layers]
      if bad:
        raise InputError(f'model.symbolic_layers {bad} out of range: layers are 0..{self.num_layers - 1}')

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
    return (self.exact_mixtures and self.vocab_ffn == 'channel' and not self.qk_positions
            and not self.numerical_heads)

  def mask_predicates(self) -> tuple[masks.Mask, ...]:
    """The attention mask of every head (one entry when all heads share it)."""
    if self.mask:
      return masks.parse_head_masks(self.mask, self.num_heads)
    mask = masks.causal if self.causal else masks.full
    return (mask & masks.sliding_window(self.window) if self.window else mask,)

  @property
  def compute_dtype(self):
    return DTYPES[self.dtype]
