"""Sharded training on simulated CPU devices, and a two-process run over localhost (CPU collectives)."""

import json
import os
import re
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import KILLED_AT_STEP_25

import symjax
from symjax.run import workdir as rundir

pytestmark = pytest.mark.slow  # end to end: every test here trains or runs a command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-5


def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def env_with_devices(n):
  env = dict(os.environ)
  env['XLA_FLAGS'] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}".strip()
  env['JAX_PLATFORMS'] = 'cpu'
  return env


@pytest.fixture(scope='module')
def sharded_results(tmp_path_factory):
  corpus = tmp_path_factory.mktemp('corpus') / 'text.txt'
  rng = np.random.default_rng(0)
  alphabet = list('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN .,')  # 43 symbols: the table pads to 48
  corpus.write_text(''.join(rng.choice(alphabet, 5000)))
  proc = subprocess.run([sys.executable, os.path.join(REPO, 'tests', 'sharded_step.py'), str(corpus)],
                        env=env_with_devices(8), capture_output=True, text=True, cwd=REPO)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize('mesh', ['2x4', '1x8'])
def test_sharded_step_equals_single_device_step(sharded_results, mesh):
  ref, got = sharded_results['1x1'], sharded_results[mesh]
  assert rel_err(got['loss'], ref['loss']) <= TOL
  for name in ref['grads']:
    assert rel_err(got['grads'][name], ref['grads'][name]) <= TOL, name
  for name in ref['params']:  # after three AdamW steps
    assert rel_err(got['params'][name], ref['params'][name]) <= TOL, name
  assert not np.allclose(ref['params']['embed/embedding'], 0)


@pytest.mark.parametrize('mesh, share', [('1x1', 1.0), ('2x4', 1 / 4), ('1x8', 1 / 8)])
def test_each_device_holds_one_vocab_shard_of_the_table(sharded_results, mesh, share):
  assert sharded_results[mesh]['table_share'] == share
  assert sharded_results[mesh]['table_rows'] == 48 and sharded_results[mesh]['vocab_size'] == 43


def _free_port():
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


# The default recipe (a 2 × 2 mesh, the streamed projection sharded over the vocab axis): where, unlike the tiny
# config, the collectives' sums round differently in two processes than in one.
TRAIN_ARGS = ['--config=symbolic', '--config.total_steps=10', '--config.warmup_steps=2',
              '--config.eval_every_steps=5', '--config.log_every_steps=5',
              '--config.mesh.data=2', '--config.mesh.vocab=2', '--config.model.vocab_projection=streamed',
              '--config.model.vocab_chunk_size=4', '--config.readout=streamed']


def test_two_processes_train_like_one(tmp_path):
  """Two processes with 2 CPU devices each form one data=2 × vocab=2 mesh; the result equals one process
  driving 4 devices with the same mesh to float32 rounding: XLA's in-process collectives and gloo sum the
  gradients' shards in different orders, so parameters agree within 1e-5 relative after 10 steps (the
  promise docs/scaling.md makes; measured 4.7e-7) and every logged loss within 1e-5."""
  single = str(tmp_path / 'single')
  proc = subprocess.run([sys.executable, '-m', 'symjax.main', *TRAIN_ARGS, f'--workdir={single}'],
                        env=env_with_devices(4), capture_output=True, text=True, cwd=REPO, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]

  multi = str(tmp_path / 'multi')
  port = _free_port()
  procs = [subprocess.Popen(
      [sys.executable, '-m', 'symjax.main', *TRAIN_ARGS, f'--workdir={multi}',
       f'--config.distributed.coordinator_address=localhost:{port}', '--config.distributed.num_processes=2',
       f'--config.distributed.process_id={i}', '--config.distributed.cpu_collectives=gloo'],
      env=env_with_devices(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
      for i in range(2)]
  outputs = [p.communicate(timeout=600) for p in procs]
  for p, (out, err) in zip(procs, outputs):
    assert p.returncode == 0, err[-3000:]
  assert "mesh {'data': 2, 'vocab': 2}" in outputs[0][0]
  assert 'final metrics' in outputs[0][0] and 'final metrics' not in outputs[1][0]  # process 0 logs

  a, b = symjax.load(multi, 'latest'), symjax.load(single, 'latest')
  assert a.step == b.step == 10
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a.params)[0], jax.tree.leaves(b.params)):
    assert rel_err(x, y) <= TOL, jax.tree_util.keystr(path)
  single_metrics = [json.loads(l) for l in open(os.path.join(single, 'metrics.jsonl'))]
  multi_metrics = [json.loads(l) for l in open(os.path.join(multi, 'metrics.jsonl'))]
  assert len(single_metrics) == len(multi_metrics)
  for x, y in zip(single_metrics, multi_metrics):
    assert x['step'] == y['step'] and abs(x['loss'] - y['loss']) <= 1e-5 * max(abs(x['loss']), 1)


@pytest.mark.parametrize('kind', ['standard', 'token_factored', 'symbolic'])
def test_every_kernel_carries_logical_axis_names_that_rules_alone_shard(kind):
  import flax.linen as nn

  from symjax import model as model_lib
  from symjax.system import mesh
  config = model_lib.ModelConfig.of(vocab_size=12, num_layers=1, num_heads=2, head_dim=4, ff_dim=8, kind=kind)
  boxed = jax.eval_shape(lambda k: model_lib.build(config).init(k, jax.numpy.zeros((1, 5), jax.numpy.int32)),
                         jax.random.key(0))['params']
  is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)
  specs = {jax.tree_util.keystr(p): tuple(s) for p, s in
           jax.tree_util.tree_flatten_with_path(nn.get_partition_spec(boxed), is_leaf=is_spec)[0]}
  weights = [k for k in specs if any(w in k for w in ("'kernel'", "'w1'", "'w2'", "'embedding'", "'readout'"))]
  assert weights and all(specs[k] and None not in specs[k] for k in weights), specs
  rules = ((mesh.MLP, 'data'), (mesh.HEADS, 'vocab'), (mesh.VOCAB, 'vocab'))
  mapped = {k: tuple(nn.logical_to_mesh_axes(specs[k], rules)) for k in weights}
  ffn = [k for k in weights if "['ffn']" in k]
  assert ffn and all('data' in mapped[k] for k in ffn), mapped
  attention = [k for k in weights if "['attention']" in k]
  assert attention and all('vocab' in mapped[k] for k in attention), mapped


PEER_ARGS = ['--config=symbolic:size=tiny', '--config.total_steps=40', '--config.warmup_steps=2',
             '--config.eval_every_steps=10', '--config.log_every_steps=5', '--config.progress_bar=false',
             '--config.distributed.num_processes=2', '--config.distributed.cpu_collectives=gloo',
             '--config.distributed.heartbeat_timeout_seconds=20']
# Process 1 kills itself when it is handed the batch of step 25: after the checkpoint of step 20, before 30.
KILLED_AT_25 = KILLED_AT_STEP_25 + """
import sys
sys.argv = ['symjax.main'] + sys.argv[1:]
from symjax.cli import train
train.run()
"""


def two_processes(workdir, first=None):
  """Starts both processes of a two-process run; process 1 runs ``first`` (a driver script) if given."""
  port = _free_port()
  args = [*PEER_ARGS, f'--workdir={workdir}', f'--config.distributed.coordinator_address=localhost:{port}']
  return [subprocess.Popen([sys.executable, *(['-c', first] if first and i == 1 else ['-m', 'symjax.main']), *args,
                            f'--config.distributed.process_id={i}'],
                           env=env_with_devices(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=REPO) for i in range(2)]


def test_a_lost_process_stops_the_other_with_one_line_and_both_resume_exactly(tmp_path):
  """Process 1 is killed at step 25. Process 0 stops within the heartbeat time-out it was given, with one
  line naming process 1 and the last checkpoint, and no traceback; both rerun with the same command resume
  from that checkpoint and end with the parameters of an uninterrupted two-process run."""
  whole = str(tmp_path / 'whole')
  for p in two_processes(whole):
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]

  workdir = str(tmp_path / 'killed')
  survivor, killed = two_processes(workdir, first=KILLED_AT_25)
  killed.communicate(timeout=600)
  assert killed.returncode == -9
  out, err = survivor.communicate(timeout=20)  # the configured heartbeat_timeout_seconds bounds the stop
  assert survivor.returncode == 1, err[-3000:]
  assert err.count('\n') == 1 and 'Traceback' not in err, err[-3000:]
  assert re.match(r'error: lost process 1 of the 2 by step \d+ \(Gloo ', err), err
  # The save of step 20 commits once every process has written its part: if process 1 died first, the last
  # checkpoint is step 10's, and the message names it.
  last = rundir.checkpoint_steps(workdir)[-1]
  assert last in (10, 20) and symjax.load(workdir, 'latest').step == last
  assert err.rstrip().endswith(f'its last checkpoint (step {last}) is intact: rerun every process with the same '
                               f'command to resume'), err

  resumed = two_processes(workdir)
  outputs = [p.communicate(timeout=600) for p in resumed]
  for p, (_, err) in zip(resumed, outputs):
    assert p.returncode == 0, err[-3000:]
  assert f'resuming from step {last}' in outputs[0][0]
  a, b = symjax.load(workdir, 'latest'), symjax.load(whole, 'latest')
  assert a.step == b.step == 40
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a.params)[0], jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))
