"""The device mesh and everything placed on it: axis names (mesh and logical), joining a multi-process run,
the ('data', 'vocab') mesh, the state's shardings from the logical-axis rules, and batch placement."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import jax
import ml_collections
from jax.sharding import NamedSharding, PartitionSpec

from symjax.system.errors import InputError

# Mesh axes: the batch is split along DATA_AXIS; the vocabulary (embedding rows, projection tables) along
# VOCAB_AXIS.
DATA_AXIS = 'data'
VOCAB_AXIS = 'vocab'

# Logical axis names the model's parameters carry, and the default rules mapping them to mesh axes: the
# vocabulary rows are split over VOCAB_AXIS; every other name is replicated unless a config's
# sharding_rules map it (e.g. (('mlp', 'data'),) to split the FFN's hidden units).
VOCAB, EMBED = 'vocab', 'embed'          # embedding / readout tables, the model width
HEADS, HEAD_DIM, MLP = 'heads', 'head_dim', 'mlp'   # attention heads, their width, FFN hidden units
LOGICAL_AXES = (VOCAB, EMBED, HEADS, HEAD_DIM, MLP)
DEFAULT_RULES = ((VOCAB, VOCAB_AXIS), (EMBED, None))


def maybe_initialize_distributed(d: ml_collections.ConfigDict) -> None:
  """Joins a multi-process run: from ``d`` (``config.distributed``) when its address is set; by JAX's cluster
  auto-detection (Cloud TPU, SLURM, JAX_COORDINATOR_ADDRESS) when only ``num_processes > 1`` or that
  variable is set; otherwise a single-process run."""
  if jax.distributed.is_initialized():
    return
  if d.cpu_collectives:
    jax.config.update('jax_cpu_collectives_implementation', d.cpu_collectives)
  timeout = d.get('heartbeat_timeout_seconds', 100)
  if d.coordinator_address:
    jax.distributed.initialize(d.coordinator_address, d.num_processes, d.process_id,
                               heartbeat_timeout_seconds=timeout)
  elif d.num_processes > 1 or os.environ.get('JAX_COORDINATOR_ADDRESS'):
    try:
      jax.distributed.initialize(heartbeat_timeout_seconds=timeout)
    except ValueError as e:  # JAX found no cluster to join (no SLURM, Cloud TPU or JAX_COORDINATOR_ADDRESS)
      raise InputError(f'config.distributed.num_processes = {d.num_processes} but no coordinator was given or '
                       f'detected: set config.distributed.coordinator_address (host:port of process 0) and '
                       f'config.distributed.process_id, or run where JAX detects the cluster (SLURM, Cloud '
                       f'TPU, JAX_COORDINATOR_ADDRESS); JAX: {e}') from None


# What a collective reports when a process it waits on is gone (gloo's TCP pairs, the coordination service).
_LOST_PEER = re.compile(r'Gloo|Connection (reset|closed|refused)|heartbeat|UNAVAILABLE|DEADLINE_EXCEEDED')
PEER_WAIT_SECONDS = 5  # how long a survivor waits for the others to say they are alive


def peer_failure(e: BaseException) -> bool:
  """Whether ``e``, raised in a multi-process run, is a collective that lost one of its processes."""
  return jax.process_count() > 1 and bool(_LOST_PEER.search(str(e)))


def lost_processes(wait_seconds: float = PEER_WAIT_SECONDS) -> list[int] | None:
  """After a collective failed: the processes that did not say they are alive within ``wait_seconds``,
  through JAX's coordination service (each survivor writes a key; every survivor's collective failed at
  once, so each writes it at once). None when the service itself is gone (process 0 hosts it)."""
  from jax._src import distributed  # JAX's handle on its coordination service; no public accessor
  client, me, n = distributed.global_state.client, jax.process_index(), jax.process_count()
  key = lambda i: f'symjax/alive_after_failure/{i}'
  try:
    client.key_value_set(key(me), '1')
    alive, deadline = {me}, time.monotonic() + wait_seconds
    while len(alive) < n and time.monotonic() < deadline:
      alive |= {i for i in range(n) if i not in alive and _has_key(client, key(i))}
      time.sleep(0.1)
  except Exception:  # pylint: disable=broad-except  # the service is unreachable
    return None
  return sorted(set(range(n)) - alive)


def _has_key(client, key: str) -> bool:
  try:
    client.key_value_try_get(key)
    return True
  except Exception as e:  # pylint: disable=broad-except
    if 'NOT_FOUND' in str(e):
      return False
    raise


def make_mesh(data: int, vocab: int, batch_size: int) -> jax.sharding.Mesh:
  """A ('data', 'vocab') mesh over every device (``config.mesh.data``, ``config.mesh.vocab``); ``data = -1``
  takes what 'vocab' leaves. ``batch_size`` must split evenly along 'data'."""
  n = jax.device_count()
  if vocab < 1 or n % vocab:
    raise InputError(f'config.mesh.vocab = {vocab} must be >= 1 and divide the {n} devices')
  data = n // vocab if data == -1 else data
  if data * vocab != n:
    raise InputError(f'config.mesh.data × config.mesh.vocab = {data} × {vocab} must equal the {n} devices '
                     f'(set config.mesh.data = -1 to use all that config.mesh.vocab leaves)')
  if batch_size % data:
    raise InputError(f'config.batch_size = {batch_size} must be a multiple of the data axis ({data})')
  # Auto axes: the compiler propagates shardings; only the vocabulary softmaxes are written per shard.
  return jax.make_mesh((data, vocab), (DATA_AXIS, VOCAB_AXIS),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)


def state_shardings(abstract_boxed, mesh, rules) -> Any:
  """NamedShardings of the state from the model's logical axis names and the config's rules."""
  import flax.linen as nn  # here: the training command makes its mesh before Flax is imported (symjax.train.early)
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract_boxed), mesh, rules)


def batch_sharding(mesh) -> NamedSharding:
  """Where every batch lives: split along 'data' (the steps' in_shardings and ``batch_putter``'s arrays)."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def batch_putter(mesh):
  """Places a host batch (the same global batch on every process) on the mesh, split along 'data'."""
  sharding = batch_sharding(mesh)

  def put(batch):
    return {k: jax.make_array_from_callback(v.shape, sharding, lambda idx, v=v: v[idx])
            for k, v in batch.items()}
  return put
