"""The model's configuration: frozen dataclasses that name every architectural choice.

``ModelConfig`` holds the model's shape and six groups of options (``attention``, ``symbolic``, ``program``,
``streams``, ``kernels``, ``training``). It is built once from the run's flat ConfigDict (``ModelConfig.from_dict``),
which checks each field and names the allowed values; the blocks read it, and the layers below them receive
the values they use.
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from symjax.model import intermediates, masks, symbolic
from symjax.ops import attention as attention_ops
from symjax.system.errors import InputError

# lstm: a recurrent baseline; program: a Transformer Program (symjax.model.transformer_program)
MODEL_KINDS = ('standard', 'token_factored', 'symbolic', 'lstm', 'program')
POSITIONS = ('alibi', 'learned', 'rope')
# The value map of the factored kinds: W_head ⊗ I (the paper, identity or normal initialisation), none
# (V = X_t), or — the dual-stream family's other two head mixings — one [head_dim, head_dim] map per head
# ('independent') or one [d_model, d_model] map over every channel ('dense').
VALUE_MAPS = ('kronecker_identity', 'kronecker_normal', 'none', 'independent', 'dense')
STREAMS = ('token_factored', 'cascade', 'single')
HEAD_MIXINGS = ('independent', 'kronecker', 'dense')
FFN_MIXINGS = ('dense', 'independent')
GATES = ('none', 'combined', 'symbolic')
PLS_DECAYS = ('linear', 'exponential', 'uniform', 'linear_final')
PLS_SOURCES = ('x', 'x_e')
CHANNEL_NORM_SCALES = ('vector', 'scalar')
NUMERICAL_READOUTS = ('one_hot', 'linear')
SYMBOLIC_SITES = ('both', 'values', 'ffn')  # which sites of a symbolic layer are vocabulary-projected
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
REMAT_POLICIES = {'full': None, 'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


# --8<-- [start:groups]
@dataclasses.dataclass(frozen=True)
class AttentionConfig:
  """Which keys a query reads, and how positions enter."""

  window: int = 0                      # > 0: also restrict attention to |i - j| < window
  # Any mask of the algebra (symjax.model.masks.MASK_GRAMMAR), e.g. 'causal & (window(8) | stride(8))', or
  # per-head masks 'causal & window(8); causal & stride(8)' (the heads split evenly between them). Empty:
  # causal or full as the task needs, with ``window``. It replaces both; a causal task needs a causal mask.
  mask: str = ''
  relational: bool = False             # Relational Attention over the task's graph edges (graph tasks)
  # 'alibi' (the paper), 'rope' (rotary queries and keys, the dual-stream family's default) or 'learned'
  # (an absolute position embedding added to the input: the standard kind only).
  positions: str = 'alibi'
  learned_slopes: bool = True          # ALiBi slopes learned (paper) or fixed at the reference sequence
  # Opt-in, not the paper (where positions enter only through ALiBi): a learned absolute position embedding
  # added to the input of every factored layer's queries and keys — never to the streams or the values, so
  # a symbolic model's streams stay exact token mixtures. Factored kinds only; lengths up to max_len.
  qk_positions: bool = False


@dataclasses.dataclass(frozen=True)
class SymbolicConfig:
  """The Symbolic Transformer's layers: values, channel norms, vocabulary projections and the FFN."""

  value_map: str = 'kronecker_identity'  # W̃_V = W_head ⊗ I with W_head = I or N(0, 0.02²); or V = X_t
  channel_norm_scale: str = 'vector'   # γ_h, β_h per feature ('vector') or per channel ('scalar')
  symbolic_layers: tuple[int, ...] | None = None  # which layers are symbolic (None: all)
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
  ff_dim_per_head: int = 64            # VocabFFN hidden width per channel
  # The weights of the FFN's vocabulary projections: 'convex' (eq. 22, softmax: every update a convex
  # mixture of the channel's embeddings) or 'nonnegative' (opt-in: softplus(z Eᵀ/τ)/|V|, so every update is
  # a non-negative combination of the channel's embeddings whose mass the model chooses per token; values
  # stay convex). Direct projection only.
  ffn_mixture: str = 'convex'
  tau_init: float = 1.0                # initial vocabulary-projection temperature τ_h


@dataclasses.dataclass(frozen=True)
class ProgramConfig:
  """Program training (opt-in, symbolic only; "Learning Transformer Programs" trains its categorical model
  toward the same end)."""

  # The forward pass takes every vocabulary mixture and every attention pattern as its argmax, one-hot, so
  # the model computes exactly what its decompiled program computes (symjax.proj.decompile); gradients flow
  # through the softmaxes (straight-through).
  hard: bool = False
  # Gumbel noise (opt-in, with hard): while training, every argmax above (attention keys, tokens of the
  # vocabulary projections and count tables) is taken of the log-weights plus s × Gumbel noise, a sample
  # rather than the mode, and numerical predicates' scores get s × logistic noise ("Learning Transformer
  # Programs" train theirs on Gumbel-softmax samples, annealed geometrically from 3 to 0.01). s goes
  # geometrically from gumbel_scale at the first step to gumbel_scale_end at the last (None: constant).
  # Evaluation and the decompiled program take the noiseless argmax. 0 = off.
  gumbel_scale: float = 0.0
  gumbel_scale_end: float | None = None
  # Numerical heads (the numerical attention of "Learning Transformer Programs", §3.2, which its programs
  # count with): the last numerical_heads heads of every layer count the keys whose score is above 0 (a
  # learned predicate; sigmoid weights in the soft model) and write a token chosen by that count from a
  # learned table (symbolic.CountProjection). A categorical (softmax) head reads one key when hard, so it
  # cannot count.
  numerical_heads: int = 0
  # Whether numerical heads see positions (the ALiBi bias and, with qk_positions, the position rows) like the
  # other heads. False: their predicate is over the tokens a position holds alone, so a count such as
  # "keys holding my token" cannot depend on where the keys are (opt-in, per task; the categorical heads keep
  # their positions). Kind 'program': a numerical head selects its query and key among every variable but
  # `positions` (``transformer_program.head_reads``).
  numerical_positions: bool = True
  # Kind 'program' only: numerical heads sum a numerical variable over the keys they select rather than
  # count them ("Learning Transformer Programs", §3.3 and Appendix A: at the input the constant `ones`, whose
  # sum is the count; above it a lower layer's numerical head). Each selects its value variable among these;
  # a sum saturates at the largest value a variable holds (cardinality − 1).
  numerical_values: bool = False
  # Kind 'program' only: how the classifier reads a numerical variable. 'one_hot': a row per value, as it
  # reads every other variable; 'linear': the value times one weight per tag, as the published programs of
  # "Learning Transformer Programs" weigh theirs (their classifiers multiply each count by one column), so
  # that the tag a larger count favours is favoured more.
  numerical_readout: str = 'one_hot'
  # Kind 'program' only: how many variables the classifier reads. 0: every variable (§3.4 of that paper). k > 0:
  # k selections of learned logits (their argmax in the program, Gumbel-softmax samples at the schedule's
  # temperature while training) choose the variables, and the classifier is zero outside their rows, so the
  # program decides its output from k variables (a table over their reachable values, short enough for code).
  readout_reads: int = 0
  # Kind 'program' only: layer 0's first three numerical heads start counting, over positions, the keys at or
  # after the query (n − i), at or before it (i + 1) and all of them (n), the counts any sequence task may
  # build on (``transformer_program.position_counts``); every other parameter starts random. Training may move
  # them: it is where they start, not a constraint.
  position_counts: bool = False
  # Kind 'program' only: one numerical head per symbol of the task starts counting, at every query, the keys
  # that hold that symbol (a histogram of the input, ``transformer_program.symbol_counts``), on the numerical
  # heads after those position_counts sets; the task names its symbols (the RASP tasks do). Where it starts,
  # as position_counts: training may move them.
  symbol_counts: bool = False
  # Kind 'program' only: MLPs per layer, each reading two variables it selects, and their hidden width.
  mlps: int = 2
  mlp_hidden: int = 64
  # Kind 'program' only: train the relaxation, as "Learning Transformer Programs" does (§3.2, "Optimization"):
  # every choice (a selection, a predicate row, an attention key, an MLP's value) is the Gumbel-softmax sample
  # softmax((logits + g) / τ), τ going geometrically from gumbel_scale to gumbel_scale_end, rather than the
  # straight-through argmax of logits + s·g. Evaluation and the decompiled program take the argmax.
  relaxed: bool = False
  # Kind 'program' with model.relaxed only: whether a categorical head's relaxed attention is a Gumbel-softmax
  # sample, as that paper trains it, or the softmax of the same scores at temperature τ with no noise. Of the
  # keys a predicate matches the program reads the closest; in the scores that preference is a bias under 1,
  # the size of the unit noise, so a sample reads a farther match about as often, whatever τ. Without the noise
  # the relaxation reads the closest match more and more as τ falls, as the program does. No recipe takes it:
  # Dyck-2 trained without the noise did no better on validation, and a Dyck-2 program set by hand left its
  # program under the relaxation with or without it (transformer_program_dyck2_attention_noise.json).
  attention_noise: bool = True


@dataclasses.dataclass(frozen=True)
class StreamConfig:
  """The dual-stream family of "The Dual-Stream Transformer" (Kerce & Fox 2026): which stream each sublayer
  writes, how heads and FFN channels mix, gated attention and per-layer supervision. The defaults are the
  Token-Factored and Symbolic Transformers of "Symbolic Transformers"; ``configs/dual_stream.py`` names the
  family's variants (``kron-dns_C_G``)."""

  # Factored kinds: 'token_factored' (attention writes X_t, the FFN X_e), 'cascade' (X_t stays the embedding,
  # attention and FFN both write X_e) or 'single' (both write X_t; X_e stays zero: one residual stream).
  stream: str = 'token_factored'
  cascade_norm: bool = False           # cascade: X_t is the channel LayerNorm of the embedding, once
  channel_norm: bool = False           # kind 'token_factored': channel LayerNorm (eq. 18) for every norm
  # The attention's output map over heads, after each head's read (factored kinds): 'independent' (none:
  # head h writes channel h, the paper), 'kronecker' (W_out ⊗ I, H² parameters) or 'dense' ([d_model,
  # d_model]). The value map before the read is ``value_map``.
  head_mixing: str = 'independent'
  ffn_mixing: str = 'dense'            # the MLP: 'dense' or 'independent' (one MLP per channel)
  # Gated attention: each head's output times σ(g W_gate[h]), W_gate [heads, head_dim, head_dim] from zeros,
  # with g the head's query ('combined') or the channel LayerNorm of X_t ('symbolic'); 'none' = off.
  gate: str = 'none'
  # Per-layer supervision: loss = CE(final) + pls_weight · Σ_l w_l CE(lm_head(LN_f(state_l))), the shared
  # readout after every layer l, w_l by pls_decay; the state is X_t + X_e ('x') or X_e ('x_e'). 0 = off.
  pls_weight: float = 0.0
  pls_decay: str = 'linear'
  pls_final_weight: float = 0.5        # 'linear_final': the last layer's w_l (the rest share 1 − it)
  pls_source: str = 'x'


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """How the same function is computed: kernels, memory and precision."""

  # Dense attention: 'explicit' (einsum, float32 scores; always used where weights are read), 'xla' or
  # 'cudnn' (jax.nn.dot_product_attention; 'cudnn' is the fused flash kernel, NVIDIA GPU and bfloat16).
  attention_impl: str = 'explicit'
  attention_block: int = 0             # > 0: score only the (query, key) blocks of this size the mask
                                       # allows (saves work for local masks; the same result)
  vocab_projection: str = 'direct'     # 'direct' or 'streamed' (memory O(tokens·heads·chunk)), see symbolic
  vocab_chunk_size: int = 1024         # vocabulary rows per step of the streamed projection
  vocab_pad_multiple: int = 1          # embedding rows padded to a multiple (the 'vocab' mesh axis size);
                                       # padding rows never receive weight or probability
  remat: str = 'none'                  # rematerialise each block in the backward pass: 'none', 'full',
                                       # or 'dots' (keep matrix products, recompute the rest)
  dtype: str = 'float32'               # compute dtype; parameters stay float32


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
  """What only initialisation and training read."""

  embed_init_std: float = 0.02         # std of the token embedding initialisation
  dropout_rate: float = 0.0            # on the residual updates
  attention_dropout_rate: float = 0.0  # on the attention weights


# --8<-- [end:groups]
GROUPS = {'attention': AttentionConfig, 'symbolic': SymbolicConfig, 'program': ProgramConfig,
          'streams': StreamConfig, 'kernels': KernelConfig, 'training': TrainingConfig}
# Each grouped field's group. The run's ConfigDict (``config.model``) and ``ModelConfig.flat()`` keep every
# field at one level, by these names: what users type (``--config.model.hard=true``) does not change.
GROUP_OF = {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Everything that defines a model: its shape at the top, each family of options in its group.
  ``d_model = num_heads * head_dim``. Build one from flat fields with ``ModelConfig.from_dict`` (or
  ``ModelConfig.of``), change fields with ``replace``."""

  # --8<-- [start:fields]
  kind: str = 'symbolic'               # one of MODEL_KINDS
  vocab_size: int = 16
  num_layers: int = 2
  num_heads: int = 4
  head_dim: int = 16
  ff_dim: int = 256                    # FFN hidden width (standard and Token-Factored blocks)
  max_len: int = 64                    # longest sequence accepted (learned positions need it)
  causal: bool = True                  # causal or bidirectional attention
  tie_embeddings: bool = True          # readout uses the input embedding table
  layer_norm_epsilon: float = 1e-5
  attention: AttentionConfig = AttentionConfig()
  symbolic: SymbolicConfig = SymbolicConfig()
  program: ProgramConfig = ProgramConfig()
  streams: StreamConfig = StreamConfig()
  kernels: KernelConfig = KernelConfig()
  training: TrainingConfig = TrainingConfig()
  # --8<-- [end:fields]

  @classmethod
  def of(cls, **flat) -> ModelConfig:
    """A config from flat fields (``ModelConfig.of(kind='symbolic', hard=True)``), validated."""
    return cls.from_dict(flat)

  def replace(self, **flat) -> ModelConfig:
    """This config with flat fields changed (``cfg.replace(hard=True, num_layers=3)``), validated."""
    return ModelConfig.from_dict({**self.flat(), **flat})

  def flat(self) -> dict[str, Any]:
    """Every field at one level, as the run's ConfigDict holds them."""
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in GROUPS}
    for group in GROUPS:
      out.update(dataclasses.asdict(getattr(self, group)))
    return out

  @classmethod
  def defaults(cls) -> dict[str, Any]:
    """Every field's default, flat."""
    return cls().flat()

  @property
  def d_model(self) -> int:
    return self.num_heads * self.head_dim

  # TransformerLens's names for the same numbers (its HookedTransformerConfig), so that ``hm.cfg.n_heads``
  # and the rest read as its users write them.
  n_layers = property(lambda self: self.num_layers)
  n_heads = property(lambda self: self.num_heads)
  d_head = property(lambda self: self.head_dim)
  d_vocab = property(lambda self: self.vocab_size)
  n_ctx = property(lambda self: self.max_len)
  # Where the interpretability calls' results live (host memory, as NumPy arrays or torch tensors on them),
  # whatever device computed them: TransformerLens's code puts its own result tensors on cfg.device.
  device = property(lambda self: 'cpu')

  @property
  def d_mlp(self) -> int:
    """The FFN's hidden width: every channel's units together in a symbolic channel FFN (eq. 20)."""
    channel = self.kind == 'symbolic' and self.symbolic.vocab_ffn == 'channel'
    return self.num_heads * self.symbolic.ff_dim_per_head if channel else self.ff_dim

  @property
  def act_fn(self) -> str:
    """The FFN's activation under TransformerLens's name: the tanh approximation of GELU is its 'gelu_new'."""
    return 'relu' if self.kind == 'program' else 'gelu_new'

  @property
  def padded_vocab_size(self) -> int:
    return -(-self.vocab_size // self.kernels.vocab_pad_multiple) * self.kernels.vocab_pad_multiple

  @property
  def num_valid_rows(self) -> int | None:
    """The real vocabulary size when the table is padded, else None (no masking needed)."""
    return self.vocab_size if self.padded_vocab_size != self.vocab_size else None

  @classmethod
  def from_dict(cls, d: Any) -> ModelConfig:
    """Builds and validates a config from flat fields (e.g. a ``ConfigDict``'s ``model`` field)."""
    d = dict(d)
    names = set(cls.defaults())
    unknown = sorted(set(d) - names)
    if unknown:
      raise InputError(f'unknown model config field(s) {unknown}; known fields: {sorted(names)}')
    if d.get('symbolic_layers') is not None:
      d['symbolic_layers'] = tuple(int(l) for l in d['symbolic_layers'])
    grouped = {group: {} for group in GROUPS}
    for name in [n for n in d if n in GROUP_OF]:
      grouped[GROUP_OF[name]][name] = d.pop(name)
    config = cls(**d, **{group: GROUPS[group](**fields) for group, fields in grouped.items()})
    config.validate()
    return config

  def validate(self) -> None:
    """Raises ValueError naming the first field that is wrong and what is allowed."""
    # Checked by the flat names the run's ConfigDict uses, which the messages name.
    c = types.SimpleNamespace(**self.flat(), mask_predicates=self.mask_predicates)
    for check in (_check_values, _check_attention, _check_kinds, _check_program, _check_layers, _check_streams):
      check(c)

  def layer_kinds(self) -> tuple[str, ...]:
    """The block kind of every layer: 'standard', 'token_factored' or 'symbolic'."""
    if self.kind != 'symbolic':
      return (self.kind,) * self.num_layers
    chosen = range(self.num_layers) if self.symbolic.symbolic_layers is None else self.symbolic.symbolic_layers
    return tuple('symbolic' if l in chosen else 'token_factored' for l in range(self.num_layers))

  def projects(self, layer: int, site: str) -> bool:
    """Whether ``site`` ('values' or 'ffn') of ``layer`` goes through the vocabulary projection."""
    return self.layer_kinds()[layer] == 'symbolic' and self.symbolic_site(site)

  def symbolic_site(self, site: str) -> bool:
    """Whether a symbolic layer projects ``site`` ('values' or 'ffn')."""
    return self.symbolic.symbolic_sites in ('both', site)

  @property
  def samples_argmaxes(self) -> bool:
    """Whether training takes its argmaxes of Gumbel-perturbed weights: program training (``hard``) or kind
    'program', with a noise scale."""
    return (self.program.hard or self.kind == 'program') and self.program.gumbel_scale > 0

  @property
  def exact_mixtures(self) -> bool:
    """Every stream a convex mixture of token embeddings after every layer: every layer symbolic, both
    sites projected, no gain, convex FFN mixtures (the paper's model, with either ``vocab_ffn``), no gate
    (which scales features apart) and no normalised cascade stream."""
    return (self.kind == 'symbolic' and self.layer_kinds() == ('symbolic',) * self.num_layers
            and self.symbolic.symbolic_sites == 'both' and not self.symbolic.projection_gain
            and self.symbolic.ffn_mixture == 'convex' and self.streams.gate == 'none'
            and not self.streams.cascade_norm)

  @property
  def paper_symbolic(self) -> bool:
    """Algorithm 1 exactly: exact mixtures, each channel's FFN reads its own channel (eq. 20), and positions
    enter only through ALiBi."""
    return (self.exact_mixtures and self.symbolic.vocab_ffn == 'channel' and not self.attention.qk_positions
            and not self.program.numerical_heads)

  def mask_predicates(self) -> tuple[masks.Mask, ...]:
    """The attention mask of every head (one entry when all heads share it)."""
    if self.attention.mask:
      return masks.parse_head_masks(self.attention.mask, self.num_heads)
    mask = masks.causal if self.causal else masks.full
    window = self.attention.window
    return (mask & masks.sliding_window(window) if window else mask,)

  @property
  def channel_norms(self) -> bool:
    """Whether the factored blocks' and the final norms are channel LayerNorms (eq. 18): the symbolic kind,
    or the token-factored kind with ``channel_norm``."""
    return self.kind == 'symbolic' or (self.kind == 'token_factored' and self.streams.channel_norm)

  def sites(self) -> list[str]:
    """Every named site of this model (``symjax.model.intermediates.site_names``)."""
    symbolic_layers = tuple(l for l, kind in enumerate(self.layer_kinds()) if kind == 'symbolic')
    return intermediates.site_names(self.kind, self.num_layers, symbolic_layers, gate=self.streams.gate != 'none',
                                    pls=self.streams.pls_weight > 0)

  def writes(self, sublayer: str) -> str:
    """The stream a factored block's 'attention' or 'ffn' adds its update to: 'x_t' or 'x_e'."""
    stream = self.streams.stream
    if stream == 'token_factored':
      return 'x_t' if sublayer == 'attention' else 'x_e'
    return 'x_e' if stream == 'cascade' else 'x_t'

  def pls_weights(self) -> tuple[float, ...]:
    """Per-layer supervision's weight of each layer's cross-entropy, ``pls_weight`` times the decay's share
    (all zero when it is off). The decays of the dual-stream family's per-layer supervision: 'linear'
    (l + 1) / (L(L + 1)/2), 'exponential' 2^l / (2^L − 1), 'uniform' 1/L, 'linear_final' the last layer
    ``pls_final_weight`` and layer l < L − 1 (1 − pls_final_weight)(l + 1) / (L(L − 1)/2)."""
    s, L = self.streams, self.num_layers
    if s.pls_decay == 'linear':
      shares = [(l + 1) / (L * (L + 1) / 2) for l in range(L)]
    elif s.pls_decay == 'exponential':
      shares = [2.0 ** l / (2.0 ** L - 1) for l in range(L)]
    elif s.pls_decay == 'uniform':
      shares = [1.0 / L] * L
    elif L == 1:
      shares = [1.0]
    else:
      shares = [(1 - s.pls_final_weight) * (l + 1) / ((L - 1) * L / 2) for l in range(L - 1)] + [s.pls_final_weight]
    return tuple(s.pls_weight * w for w in shares)

  @property
  def compute_dtype(self):
    return DTYPES[self.kernels.dtype]


def _check_values(c) -> None:
  """Every number finite and in range, every named choice one of its options."""
  def choice(name, allowed):
    if getattr(c, name) not in allowed:
      raise InputError(f"model.{name} must be one of {list(allowed)}, got {getattr(c, name)!r}")

  def positive(name, strict=True):
    v = getattr(c, name)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or (v <= 0 if strict else v < 0):
      raise InputError(f"model.{name} must be {'> 0' if strict else '>= 0'}, got {v!r}")

  for name, v in vars(c).items():  # a NaN would pass every range check below
    if isinstance(v, float) and not math.isfinite(v):
      raise InputError(f'model.{name} must be a finite number, got {v!r}')
  choice('kind', MODEL_KINDS)
  choice('positions', POSITIONS)
  choice('value_map', VALUE_MAPS)
  choice('channel_norm_scale', CHANNEL_NORM_SCALES)
  choice('vocab_projection', tuple(symbolic.VOCAB_PROJECTIONS))
  choice('dtype', tuple(DTYPES))
  choice('attention_impl', attention_ops.ATTENTION_IMPLS)
  for name in ('attention_impl', 'vocab_projection'):
    if getattr(c, name) == 'cudnn' and c.dtype != 'bfloat16':
      raise InputError(f"model.{name}='cudnn' needs model.dtype='bfloat16' (cuDNN's fused attention "
                       f"takes 16-bit inputs), got model.dtype={c.dtype!r}")
  choice('symbolic_sites', SYMBOLIC_SITES)
  for name, allowed in (('stream', STREAMS), ('head_mixing', HEAD_MIXINGS), ('ffn_mixing', FFN_MIXINGS),
                        ('gate', GATES), ('pls_decay', PLS_DECAYS), ('pls_source', PLS_SOURCES)):
    choice(name, allowed)
  choice('vocab_ffn', symbolic.VOCAB_FFN_MIXING)
  choice('ffn_mixture', symbolic.FFN_MIXTURES)
  if c.ffn_mixture == 'nonnegative' and c.vocab_projection != 'direct':
    raise InputError(f"model.ffn_mixture='nonnegative' is computed by the direct projection only; set "
                     f"model.vocab_projection='direct', got {c.vocab_projection!r}")
  choice('remat', ('none', *REMAT_POLICIES))
  for name in ('vocab_size', 'num_layers', 'num_heads', 'head_dim', 'ff_dim', 'ff_dim_per_head',
               'max_len', 'tau_init', 'embed_init_std', 'layer_norm_epsilon', 'vocab_chunk_size',
               'vocab_pad_multiple'):
    positive(name)
  positive('window', strict=False)
  positive('attention_block', strict=False)

def _check_attention(c) -> None:
  """The mask, relational attention and dropout."""
  if c.mask:
    if c.window:
      raise InputError(f'model.mask {c.mask!r} and model.window = {c.window} both set: write the '
                       f'window into the mask (e.g. "causal & window({c.window})") and set window = 0')
    # Over every position a sequence can have, so that e.g. stride(n) with n > 64 is caught too.
    static = masks.head_mask_matrix(c.mask_predicates(), c.max_len, c.max_len)
    if c.causal and np.triu(static.any(0), 1).any():
      raise InputError(f'model.mask {c.mask!r} lets a position read later positions, but this task is '
                       f"causal (it predicts the next token): add 'causal &' to the mask")
  if c.relational and c.kind == 'lstm':
    raise InputError("model.relational needs an attention model: use 'standard', 'token_factored' or "
                     "'symbolic', not 'lstm'")
  if c.relational and c.attention_block:
    raise InputError('model.relational and model.attention_block cannot be combined: relational attention '
                     'reads a [nodes × nodes] graph, set attention_block = 0')
  for name in ('dropout_rate', 'attention_dropout_rate'):
    if not 0.0 <= getattr(c, name) < 1.0:
      raise InputError(f'model.{name} must be in [0, 1), got {getattr(c, name)!r}')

def _check_kinds(c) -> None:
  """Options that only some kinds have."""
  if c.kind == 'lstm' and not c.causal:
    raise InputError("model.kind 'lstm' reads left to right and needs a causal task; this task is "
                     "bidirectional: use 'standard', 'token_factored' or 'symbolic'")
  if c.kind != 'symbolic' and (c.symbolic_sites != 'both' or c.projection_gain
                                  or c.vocab_ffn != 'channel' or c.ffn_mixture != 'convex'):
    raise InputError(f"model.symbolic_sites, model.projection_gain, model.vocab_ffn and model.ffn_mixture "
                     f"are only for kind 'symbolic', got kind {c.kind!r}")
  if c.qk_positions and c.kind not in ('token_factored', 'symbolic'):
    raise InputError(f"model.qk_positions is for the factored kinds 'token_factored' and 'symbolic' (the "
                     f"standard model has model.positions='learned'), got kind {c.kind!r}")

def _check_program(c) -> None:
  """Program training and numerical heads: the computations they take their argmaxes from."""
  if c.kind == 'program':
    _check_transformer_program(c)
    return
  if c.relaxed:
    raise InputError(f"model.relaxed trains a Transformer Program's relaxation: it needs model.kind = 'program', "
                     f'got {c.kind!r}')
  if c.numerical_readout != 'one_hot':
    raise InputError(f"model.numerical_readout weighs a Transformer Program's numerical variables: it needs "
                     f"model.kind = 'program', got {c.kind!r}")
  if c.numerical_values:
    raise InputError(f"model.numerical_values sums a Transformer Program's numerical variables: it needs "
                     f"model.kind = 'program', got {c.kind!r}")
  if c.readout_reads:
    raise InputError(f"model.readout_reads chooses the variables a Transformer Program's classifier reads: it "
                     f"needs model.kind = 'program', got {c.kind!r}")
  if not c.attention_noise:
    raise InputError(f"model.attention_noise is a Transformer Program's relaxed attention: it needs "
                     f"model.kind = 'program', got {c.kind!r}")
  if c.position_counts:
    raise InputError(f"model.position_counts starts a Transformer Program's numerical heads as counts: it "
                     f"needs model.kind = 'program', got {c.kind!r}")
  if c.symbol_counts:
    raise InputError(f"model.symbol_counts starts a Transformer Program's numerical heads as counts: it "
                     f"needs model.kind = 'program', got {c.kind!r}")
  # What program training and numerical heads both need: the explicit, dense, one-piece computations that
  # the forward pass takes its argmaxes and predicates from.
  needs = (('kind', 'symbolic', c.kind), ('symbolic_sites', 'both', c.symbolic_sites),
           ('vocab_projection', 'direct', c.vocab_projection), ('attention_impl', 'explicit', c.attention_impl),
           ('attention_block', 0, c.attention_block), ('relational', False, c.relational),
           ('symbolic_layers', None, c.symbolic_layers))
  unmet = lambda pairs: '; '.join(f'model.{name} = {got!r} (needs {want!r})' for name, want, got in pairs
                                  if got != want)
  if c.hard:
    wrong = unmet(needs + (('projection_gain', False, c.projection_gain),
                           ('ffn_mixture', 'convex', c.ffn_mixture)))
    if wrong:
      raise InputError(f'model.hard (program training) needs the paper\'s symbolic model with the direct '
                       f'projection and explicit attention: {wrong}')
  if not (math.isfinite(c.gumbel_scale) and c.gumbel_scale >= 0):
    raise InputError(f'model.gumbel_scale must be a finite number >= 0 (0 = off), got {c.gumbel_scale!r}')
  end = c.gumbel_scale_end
  if end is not None and not (c.gumbel_scale > 0 and math.isfinite(end) and end > 0):
    raise InputError(f'model.gumbel_scale_end must be a finite number > 0 with model.gumbel_scale > 0 (or None: '
                     f'constant), got {end!r} with model.gumbel_scale = {c.gumbel_scale!r}')
  if c.gumbel_scale and not c.hard:
    raise InputError(f'model.gumbel_scale samples the argmaxes of program training: it needs model.hard = '
                     f'True, got model.hard = {c.hard!r}')
  if c.numerical_heads:
    if not 0 <= c.numerical_heads <= c.num_heads:
      raise InputError(f'model.numerical_heads must be in [0, model.num_heads = {c.num_heads}], got '
                       f'{c.numerical_heads!r}')
    wrong = unmet(needs)
    if wrong:
      raise InputError(f'model.numerical_heads needs the symbolic model with the direct projection and '
                       f'explicit attention: {wrong}')
  if not c.numerical_positions and not c.numerical_heads:
    raise InputError('model.numerical_positions = False removes positions from numerical heads: it needs '
                     f'model.numerical_heads >= 1, got {c.numerical_heads!r}')

def _check_transformer_program(c) -> None:
  """Kind 'program' is hard by construction; it has numerical heads and MLPs of its own."""
  if not 0 <= c.numerical_heads <= c.num_heads:
    raise InputError(f'model.numerical_heads must be in [0, model.num_heads = {c.num_heads}], got '
                     f'{c.numerical_heads!r}')
  if c.numerical_values and not c.numerical_heads:
    raise InputError('model.numerical_values is what numerical heads sum: it needs model.numerical_heads >= 1, '
                     f'got {c.numerical_heads!r}')
  if not c.numerical_positions and not c.numerical_heads:
    raise InputError('model.numerical_positions = False keeps numerical heads from reading positions: it needs '
                     f'model.numerical_heads >= 1, got {c.numerical_heads!r}')
  if c.numerical_readout not in NUMERICAL_READOUTS or (c.numerical_readout == 'linear' and not c.numerical_heads):
    raise InputError(f'model.numerical_readout must be one of {list(NUMERICAL_READOUTS)} (linear needs '
                     f'model.numerical_heads >= 1), got {c.numerical_readout!r} with model.numerical_heads = '
                     f'{c.numerical_heads!r}')
  if not (isinstance(c.mlps, int) and c.mlps >= 0) or not (isinstance(c.mlp_hidden, int) and c.mlp_hidden > 0):
    raise InputError(f'model.mlps must be an int >= 0 and model.mlp_hidden an int > 0, got {c.mlps!r} and '
                     f'{c.mlp_hidden!r}')
  variables = 2 + c.num_layers * (c.num_heads + c.mlps)
  if not (isinstance(c.readout_reads, int) and 0 <= c.readout_reads <= variables):
    raise InputError(f'model.readout_reads must be an int in [0, {variables}] (0: the classifier reads every '
                     f'variable; the model has {variables}), got {c.readout_reads!r}')
  if c.symbol_counts and not c.numerical_positions:
    raise InputError('model.symbol_counts starts numerical heads whose query reads positions: it needs '
                     'model.numerical_positions = True, got False')
  if c.position_counts and (c.numerical_heads < 3 or not c.numerical_positions):
    raise InputError(f'model.position_counts starts three numerical heads counting positions: it needs '
                     f'model.numerical_heads >= 3 and model.numerical_positions = True, got '
                     f'{c.numerical_heads!r} and {c.numerical_positions!r}')
  if c.relational or c.qk_positions or c.hard:
    raise InputError("model.kind 'program' reads its positions as a variable and is always hard: set "
                     'model.relational, model.qk_positions and model.hard to False')
  end = c.gumbel_scale_end
  if not (math.isfinite(c.gumbel_scale) and c.gumbel_scale >= 0) or (
      end is not None and not (c.gumbel_scale > 0 and math.isfinite(end) and end > 0)):
    raise InputError(f'model.gumbel_scale must be >= 0, and model.gumbel_scale_end > 0 (or None) with it, got '
                     f'{c.gumbel_scale!r} and {end!r}')
  if not c.attention_noise and not c.relaxed:
    raise InputError('model.attention_noise = False trains the relaxed attention without its noise: it needs '
                     'model.relaxed = True')
  if c.relaxed and not c.gumbel_scale:
    raise InputError('model.relaxed trains on Gumbel-softmax samples at the temperature model.gumbel_scale: set '
                     'it > 0 (Learning Transformer Programs anneals it from 3), or model.relaxed = False')


def _check_layers(c) -> None:
  if c.symbolic_layers is not None:
    if c.kind != 'symbolic':
      raise InputError(f"model.symbolic_layers is only for kind 'symbolic', got kind {c.kind!r}")
    bad = [l for l in c.symbolic_layers if not 0 <= l < c.num_layers]
    if bad:
      raise InputError(f'model.symbolic_layers {bad} out of range: layers are 0..{c.num_layers - 1}')


def _check_streams(c) -> None:
  """The dual-stream family's options: which kinds have them, and what each combines with."""
  for name in ('pls_weight', 'pls_final_weight'):
    v = getattr(c, name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
      raise InputError(f'model.{name} must be a number in [0, 1], got {v!r}')
  factored = c.kind in ('token_factored', 'symbolic')
  changed = [f'model.{name} = {getattr(c, name)!r}' for name, default in (
      ('stream', 'token_factored'), ('cascade_norm', False), ('head_mixing', 'independent'), ('gate', 'none'))
      if getattr(c, name) != default]
  if changed and not factored:
    raise InputError(f"{', '.join(changed)}: streams, head mixing and gates are for the factored kinds "
                     f"'token_factored' and 'symbolic', got kind {c.kind!r} (the standard kind is the single "
                     f'stream with a dense output projection already)')
  if c.channel_norm and c.kind != 'token_factored':
    raise InputError(f"model.channel_norm is for kind 'token_factored' (the symbolic kind always has channel "
                     f'LayerNorms), got kind {c.kind!r}')
  if c.cascade_norm and c.stream != 'cascade':
    raise InputError(f"model.cascade_norm normalises the frozen X_t of model.stream = 'cascade', got "
                     f'model.stream = {c.stream!r}')
  if c.kind in ('lstm', 'program') and (c.ffn_mixing != 'dense' or c.pls_weight or c.positions == 'rope'):
    raise InputError(f"model.ffn_mixing, model.pls_weight and model.positions = 'rope' are for the transformer "
                     f"kinds 'standard', 'token_factored' and 'symbolic', got kind {c.kind!r}")
  if factored and c.positions == 'learned':
    raise InputError("model.positions = 'learned' adds a position embedding to the input, which would enter "
                     "X_t: the factored kinds take 'alibi' or 'rope' (or model.qk_positions)")
  if c.value_map in ('independent', 'dense') and not factored:
    raise InputError(f"model.value_map = {c.value_map!r} is a factored kind's value map, got kind {c.kind!r}")
  if c.kind == 'symbolic' and c.head_mixing != 'independent':
    raise InputError(f"model.head_mixing = {c.head_mixing!r} would add other channels' values to channel h, "
                     f"which is then no mixture of E^(h): kind 'symbolic' takes 'independent' (use kind "
                     f"'token_factored' with model.channel_norm for the dual-stream family's mixings)")
  if (c.hard or c.numerical_heads) and (c.stream != 'token_factored' or c.gate != 'none' or c.positions == 'rope'
                                         or c.value_map in ('independent', 'dense')):
    raise InputError('program training and numerical heads decompile the paper\'s symbolic model: set '
                     "model.stream = 'token_factored', model.gate = 'none', model.positions = 'alibi' and a "
                     'kronecker value map (or none)')
  if c.positions == 'rope' and c.head_dim % 2:
    raise InputError(f"model.positions = 'rope' rotates pairs of features: model.head_dim must be even, got "
                     f'{c.head_dim}')
  if c.ffn_mixing == 'independent' and c.ff_dim % c.num_heads:
    raise InputError(f"model.ffn_mixing = 'independent' gives each channel ff_dim / num_heads units: model.ff_dim "
                     f'= {c.ff_dim} must be a multiple of model.num_heads = {c.num_heads}')
  if c.pls_source == 'x_e' and not factored:
    raise InputError(f"model.pls_source = 'x_e' decodes a factored kind's X_e: kind {c.kind!r} has one stream, "
                     "decode it with 'x'")
  if c.relational and c.positions == 'rope':
    raise InputError("model.relational attention reads a graph, where node order means nothing: set "
                     "model.positions = 'alibi' (no bias is added over edges)")
