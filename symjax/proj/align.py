"""Interpretability-guided alignment ("Towards by-design interpretable transformers via modular
interpretability-guided alignment", §3.2-3.4, eqs. 1-10), for per-position tasks whose true source
positions are known (``induction``, ``reverse``).

A trained backbone is frozen (§3.3: only the module's parameters train). The interpretability module reads
its block outputs E_j ``[batch, time, d_model]`` (the hidden state after layer j: X_t + X_e, or the
standard residual stream) and gives, for every scored query position q, an importance over the positions t
that q may read:

  block level, eq. (1):    X_j[q]     = Shared(Proj(E_j)[q])
  aggregation, eq. (3):    Agg        = Σ_j E_j
  projection, eq. (4):     Proj[q, t] = ⟨E[t] W_k, E[q] W_q⟩ / √d_a        shared by every block and the model level
  conditional, eq. (5):    CI[q]      = SeLU(Proj[q] W_global + C_q · Proj[q] W_context),   W ∈ R^{T×T}
  outputs, eq. (6):        Output_1   = softmax(Dense(Σ_t a_qt · LayerNorm(Agg[t]))),  a_q = softmax_t CI[q]
                           Output_2   = CI[q]                                    (activations)
                           Output_3   = Proj[q, t] · mean_k (W_global + C_q W_context)[t, k]   (weights)
  loss, eqs. (7)-(8):      CE(Output_1, target) + λ_a MSE(Output_2, GT) + λ_w MSE(Output_3, GT)

GT[q, t] = 1 where t is a true source of q's answer, else 0. As in the paper the MSE terms see the
annotations of a fixed random part of the training set only (``annotated_fraction``, 50% there); the CE
term sees every training example. Softmaxes and MSEs run over the positions q may read (not padding;
t ≤ q under causal attention).

Where the paper's sequence classifier does not carry over to per-position answers, and what is done:
- The projection scores token t against the query q's own state (a bilinear form) instead of reading t
  alone: one importance vector per sequence cannot say which source each position reads.
- Output_1 reads the block outputs pooled by the importance a_q: a vocabulary token cannot be classified
  from a vector of T scores, and pooling makes the module's answer depend on where it looks.
- Output_3 weights each row of W_global + C_q W_context by its input Proj[q, t]: the plain aggregate of
  the weights is one vector for every input of a condition, which per-example annotations cannot match.
- The condition C_q (the backbone's predicted class in the paper) is 1 when the backbone predicts a real
  token at q and 0 when it predicts a special one (``<unk>``: the induction letter seen for the first time).

Interpretations (§3.4): ``precision_at_k`` of Output_2 (eq. 10), Output_3 (eq. 9) and of each block level
(eq. 11) against the true sources on held-out data, with k the number of true sources of each query, next
to the backbone's attention averaged over layers and heads.

  python -m symjax.cli.align --backbone=WORKDIR --workdir=OUT [--config=configs/align.py[:args]]
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from symjax import tasks
from symjax.interpret import core
from symjax.interpret.attribution import precision_at_k  # noqa: F401  (used below and re-exported)
from symjax.model import intermediates as names
from symjax.run import workdir as rundir
from symjax.system import files
from symjax.system.errors import InputError
from symjax.tasks import base, induction, rasp
from symjax.train import config as config_lib
from symjax.train import distill

RESULT_FILE = 'alignment.json'
ALIGNABLE = ('induction', 'reverse')


def source_positions(task_name: str, inputs: np.ndarray, vocab: base.Vocab) -> np.ndarray:
  """``[n, time, time]`` bool: [i, q, t] when input position t is a true source of the answer at q."""
  if task_name == 'induction':
    return induction.source_positions(inputs, vocab)
  if task_name == 'reverse':
    return rasp.reverse_source_positions(inputs, vocab)
  raise InputError(f'alignment needs a task whose true source positions are known, one of {list(ALIGNABLE)}; '
                   f'the backbone was trained on {task_name!r}')


class Shared(nn.Module):
  """The shared conditional interpretable layer, eq. (5), and the weight read-out of eq. (6)."""

  seq_len: int

  @nn.compact
  def __call__(self, proj, condition):
    """proj ``[batch, q, t]``, condition ``[batch, q]`` -> (CI, weights), each ``[batch, q, t]``."""
    # W_global starts as the identity and W_context at zero: the layer first passes each position's
    # score through, and learns to mix positions only where that helps.
    w_global = self.param('w_global', lambda _, shape: jnp.eye(*shape), (self.seq_len, self.seq_len))
    w_context = self.param('w_context', nn.initializers.zeros, (self.seq_len, self.seq_len))
    t = proj.shape[-1]
    w_global, w_context = w_global[:t, :t], w_context[:t, :t]
    c = condition[..., None]
    ci = jax.nn.selu(proj @ w_global + c * (proj @ w_context))
    weights = proj * (w_global.mean(-1) + c * w_context.mean(-1))
    return ci, weights


class Module(nn.Module):
  """The interpretability module over N block outputs."""

  seq_len: int
  vocab_size: int
  projection_dim: int = 32

  @nn.compact
  def __call__(self, blocks, readable, condition):
    """blocks ``[batch, N, time, d]``, readable ``[batch, q, t]`` bool, condition ``[batch, q]``.

    Returns {'logits' [batch, q, vocab] (Output_1 before its softmax), 'activations' (Output_2),
    'weights' (Output_3), 'blocks' [batch, N, q, t] (eq. 11)}, importances ``[batch, q, t]``.
    """
    w_q = nn.Dense(self.projection_dim, use_bias=False, name='query')
    w_k = nn.Dense(self.projection_dim, use_bias=False, name='key')
    shared = Shared(self.seq_len, name='shared')

    def project(e):  # eq. (4), shared by the blocks and the model level
      e = e * jax.lax.rsqrt(jnp.mean(e * e, axis=-1, keepdims=True) + 1e-6)  # scale-free: summed streams grow
      return jnp.einsum('...qa,...ta->...qt', w_q(e), w_k(e)) / math.sqrt(self.projection_dim)

    agg = blocks.sum(axis=1)                                      # eq. (3)
    ci, weights = shared(project(agg), condition)                 # eqs. (4)-(5)
    per_block = jax.vmap(lambda e: shared(project(e), condition)[0], in_axes=1, out_axes=1)(blocks)  # eq. (1)
    a = jax.nn.softmax(jnp.where(readable, ci, -1e9), axis=-1)
    pooled = jnp.einsum('bqt,btd->bqd', a, nn.LayerNorm(name='norm')(agg))
    logits = nn.Dense(self.vocab_size, name='classifier')(pooled)
    return {'logits': logits, 'activations': ci, 'weights': weights, 'blocks': per_block}


def defaults() -> ml_collections.ConfigDict:
  """``configs/align.py``'s fields."""
  c = ml_collections.ConfigDict()
  c.checkpoint = 'best'           # the backbone's 'best' or 'latest' checkpoint, or a step number
  c.seed = 0                      # module initialisation, batch order and the annotated part
  c.steps = 2000
  c.batch_size = 64
  c.learning_rate = 3e-3          # Adam, constant (the paper's module trains at 1e-3 for its data)
  c.projection_dim = 32           # d_a of the bilinear projection
  c.annotated_fraction = 0.5      # part of the training set whose annotations the MSE terms see (paper: 50%)
  c.ce_weight = 1.0               # weight of CE(Output_1, target), eq. (8)
  c.activation_weight = 1.0       # λ_a: weight of MSE(Output_2, GT), eq. (7); 0 and 0: no alignment
  c.weights_weight = 1.0          # λ_w: weight of MSE(Output_3, GT), eq. (7)
  c.annotations = ''              # .npy of your own training annotations [train examples, time, time] in {0, 1}
                                  # ([i, q, t]: t is a source of q's answer), in the task's training order;
                                  # '' = the task's true sources. Evaluation always uses the true sources.
  return c


def read_annotations(path: str, shape: tuple[int, ...]) -> np.ndarray:
  """The annotations file of ``config.annotations``, checked: shape ``shape`` and values 0 or 1."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'config.annotations: no file {path!r}; give a .npy array of shape {shape}')
  try:
    a = np.load(path, allow_pickle=False)
  except ValueError as e:
    raise InputError(f'config.annotations {path!r} is not a NumPy .npy array ({e})') from None
  if a.shape != shape:
    raise InputError(f'config.annotations {path!r} has shape {a.shape}; the training split needs {shape} '
                     f'([examples, query position, source position])')
  if not np.isin(a, (0, 1)).all():
    raise InputError(f'config.annotations {path!r} holds values other than 0 and 1')
  return a.astype(bool)


def validate(config: ml_collections.ConfigDict) -> None:
  config_lib.check_finite(config)
  for name in ('steps', 'batch_size', 'learning_rate', 'projection_dim'):
    v = config[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
      raise InputError(f'config.{name} must be > 0, got {v!r}')
  if not 0 < config.annotated_fraction <= 1:
    raise InputError(f'config.annotated_fraction must be in (0, 1], got {config.annotated_fraction!r}')
  for name in ('ce_weight', 'activation_weight', 'weights_weight'):
    if config[name] < 0:
      raise InputError(f'config.{name} must be >= 0, got {config[name]!r}')
  if config.ce_weight == config.activation_weight == config.weights_weight == 0:
    raise InputError('config: ce_weight, activation_weight and weights_weight are all 0; nothing would be learned')


# ----------------------------------------------------------------------------------------------------------
# The frozen backbone's features, computed once per split.
# ----------------------------------------------------------------------------------------------------------
def backbone_features(loaded: rundir.Loaded, inputs: np.ndarray, batch_size: int = 256) -> dict[str, np.ndarray]:
  """Per example: block outputs ``blocks [n, L, time, d]``, ``attention [n, time, time]`` (mean over layers
  and heads) and ``prediction [n, time]`` of the frozen backbone."""
  cfg = loaded.model_config
  model = core.analysis_model(loaded.model)
  pad = loaded.tokenizer.vocab.id(base.PAD)

  @jax.jit
  def features(tokens):
    logits, state = model.apply({'params': loaded.params}, tokens, tokens != pad, mutable=['intermediates'])
    inter = state['intermediates']
    blocks = jnp.stack([s['x'] for s in distill.layer_streams(cfg, inter)], axis=1)
    att = jnp.stack([names.flat(inter)[f'blocks.{l}.attn.pattern'] for l in range(cfg.num_layers)])
    return blocks, att.mean(axis=(0, 2)), logits.argmax(-1)

  out = {'blocks': [], 'attention': [], 'prediction': []}
  for start in range(0, len(inputs), batch_size):
    chunk = inputs[start:start + batch_size]
    fill = batch_size - len(chunk)
    padded = np.concatenate([chunk, np.full((fill, chunk.shape[1]), pad, chunk.dtype)]) if fill else chunk
    for k, v in zip(out, jax.device_get(features(jnp.asarray(padded, jnp.int32)))):
      out[k].append(np.asarray(v[:len(chunk)]))
  return {k: np.concatenate(v) for k, v in out.items()}


def readable_positions(inputs: np.ndarray, pad_id: int, causal: bool) -> np.ndarray:
  """``[n, q, t]``: t is not padding (and t ≤ q under causal attention)."""
  readable = np.broadcast_to((inputs != pad_id)[:, None, :], (*inputs.shape, inputs.shape[1])).copy()
  if causal:
    readable &= np.tril(np.ones((inputs.shape[1],) * 2, bool))
  return readable


# ----------------------------------------------------------------------------------------------------------
# Training and evaluation.
# ----------------------------------------------------------------------------------------------------------
def prepare(loaded: rundir.Loaded, task: base.FixedSetTask, split: str) -> dict[str, np.ndarray]:
  inputs, targets = task.data.inputs[split], task.data.targets[split]
  feats = backbone_features(loaded, inputs)
  special = np.isin(feats['prediction'], [task.vocab.id(s) for s in base.SPECIALS])
  return {'blocks': feats['blocks'].astype(np.float32), 'attention': feats['attention'],
          'readable': readable_positions(inputs, task.pad_id, task.causal),
          'condition': (~special).astype(np.float32), 'targets': targets,
          'scored': (targets != task.pad_id), 'backbone_correct': feats['prediction'] == targets,
          'sources': source_positions(task.name, inputs, task.vocab)}


def loss_fn(module: Module, params, batch, config) -> tuple[jax.Array, dict[str, jax.Array]]:
  out = module.apply({'params': params}, batch['blocks'], batch['readable'], batch['condition'])
  scored = batch['scored'].astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(out['logits'], batch['targets'])
  ce = jnp.sum(ce * scored) / jnp.maximum(scored.sum(), 1.0)
  gt = batch['sources'].astype(jnp.float32)
  cells = batch['readable'] * (scored * batch['annotated'][:, None])[..., None]
  mse = lambda x: jnp.sum(jnp.square(x - gt) * cells) / jnp.maximum(cells.sum(), 1.0)
  loss_a, loss_w = mse(out['activations']), mse(out['weights'])
  total = config.ce_weight * ce + config.activation_weight * loss_a + config.weights_weight * loss_w
  return total, {'ce': ce, 'mse_activations': loss_a, 'mse_weights': loss_w}


def evaluate(module: Module, params, data: dict[str, np.ndarray], batch_size: int = 512) -> dict[str, Any]:
  """Module accuracy, backbone accuracy and the precision@k of every interpretation on ``data``."""
  apply = jax.jit(lambda b, r, c: module.apply({'params': params}, b, r, c))
  outs = {'logits': [], 'activations': [], 'weights': [], 'blocks': []}
  for start in range(0, len(data['targets']), batch_size):
    s = slice(start, start + batch_size)
    o = jax.device_get(apply(data['blocks'][s], data['readable'][s], data['condition'][s]))
    for k in outs:
      outs[k].append(np.asarray(o[k]))
  outs = {k: np.concatenate(v) for k, v in outs.items()}
  scored, sources, readable = data['scored'], data['sources'], data['readable']
  correct = outs['logits'].argmax(-1) == data['targets']
  result = {
      'module_accuracy': float(correct[scored].mean()),
      'backbone_accuracy': float(data['backbone_correct'][scored].mean()),
      'precision_activations': precision_at_k(outs['activations'], sources, readable),
      'precision_weights': precision_at_k(outs['weights'], sources, readable),
      'precision_attention': precision_at_k(data['attention'], sources, readable),
      'precision_blocks': [precision_at_k(outs['blocks'][:, j], sources, readable)
                           for j in range(outs['blocks'].shape[1])],
      'queries_with_sources': int((sources.sum(-1) > 0).sum()),
  }
  return result


def align(backbone: str, workdir: str, config: ml_collections.ConfigDict, verbose: bool = True) -> dict[str, Any]:
  """Trains the module on ``backbone``'s frozen block outputs; writes ``workdir/alignment.json`` with the
  validation and test evaluations (the test split is read once, at the end) and returns it."""
  validate(config)
  path = os.path.join(workdir, RESULT_FILE)
  if os.path.isfile(path):
    done = files.read_json(path)
    if done.get('config') == config.to_dict() and done.get('backbone') == os.path.abspath(backbone):
      return done
    raise InputError(f'{workdir!r} already holds an alignment of another backbone or config; choose a new '
                     f'--workdir (nothing was changed)')
  loaded = rundir.load(backbone, config.checkpoint)
  if loaded.task not in ALIGNABLE:
    raise InputError(f'alignment needs a task whose true source positions are known, one of {list(ALIGNABLE)}; '
                     f'the backbone {backbone!r} was trained on {loaded.task!r}')
  if loaded.model_config.kind == 'lstm':
    raise InputError("the backbone is an LSTM: alignment reads block outputs and attention, which it has not")
  task = tasks.get_task(loaded.config)
  if task.vocab.tokens != loaded.tokenizer.vocab.tokens:
    raise InputError(f'the backbone {backbone!r} has another vocabulary than task {task.name!r} builds today')
  annotations = None
  if config.annotations:  # checked before the backbone's features are computed
    shape = (task.split_size('train'), task.seq_len, task.seq_len)
    annotations = read_annotations(config.annotations, shape)
  data = {split: prepare(loaded, task, split) for split in ('train', 'validation')}
  train = data['train']
  if annotations is not None:
    train['sources'] = annotations
  n = len(train['targets'])
  order = base.rng_for(config.seed, 'align', 'annotated').permutation(n)
  train['annotated'] = np.zeros(n, np.float32)
  train['annotated'][order[:int(round(config.annotated_fraction * n))]] = 1.0

  module = Module(task.seq_len, len(task.vocab), config.projection_dim)
  first = {k: v[:2] for k, v in train.items()}
  params = module.init(jax.random.key(config.seed), first['blocks'], first['readable'], first['condition'])['params']
  tx = optax.adam(config.learning_rate)
  opt_state = tx.init(params)
  keys = ('blocks', 'readable', 'condition', 'targets', 'scored', 'sources', 'annotated')

  @jax.jit
  def step(params, opt_state, batch):
    (_, metrics), grads = jax.value_and_grad(lambda p: loss_fn(module, p, batch, config), has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, metrics

  per_epoch = max(n // config.batch_size, 1)
  for i in range(config.steps):
    epoch, k = divmod(i, per_epoch)
    idx = base.rng_for(config.seed, 'align', epoch).permutation(n)[k * config.batch_size:][:config.batch_size]
    params, opt_state, metrics = step(params, opt_state, {key: train[key][idx] for key in keys})
    if verbose and ((i + 1) % 500 == 0 or i + 1 == config.steps):
      print(f'step {i + 1}/{config.steps}: ' + ' '.join(f'{k} {float(v):.4f}' for k, v in metrics.items()),
            flush=True)
  result = {'backbone': os.path.abspath(backbone), 'backbone_step': loaded.step, 'task': task.name,
            'kind': loaded.model_config.kind, 'config': config.to_dict(),
            'validation': evaluate(module, params, data['validation'])}
  result['test'] = evaluate(module, params, prepare(loaded, task, 'test'))
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'module_params.msgpack'), 'wb') as f:
    f.write(flax.serialization.to_bytes(params))
  files.write_atomically(path, json.dumps(result, indent=1))
  if verbose:
    print(json.dumps({k: result['test'][k] for k in result['test']}, indent=1))
  return result
