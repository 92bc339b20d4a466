"""Two processes against one: the same mesh and config trained as 2 processes × 2 simulated CPU devices
(gloo collectives) and as 1 process × 4 devices, and the largest difference between their parameters.

  python -m benchmarks.analysis.process_layouts [--steps=10,300] [--json=benchmarks/results/process_layouts.json]

Each run is the command a user types; the parameters compared are the final ones (``symjax.load``, latest).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import jax
import numpy as np
from absl import app, flags

import symjax
from benchmarks.lib import results as result_files

_STEPS = flags.DEFINE_list('steps', ['10', '300'], 'Training steps of each comparison.')
_CONFIGS = flags.DEFINE_list('configs', ['symbolic', 'configs/symbolic.py:size=tiny'], 'Recipes compared.')
_JSON = flags.DEFINE_string('json', 'benchmarks/results/process_layouts.json', 'Output ("" prints).')

MESH = ['--config.mesh.data=2', '--config.mesh.vocab=2', '--config.model.vocab_projection=streamed',
        '--config.model.vocab_chunk_size=4', '--config.readout=streamed', '--config.progress_bar=false']


def _env(devices: int) -> dict[str, str]:
  return {**os.environ, 'XLA_FLAGS': f'--xla_force_host_platform_device_count={devices}'}


def _port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def compare(config: str, steps: int, root: str) -> dict:
  args = [sys.executable, '-m', 'symjax.main', f'--config={config}', f'--config.total_steps={steps}',
          '--config.warmup_steps=2', f'--config.eval_every_steps={steps}', *MESH]
  single, multi = os.path.join(root, 'single'), os.path.join(root, 'multi')
  subprocess.run([*args, f'--workdir={single}'], env=_env(4), check=True, capture_output=True)
  port = _port()
  procs = [subprocess.Popen([*args, f'--workdir={multi}', f'--config.distributed.coordinator_address=localhost:{port}',
                             '--config.distributed.num_processes=2', f'--config.distributed.process_id={i}',
                             '--config.distributed.cpu_collectives=gloo'], env=_env(2),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(2)]
  for p in procs:
    _, err = p.communicate()
    if p.returncode:
      raise RuntimeError(err.decode()[-2000:])
  a, b = symjax.load(multi, 'latest'), symjax.load(single, 'latest')
  diffs = [(np.abs(np.float64(x) - np.float64(y)).max(), np.abs(np.float64(y)).max())
           for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params))]
  return {'config': config, 'steps': steps, 'max_abs': float(max(d for d, _ in diffs)),
          'max_relative': float(max(d / max(s, 1e-30) for d, s in diffs)),
          'identical': all(d == 0 for d, _ in diffs), 'command_single': ' '.join(['python', *args[1:]])}


def main(_):
  rows = []
  print('| config | steps | max abs | max relative | identical |\n|---|---:|---:|---:|:---:|')
  for config in _CONFIGS.value:
    for steps in map(int, _STEPS.value):
      with tempfile.TemporaryDirectory() as root:
        row = compare(config, steps, root)
      rows.append(row)
      print(f"| {config} | {steps} | {row['max_abs']:.2e} | {row['max_relative']:.2e} | {row['identical']} |",
            flush=True)
  if _JSON.value:
    result_files.write(_JSON.value, {
        'what': 'final parameters of 2 processes x 2 CPU devices (gloo) against 1 process x 4 devices, same '
                'mesh (data 2 x vocab 2) and config', 'mesh_args': ' '.join(MESH), 'rows': rows})


if __name__ == '__main__':
  app.run(main)
