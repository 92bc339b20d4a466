"""The run configuration: defaults for every field, variant parsing, and validation at start.

Every config under ``configs/`` starts from ``default_config()`` and changes a few fields; this file is the
one place where each field is defined and commented.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from typing import Any

import ml_collections
from ml_collections import config_dict

from symjax import mesh, tasks
from symjax.tasks import text
from symjax.model import ModelConfig

# Model sizes by name (``--config=configs/symbolic.py:size=...``).
SIZES = {
    'tiny': dict(num_layers=2, num_heads=2, head_dim=8, ff_dim=32, ff_dim_per_head=16),
    'small': dict(num_layers=2, num_heads=4, head_dim=16, ff_dim=256, ff_dim_per_head=64),
    'medium': dict(num_layers=4, num_heads=4, head_dim=32, ff_dim=512, ff_dim_per_head=128),
    'paper': dict(num_layers=12, num_heads=12, head_dim=64, ff_dim=3072, ff_dim_per_head=256),
}
# Peak learning rate of the text recipe, per kind (see variant): the point each kind's 3-seed sweep chose
# on validation loss from the same grid, {3e-3, 1e-2} × {tied, untied readout} (README, "The Symbolic
# Transformer against the baselines"; benchmarks/results/suite_tied_untied_h100.json): standard 3e-3, tied
# (1.672 ± 0.018); token_factored 3e-3, untied (1.686 ± 0.011, against 1.702 ± 0.033 at 1e-2); symbolic
# 1e-2, untied (1.860 ± 0.020, against 1.936 ± 0.013 at 3e-3). The LSTM keeps nanoGPT's 1e-3 (not swept).
TEXT_LEARNING_RATES = {'standard': 3e-3, 'token_factored': 3e-3, 'symbolic': 1e-2, 'lstm': 1e-3}
# Embedding std of the text recipe: GPT's 0.02 for the standard model (0.25 costs it about 0.1 nats on the
# recipe); the two-stream models keep the default 0.25 (their X_t stream starts as the embedding itself).
TEXT_EMBED_INIT_STD = {'standard': 0.02}
# Kinds whose readout has a table of its own (``model.tie_embeddings = False``) on the benchmark tasks,
# chosen on validation loss from the same grid for every kind (learning rate × tied or untied, 3 seeds;
# README, "The Symbolic Transformer against the baselines"; benchmarks/results/suite_tied_untied_h100.json).
# The symbolic model (configs/fol.py, configs/rasp.py and task=text): its embedding table is both the basis
# of every mixture and, tied, the readout; given a readout of its own its text validation loss falls from
# 2.234 ± 0.301 to 1.860 ± 0.020, FOL from 1.134 ± 0.052 to 1.069 ± 0.012, and validation prefers it on 5 of
# the 7 RASP tasks. The mixtures are still of the input table, so the token reading is unchanged. The
# induction task keeps the tied readout for every kind (symbolic, one seed: 100.00% test accuracy tied,
# 99.92% untied). The other kinds keep the tied readout, except token_factored on text
# (TEXT_UNTIED_READOUT: 1.686 ± 0.011 against 1.744 ± 0.029; tied is better on FOL, 1.032 against 1.053).
UNTIED_READOUT = ('symbolic',)
TEXT_UNTIED_READOUT = ('symbolic', 'token_factored')
# config.distributed.cpu_collectives: JAX's cross-process collectives on CPU ('' keeps JAX's default).
CPU_COLLECTIVES = ('', 'gloo', 'mpi')
BEST_METRICS = {'accuracy': 'max', 'loss': 'min', 'perplexity': 'min', 'sequence_accuracy': 'max'}


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """Parses ``'key=value,key=value'`` (the part after ``:`` in ``--config=file.py:...``) over defaults.

  Values are converted to the type of the default; unknown keys are an error.
  """
  result = ml_collections.ConfigDict(defaults)
  if not arg:
    return result
  for item in arg.split(','):
    if '=' not in item:
      raise ValueError(f'config argument {item!r} is not key=value; known keys: {sorted(defaults)}')
    key, value = item.split('=', 1)
    if key not in defaults:
      raise ValueError(f'unknown config argument {key!r}; known keys: {sorted(defaults)}')
    kind = type(defaults[key])
    if kind is bool:
      if value.lower() not in ('true', 'false', '1', '0'):
        raise ValueError(f'config argument {key} must be true or false, got {value!r}')
      result[key] = value.lower() in ('true', '1')
    else:
      result[key] = kind(value)
  return result


def model_defaults(kind: str, size: str) -> ml_collections.ConfigDict:
  """``config.model``: the ModelConfig fields, less those the task decides (vocab_size, causal)."""
  if size not in SIZES:
    raise ValueError(f'size must be one of {list(SIZES)}, got {size!r}')
  fields = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
  del fields['vocab_size'], fields['causal']
  fields.update(SIZES[size], kind=kind)
  model = ml_collections.ConfigDict(fields)
  # None-valued fields need a typed placeholder so that command-line overrides type-check.
  model.symbolic_layers = config_dict.placeholder(tuple)
  return model


def default_config(kind: str = 'symbolic', size: str = 'small') -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # --- Task -------------------------------------------------------------------------------------------
  c.task = 'induction'         # 'induction' (built in, the default) or 'text' (any UTF-8 file)
  c.data_seed = 0              # seed of generated datasets (fixed across runs so splits stay the same)
  c.text_path = ''             # task 'text': the UTF-8 corpus
  c.token_path = ''            # task 'text': instead, a folder of `python -m symjax.tokenize` (memory-mapped)
  c.tokenizer = 'char'         # task 'text': 'char' (one token per character) or 'bpe' (byte-pair)
  c.bpe_vocab_size = 512       # task 'text' with tokenizer 'bpe': vocabulary size to train
  c.seq_len = 64               # task 'text': window length in tokens
  c.eval_windows = 512         # task 'text': windows per evaluation
  # --- Model ------------------------------------------------------------------------------------------
  c.model = model_defaults(kind, size)   # see symjax.model.ModelConfig for every field
  # Embeddings of std 0.25 rather than GPT's 0.02: the symbolic projections score z_h·E^(h) / τ_h, and
  # with tiny embeddings every mixture α starts uniform and learning stalls (3000 steps of the induction
  # task: 97% accuracy at 0.02, 100% at 0.25). All kinds use the same value, for equal footing.
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

  # --- Distillation from a trained teacher (symjax.distill; "Symbolic Transformers" §8.2) -------------
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
  return c


def variant(kind: str, arg: str | None) -> ml_collections.ConfigDict:
  """The config of ``configs/<kind>.py:arg``: arg is ``task=induction|text,size=tiny|small|medium|paper`` and
  ``runlocal=true`` for the seconds-long version (``runlocal``).

  ``task=text`` trains a character-level language model on ``--config.text_path`` with nanoGPT's published
  CPU recipe for shakespeare_char (with size=medium its shape: 4 layers, 4 heads × 32): context 64, batch
  12, 2000 steps, AdamW β = (0.9, 0.99), weight decay 0.1, warmup 100, cosine to a tenth of the peak,
  clipping 1.0, no dropout; the peak learning rate is the kind's own (``TEXT_LEARNING_RATES``).
  ``model.max_len`` is four times the window (a reference: overriding ``seq_len`` moves it too, unless
  ``model.max_len`` is set as well), so sampling can continue past the training context (ALiBi
  extrapolates).
  """
  a = parse_arg(arg, task='induction', size='small', runlocal=False)
  config = default_config(kind=kind, size='tiny' if a.runlocal else a.size)
  config.task = a.task
  if a.task == 'text':
    config.seq_len = 64
    config.model.max_len = 4 * config.get_ref('seq_len')  # follows --config.seq_len unless set itself
    config.batch_size = 12
    config.total_steps = 2000
    config.learning_rate = TEXT_LEARNING_RATES[kind]
    config.model.embed_init_std = TEXT_EMBED_INIT_STD.get(kind, config.model.embed_init_std)
    config.model.tie_embeddings = kind not in TEXT_UNTIED_READOUT
    config.adam_b2 = 0.99
    config.weight_decay = 0.1
    config.eval_every_steps = 250
    config.best_metric = 'loss'
  return runlocal(config) if a.runlocal else config


def runlocal(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The seconds-long version of a recipe (``runlocal=true`` in every config file), for tests, notebooks and
  a first look: 20 steps, evaluation every 10 on a few batches, one checkpoint kept. Pair it with
  ``size=tiny``, which the config files choose for it."""
  config.total_steps = 20
  config.warmup_steps = 2
  config.log_every_steps = 5
  config.eval_every_steps = 10
  config.eval_windows = 16
  config.keep_checkpoints = 1
  return config


def from_file(spec: str) -> ml_collections.ConfigDict:
  """The config ``python -m symjax.main --config=SPEC`` would use: ``path/to/config.py[:arguments]``, the
  path relative to the working directory or to the repository (so ``configs/rasp.py:task=sort`` works
  from anywhere inside a checkout)."""
  path, _, arg = spec.partition(':')
  if not os.path.isfile(path):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(repo, path)):
      path = os.path.join(repo, path)
    else:
      raise FileNotFoundError(f'config file {path!r} does not exist')
  module_spec = importlib.util.spec_from_file_location(f'_config_{os.path.basename(path)[:-3]}', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def model_config(config: ml_collections.ConfigDict, vocab_size: int, causal: bool, vocab_shards: int = 1
                 ) -> ModelConfig:
  """The ModelConfig of a run; the table is padded to a multiple of the vocabulary mesh axis."""
  fields = {**config.model.to_dict(), 'vocab_size': vocab_size, 'causal': causal}
  fields['vocab_pad_multiple'] = math.lcm(fields.get('vocab_pad_multiple', 1), vocab_shards)
  return ModelConfig.from_dict(fields)


def check_finite(config: ml_collections.ConfigDict, prefix: str = 'config') -> None:
  """Raises ValueError naming the first float field (at any depth) that is NaN or infinite.

  The range checks below compare with bounds, and a NaN passes every comparison that is written as a test
  for the bad case (``nan <= 0`` is False): without this, ``--config.learning_rate=nan`` would start a run
  that fails steps later on non-finite metrics."""
  for name, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      check_finite(value, f'{prefix}.{name}')
    elif isinstance(value, float) and not math.isfinite(value):
      raise ValueError(f'{prefix}.{name} must be a finite number, got {value!r}')


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks every field once at start; the error names the field and what is allowed."""
  check_finite(config)
  if config.task not in tasks.TASKS:
    raise ValueError(f'config.task must be one of {sorted(tasks.TASKS)}, got {config.task!r}')
  if config.task == 'text' and not (config.text_path or config.get('token_path')):
    raise ValueError("config.text_path is empty: task 'text' needs the path of a UTF-8 text file "
                     "(or config.token_path, a folder written by `python -m symjax.tokenize`)")
  if config.task == 'text' and config.text_path and config.get('token_path'):
    raise ValueError(f'config.text_path ({config.text_path!r}) and config.token_path ({config.token_path!r}) are '
                     f'both set: give one (a token folder holds its own vocabulary, and reads as its text does)')
  if not config.top_ks or any(not isinstance(k, int) or k < 1 for k in config.top_ks):
    raise ValueError(f'config.top_ks must be a non-empty tuple of integers >= 1, got {config.top_ks!r}')
  positive = ['batch_size', 'total_steps', 'learning_rate', 'log_every_steps', 'eval_every_steps',
              'keep_checkpoints', 'seq_len', 'eval_windows', 'bpe_vocab_size']
  for name in positive:
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
      raise ValueError(f'config.{name} must be > 0, got {value!r}')
  for name in ('warmup_steps', 'weight_decay', 'grad_clip_norm'):
    if config[name] < 0:
      raise ValueError(f'config.{name} must be >= 0, got {config[name]!r}')
  if not 0 <= config.stop_at_accuracy <= 1:
    raise ValueError(f'config.stop_at_accuracy must be in [0, 1] (0 disables early stopping), got '
                     f'{config.stop_at_accuracy!r}')
  if config.warmup_steps >= config.total_steps:
    raise ValueError(f'config.warmup_steps ({config.warmup_steps}) must be < config.total_steps '
                     f'({config.total_steps})')
  if not 0 <= config.end_learning_rate_fraction <= 1:
    raise ValueError(f'config.end_learning_rate_fraction must be in [0, 1], got '
                     f'{config.end_learning_rate_fraction!r}')
  for name in ('adam_b1', 'adam_b2'):
    if not 0 <= config[name] < 1:
      raise ValueError(f'config.{name} must be in [0, 1), got {config[name]!r}')
  if config.best_metric not in BEST_METRICS:
    raise ValueError(f'config.best_metric must be one of {list(BEST_METRICS)}, got {config.best_metric!r}')
  if config.numeral_glyph_init and config.task != 'fol':
    raise ValueError(f"config.numeral_glyph_init is only for task 'fol', got task {config.task!r}")
  if config.readout not in ('direct', 'streamed'):
    raise ValueError(f"config.readout must be one of ['direct', 'streamed'], got {config.readout!r}")
  if config.task == 'text' and config.tokenizer not in ('char', 'bpe'):
    raise ValueError(f"config.tokenizer must be one of ['char', 'bpe'], got {config.tokenizer!r}")
  if config.task == 'text' and config.tokenizer == 'bpe' and config.bpe_vocab_size < text.BPE_MIN_VOCAB:
    raise ValueError(f'config.bpe_vocab_size must be >= {text.BPE_MIN_VOCAB} (a byte-level BPE vocabulary '
                     f'starts from the {text.BPE_MIN_VOCAB} bytes), got {config.bpe_vocab_size!r}')
  for name in ('seed', 'data_seed'):
    if isinstance(config[name], bool) or not isinstance(config[name], int) or config[name] < 0:
      raise ValueError(f'config.{name} must be an integer >= 0, got {config[name]!r}')
  axes = (mesh.DATA_AXIS, mesh.VOCAB_AXIS, None)
  for rule in config.sharding_rules:
    if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and rule[0] in mesh.LOGICAL_AXES
            and rule[1] in axes):
      raise ValueError(f'config.sharding_rules must be (logical axis, mesh axis) pairs, the logical axis one of '
                       f'{list(mesh.LOGICAL_AXES)} and the mesh axis one of {list(axes)}, e.g. '
                       f'{mesh.DEFAULT_RULES}; got the rule {rule!r}')
  d = config.distributed
  if isinstance(d.num_processes, bool) or not isinstance(d.num_processes, int) or d.num_processes < 1:
    raise ValueError(f'config.distributed.num_processes must be an integer >= 1, got {d.num_processes!r}')
  if not 0 <= d.process_id < d.num_processes:
    raise ValueError(f'config.distributed.process_id must be in [0, {d.num_processes}) (0 .. num_processes - 1), '
                     f'got {d.process_id!r}')
  if d.cpu_collectives not in CPU_COLLECTIVES:
    raise ValueError(f"config.distributed.cpu_collectives must be one of {list(CPU_COLLECTIVES)} ('' = JAX's "
                     f"default), got {d.cpu_collectives!r}")
  from symjax import distill  # here, not at the top: distill reads work directories through rundir
  distill.validate(config)
  # The model fields, with placeholders for what the task decides.
  model_config(config, vocab_size=2, causal=True)
