"""The run configuration: defaults for every field, recipe loading, argument parsing, and validation at start.

Every recipe under ``configs/`` (shipped as ``symjax.configs``) starts from ``default_config()`` and writes
out the fields it sets, with the reason; this file is the one place where each field is defined and
commented.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import ml_collections
from ml_collections import config_dict

from symjax import tasks
from symjax.model import ModelConfig
from symjax.run.workdir import BEST_METRICS, checkpoint_choice
from symjax.system import mesh
from symjax.system.errors import InputError
from symjax.tasks import text

# config.distributed.cpu_collectives: JAX's cross-process collectives on CPU ('' keeps JAX's default).
CPU_COLLECTIVES = ('', 'gloo', 'mpi')


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """Parses ``'key=value,key=value'`` (the part after ``:`` in ``--config=file.py:...``) over defaults.

  Values are converted to the type of the default; unknown keys are an error.
  """
  result = ml_collections.ConfigDict(defaults)
  if not arg:
    return result
  for item in arg.split(','):
    if '=' not in item:
      raise InputError(f'config argument {item!r} is not key=value; known keys: {sorted(defaults)}')
    key, value = item.split('=', 1)
    if key not in defaults:
      raise InputError(f'unknown config argument {key!r}; known keys: {sorted(defaults)}')
    kind = type(defaults[key])
    if kind is bool:
      if value.lower() not in ('true', 'false', '1', '0'):
        raise InputError(f'config argument {key} must be true or false, got {value!r}')
      result[key] = value.lower() in ('true', '1')
    else:
      result[key] = kind(value)
  return result


def model_defaults(kind: str, shape: dict | None = None) -> ml_collections.ConfigDict:
  """``config.model``: the ModelConfig fields, less those the task decides (vocab_size, causal), with
  ``shape`` (a recipe's size: ``symjax.configs.shape``) over the defaults."""
  fields = ModelConfig.defaults()
  del fields['vocab_size'], fields['causal']
  fields.update(shape or {}, kind=kind)
  model = ml_collections.ConfigDict(fields)
  # None-valued fields need a typed placeholder so that command-line overrides type-check.
  model.symbolic_layers = config_dict.placeholder(tuple)
  model.gumbel_scale_end = config_dict.placeholder(float)
  return model


# --8<-- [start:fields]
def default_config(kind: str = 'symbolic', shape: dict | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # --- Task -------------------------------------------------------------------------------------------
  c.task = 'induction'         # 'induction' (built in, the default) or 'text' (any UTF-8 file)
  c.data_seed = 0              # seed of generated datasets (fixed across runs so splits stay the same)
  c.text_path = ''             # task 'text': the UTF-8 corpus
  c.token_path = ''            # task 'text': instead, a folder of `python -m symjax.cli.tokenize` (memory-mapped)
  c.tokenizer = 'char'         # task 'text': 'char' (one token per character) or 'bpe' (byte-pair)
  c.bpe_vocab_size = 512       # task 'text' with tokenizer 'bpe': vocabulary size to train
  c.seq_len = 64               # task 'text': window length in tokens
  c.eval_windows = 512         # task 'text': windows per evaluation
  # --- Model ------------------------------------------------------------------------------------------
  c.model = model_defaults(kind, shape)  # see symjax.model.ModelConfig for every field
  # Embeddings of std 0.25 rather than GPT's 0.02 (ModelConfig's default): the symbolic projections score
  # z_h·E^(h) / τ_h, and with tiny embeddings every mixture α starts uniform and learning stalls. Every recipe
  # sets it again with its reason.
  c.model.embed_init_std = 0.25
  # --- Optimisation -----------------------------------------------------------------------------------
  c.seed = 0                   # parameter initialisation, data order and dropout
  c.batch_size = 64
  c.total_steps = 3000
  c.learning_rate = 3e-3       # peak learning rate of AdamW
  c.warmup_steps = 100         # linear warmup from 0 to the peak
  c.end_learning_rate_fraction = 0.1  # cosine decay ends at this fraction of the peak
  c.weight_decay = 0.01        # decoupled, by role: see optim.DECAYED_LEAVES
  c.adam_b1 = 0.9
  c.adam_b2 = 0.98
  c.grad_clip_norm = 1.0       # global-norm clipping; 0 disables it
  # Fixed-set tasks: > 0 draws training rows with probability ∝ n_L^(-length_balance), n_L the training
  # sequences of the row's length, so that rare lengths weigh in the loss (1: every length alike); 0 walks
  # shuffled epochs. Evaluation is never reweighted.
  c.length_balance = 0.0
  # With model.hard (program training): the first soft_steps train the soft model (the paper's mixtures and
  # attention), the rest the hard one; evaluation and checkpoints always score the hard model (the program).
  c.soft_steps = 0
  # With model.relaxed (kind 'program'): the last straight_steps train straight-through (the argmax program
  # itself, as model.relaxed = False trains, the noise scale the schedule's temperature) rather than the
  # relaxation, so that training ends on the program that is evaluated and decompiled.
  c.straight_steps = 0
  # Program training (model.kind 'program'): > 0 adds this weight times Σ_v ‖W_v‖₂ to the loss, W_v the readout
  # rows of variable v: a group lasso, to push whole variables out of the classifier. No recipe sets it: at
  # 0.001 sort and dyck1 lost accuracy (docs/results/programs_steps.md).
  c.readout_sparsity = 0.0
  # --- Evaluation, logging and checkpoints ------------------------------------------------------------
  c.log_every_steps = 50       # train metrics to metrics.jsonl and TensorBoard
  c.eval_every_steps = 500     # validation metrics; a checkpoint is saved at each evaluation
  c.top_ks = (3,)              # top-k accuracy is reported for each k
  c.keep_checkpoints = 2       # the last k checkpoints are kept, plus the best by best_metric
  c.best_metric = 'accuracy'   # validation metric that picks the best checkpoint: one of BEST_METRICS
  c.stop_at_accuracy = 0.0     # > 0: stop early once validation accuracy reaches this (0 disables)
  c.numeral_glyph_init = False  # task 'fol': initialise the numerals' embeddings from their glyphs
  c.progress_bar = True        # a progress bar on a terminal or in a notebook (never in logs)
  c.compilation_cache_dir = '~/.cache/symjax/jax'  # JAX's persistent compilation cache; '' disables it

  # --- Distillation from a trained teacher (symjax.train.distill; "Symbolic Transformers" §8.2) -------------
  c.distill = ml_collections.ConfigDict()
  c.distill.teacher = ''           # work directory of the trained teacher; '' = no distillation
  c.distill.teacher_checkpoint = 'best'  # the teacher's 'best' or 'latest' checkpoint, or a step number
  c.distill.label_weight = 1.0     # weight of the cross-entropy with the task's targets
  c.distill.logits_weight = 1.0    # weight of T²·KL(teacher ‖ student) on the logits
  c.distill.temperature = 1.0      # T of the logit loss
  c.distill.streams = 'x_t:1.0,x_e:1.0'  # stream:weight hidden-state losses (x_t, x_e, x); '' = logits only

  # --- Devices, sharding and processes ----------------------------------------------------------------
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1             # devices along the batch axis; -1: all that 'vocab' leaves
  c.mesh.vocab = 1             # devices along the vocabulary axis (embedding table and its softmaxes)
  # Logical axis names used in the model -> mesh axes (None: replicated).
  c.sharding_rules = mesh.DEFAULT_RULES
  c.readout = 'direct'         # LM loss: 'direct' (full logits) or 'streamed' (vocabulary chunks)
  c.distributed = ml_collections.ConfigDict()
  c.distributed.coordinator_address = ''  # 'host:port' of process 0 for a multi-process run ('' = none)
  c.distributed.num_processes = 1
  c.distributed.process_id = 0
  c.distributed.cpu_collectives = ''      # 'gloo' for multi-process runs on CPU
  # A process silent this long is taken as lost and the others stop (JAX's heartbeat; JAX's default).
  c.distributed.heartbeat_timeout_seconds = 100
  return c
# --8<-- [end:fields]


def runlocal(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The seconds-long version of a recipe (``runlocal=true`` in every config file), for tests, notebooks and
  a first look: 20 steps, evaluation every 10 on a few batches, one checkpoint kept, a program training phase
  (``soft_steps``, ``straight_steps``) the same share of them. Pair it with ``size=tiny``, which the config
  files choose for it."""
  for phase in ('soft_steps', 'straight_steps'):
    if config.get(phase, 0):
      config[phase] = min(max(1, round(20 * config[phase] / config.total_steps)), 19)
  config.total_steps = 20
  config.warmup_steps = 2
  config.log_every_steps = 5
  config.eval_every_steps = 10
  config.eval_windows = 16
  config.keep_checkpoints = 1
  return config


def model_config(config: ml_collections.ConfigDict, vocab_size: int, causal: bool, vocab_shards: int = 1
                 ) -> ModelConfig:
  """The ModelConfig of a run; the table is padded to a multiple of the vocabulary mesh axis."""
  fields = {**config.model.to_dict(), 'vocab_size': vocab_size, 'causal': causal}
  fields['vocab_pad_multiple'] = math.lcm(fields.get('vocab_pad_multiple', 1), vocab_shards)
  return ModelConfig.from_dict(fields)


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """A run config as ``validate`` parses it, once: the ConfigDict as given (what the steps, the loop and
  config.json read by name) and its typed parts: the model's config, every field checked (its vocabulary and
  causality are the task's: ``model_for``), and the distillation streams."""

  config: ml_collections.ConfigDict
  model: ModelConfig
  streams: dict[str, float]   # distillation streams with a weight > 0 ({} for logits only or no teacher)

  def model_for(self, vocab_size: int, causal: bool, vocab_shards: int = 1) -> ModelConfig:
    """The model of a task of ``vocab_size`` tokens; its table padded to a multiple of the vocabulary mesh
    axis."""
    return self.model.replace(vocab_size=vocab_size, causal=causal,
                              vocab_pad_multiple=math.lcm(self.model.kernels.vocab_pad_multiple, vocab_shards))


def check_finite(config: ml_collections.ConfigDict, prefix: str = 'config') -> None:
  """Raises ValueError naming the first float field (at any depth) that is NaN or infinite.

  The range checks below compare with bounds, and a NaN passes every comparison that is written as a test
  for the bad case (``nan <= 0`` is False): without this, ``--config.learning_rate=nan`` would start a run
  that fails steps later on non-finite metrics."""
  for name, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      check_finite(value, f'{prefix}.{name}')
    elif isinstance(value, float) and not math.isfinite(value):
      raise InputError(f'{prefix}.{name} must be a finite number, got {value!r}')


def _check_program_training(config: ml_collections.ConfigDict) -> None:
  """The fields only program training reads: ``soft_steps``, ``straight_steps`` and ``readout_sparsity``."""
  if config.get('soft_steps', 0):
    if not config.model.get('hard', False):
      raise InputError(f'config.soft_steps = {config.soft_steps} is for program training: set '
                       f'config.model.hard = True too, or soft_steps = 0')
    if not 0 < config.soft_steps < config.total_steps:
      raise InputError(f'config.soft_steps must be in [0, config.total_steps = {config.total_steps}), got '
                       f'{config.soft_steps!r}')
  if config.get('straight_steps', 0):
    if config.model.kind != 'program' or not config.model.get('relaxed', False):
      raise InputError(f'config.straight_steps = {config.straight_steps} ends relaxed program training '
                       f"straight-through: it needs model.kind = 'program' and model.relaxed = True, got "
                       f'{config.model.kind!r} and {config.model.get("relaxed", False)!r}')
    if not 0 < config.straight_steps < config.total_steps:
      raise InputError(f'config.straight_steps must be in [0, config.total_steps = {config.total_steps}), got '
                       f'{config.straight_steps!r}')
  if config.get('readout_sparsity', 0.0):
    if config.model.kind != 'program' or config.readout_sparsity < 0:
      raise InputError(f'config.readout_sparsity must be >= 0, and > 0 only with model.kind = program (its '
                       f'readout reads one variable per block); got {config.readout_sparsity!r} with model.kind = '
                       f'{config.model.kind!r}')


def validate(config: ml_collections.ConfigDict) -> RunSpec:
  """Checks every field once at start (the error names the field and what is allowed); the run spec parsed
  from them."""
  check_finite(config)
  tasks.check_name(config.task)
  if config.task == 'text' and not (config.text_path or config.get('token_path')):
    raise InputError("config.text_path is empty: task 'text' needs the path of a UTF-8 text file "
                     "(or config.token_path, a folder written by `python -m symjax.cli.tokenize`)")
  if config.task == 'text' and config.text_path and config.get('token_path'):
    raise InputError(f'config.text_path ({config.text_path!r}) and config.token_path ({config.token_path!r}) are '
                     f'both set: give one (a token folder holds its own vocabulary, and reads as its text does)')
  if not config.top_ks or any(not isinstance(k, int) or k < 1 for k in config.top_ks):
    raise InputError(f'config.top_ks must be a non-empty tuple of integers >= 1, got {config.top_ks!r}')
  positive = ['batch_size', 'total_steps', 'learning_rate', 'log_every_steps', 'eval_every_steps',
              'keep_checkpoints', 'seq_len', 'eval_windows', 'bpe_vocab_size']
  for name in positive:
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
      raise InputError(f'config.{name} must be > 0, got {value!r}')
  for name in ('warmup_steps', 'weight_decay', 'grad_clip_norm'):
    if config[name] < 0:
      raise InputError(f'config.{name} must be >= 0, got {config[name]!r}')
  if not 0 <= config.get('length_balance', 0.0) <= 1:
    raise InputError(f'config.length_balance must be in [0, 1] (0 walks shuffled epochs, 1 weighs every length '
                     f'alike), got {config.length_balance!r}')
  _check_program_training(config)
  if not 0 <= config.stop_at_accuracy <= 1:
    raise InputError(f'config.stop_at_accuracy must be in [0, 1] (0 disables early stopping), got '
                     f'{config.stop_at_accuracy!r}')
  if config.warmup_steps >= config.total_steps:
    raise InputError(f'config.warmup_steps ({config.warmup_steps}) must be < config.total_steps '
                     f'({config.total_steps})')
  if not 0 <= config.end_learning_rate_fraction <= 1:
    raise InputError(f'config.end_learning_rate_fraction must be in [0, 1], got '
                     f'{config.end_learning_rate_fraction!r}')
  for name in ('adam_b1', 'adam_b2'):
    if not 0 <= config[name] < 1:
      raise InputError(f'config.{name} must be in [0, 1), got {config[name]!r}')
  if config.best_metric not in BEST_METRICS:
    raise InputError(f'config.best_metric must be one of {list(BEST_METRICS)}, got {config.best_metric!r}')
  if config.numeral_glyph_init and config.task != 'fol':
    raise InputError(f"config.numeral_glyph_init is only for task 'fol', got task {config.task!r}")
  if config.readout not in ('direct', 'streamed'):
    raise InputError(f"config.readout must be one of ['direct', 'streamed'], got {config.readout!r}")
  if config.task == 'text' and config.tokenizer not in ('char', 'bpe'):
    raise InputError(f"config.tokenizer must be one of ['char', 'bpe'], got {config.tokenizer!r}")
  if config.task == 'text' and config.tokenizer == 'bpe' and config.bpe_vocab_size < text.BPE_MIN_VOCAB:
    raise InputError(f'config.bpe_vocab_size must be >= {text.BPE_MIN_VOCAB} (a byte-level BPE vocabulary '
                     f'starts from the {text.BPE_MIN_VOCAB} bytes), got {config.bpe_vocab_size!r}')
  for name in ('seed', 'data_seed'):
    if isinstance(config[name], bool) or not isinstance(config[name], int) or config[name] < 0:
      raise InputError(f'config.{name} must be an integer >= 0, got {config[name]!r}')
  axes = (mesh.DATA_AXIS, mesh.VOCAB_AXIS, None)
  for rule in config.sharding_rules:
    if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and rule[0] in mesh.LOGICAL_AXES
            and rule[1] in axes):
      raise InputError(f'config.sharding_rules must be (logical axis, mesh axis) pairs, the logical axis one of '
                       f'{list(mesh.LOGICAL_AXES)} and the mesh axis one of {list(axes)}, e.g. '
                       f'{mesh.DEFAULT_RULES}; got the rule {rule!r}')
  d = config.distributed
  if isinstance(d.num_processes, bool) or not isinstance(d.num_processes, int) or d.num_processes < 1:
    raise InputError(f'config.distributed.num_processes must be an integer >= 1, got {d.num_processes!r}')
  if not 0 <= d.process_id < d.num_processes:
    raise InputError(f'config.distributed.process_id must be in [0, {d.num_processes}) (0 .. num_processes - 1), '
                     f'got {d.process_id!r}')
  timeout = d.get('heartbeat_timeout_seconds', 100)
  if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
    raise InputError(f'config.distributed.heartbeat_timeout_seconds must be an integer >= 1, got {timeout!r}')
  if d.cpu_collectives not in CPU_COLLECTIVES:
    raise InputError(f"config.distributed.cpu_collectives must be one of {list(CPU_COLLECTIVES)} ('' = JAX's "
                     f"default), got {d.cpu_collectives!r}")
  streams = validate_distill(config)
  # The model fields, with placeholders for what the task decides (RunSpec.model_for).
  return RunSpec(config, model_config(config, vocab_size=2, causal=True), streams)


DISTILL_STREAMS = ('x_t', 'x_e', 'x')


def parse_streams(spec: str) -> dict[str, float]:
  """``'x_t:1.0,x_e:0.5'`` -> {'x_t': 1.0, 'x_e': 0.5}; '' -> {} (logits only)."""
  out: dict[str, float] = {}
  for part in filter(None, (p.strip() for p in spec.split(','))):
    m = re.fullmatch(r'(\w+)\s*:\s*([0-9.eE+-]+)', part)
    if not m or m.group(1) not in DISTILL_STREAMS:
      raise InputError(f'config.distill.streams: cannot read {part!r}; write stream:weight pairs separated by '
                       f'commas, streams from {list(DISTILL_STREAMS)}, e.g. "x_t:1.0,x_e:1.0" ("" for none)')
    try:
      weight = float(m.group(2))
    except ValueError:
      weight = -1.0
    if weight < 0 or m.group(1) in out:
      raise InputError(f'config.distill.streams: {part!r} needs a weight >= 0 and each stream once, '
                       f'got {spec!r}')
    out[m.group(1)] = weight
  return out


def distills(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config`` distils from a teacher."""
  return bool(config.get('distill') and config.distill.teacher)


def validate_distill(config: ml_collections.ConfigDict) -> dict[str, float]:
  """The distill fields alone (the teacher itself is checked by ``load_teacher``); the streams distilled,
  with their weights (> 0)."""
  if not distills(config):
    return {}
  d = config.distill
  for name in ('label_weight', 'logits_weight'):
    if isinstance(d[name], bool) or not isinstance(d[name], (int, float)) or d[name] < 0:
      raise InputError(f'config.distill.{name} must be a number >= 0, got {d[name]!r}')
  if isinstance(d.temperature, bool) or not isinstance(d.temperature, (int, float)) or d.temperature <= 0:
    raise InputError(f'config.distill.temperature must be > 0, got {d.temperature!r}')
  checkpoint_choice(str(d.teacher_checkpoint), 'config.distill.teacher_checkpoint')
  streams = parse_streams(d.streams)
  if d.label_weight == 0 and d.logits_weight == 0 and not any(streams.values()):
    raise InputError('config.distill: every weight is 0 (label_weight, logits_weight, streams); nothing '
                     'would be learned')
  return {s: w for s, w in streams.items() if w > 0}
