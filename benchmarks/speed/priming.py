"""The first calls of a kept training step read back from the compilation cache, with and without priming it on
zeros first (``symjax.train.exported.prime``), each in a fresh process.

  python -m benchmarks.speed.priming [--kinds=standard,token_factored,symbolic] [--runs=5] \
      [--json=benchmarks/results/priming_cpu.json]

Per kind, one process exports the text recipe's step (``benchmarks/lib/recipe.py``'s model, optimiser and
shapes) into a compilation cache made for the benchmark, and a first run of the timed program fills the cache.
Then, ``--runs`` times and alternating, a fresh process with the trainer's host settings for that kind reads the
kept step, compiles it (from the cache) and, primed or not, times its first three calls on a state and batch of
random values, as the trainer's first steps are. It prints the median of each call and of the priming, and writes
every run's seconds to ``--json``. Tests time nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from benchmarks.lib import results as result_files

_KINDS = flags.DEFINE_list('kinds', ['standard', 'token_factored', 'symbolic'], 'symjax model kinds.')
_RUNS = flags.DEFINE_integer('runs', 5, 'Timed processes per kind and setting.')
_JSON = flags.DEFINE_string('json', 'benchmarks/results/priming_cpu.json', 'Where to write the results.')
_CHILD = flags.DEFINE_string('child', None, 'Internal: KIND,MODE,CACHE of one process (export|primed|cold).')
CALLS = 3


def child(kind: str, mode: str, cache: str) -> dict:
  """One process: exports the step (``mode`` 'export'), or reads, compiles, maybe primes and calls it."""
  from symjax.system import host
  host.set_defaults(kind)  # the trainer's settings for this kind: YNNPACK's fusions on or off
  import jax
  import numpy as np

  from benchmarks.lib import recipe
  from symjax import model as model_lib
  from symjax.system import mesh as mesh_lib
  from symjax.train import config as config_lib
  from symjax.train import exported, optim
  from symjax.train import trainer as train
  jax.config.update('jax_compilation_cache_dir', cache)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
  path = os.path.join(cache, exported.FOLDER, kind + exported.SUFFIX)
  mesh = mesh_lib.make_mesh(1, 1, 12)
  with jax.set_mesh(mesh):
    if mode == 'export':
      config = config_lib.from_file(f'{kind}:task=text,size=medium')
      cfg = config_lib.model_config(config, 65, causal=True)
      run = train.compile_run(model_lib.build(cfg), optim.make_optimizer(config), recipe.text_options(config),
                              jax.random.key(0), mesh, (), config.seq_len)
      sharding = mesh_lib.batch_sharding(mesh)
      batch = {k: jax.ShapeDtypeStruct((config.batch_size, config.seq_len), dtype, sharding=sharding)
               for k, dtype in (('inputs', np.int32), ('targets', np.int32), ('weights', np.float32),
                                ('key_mask', np.bool_))}
      exported.write(path, exported.export(run.train_step, run.abstract_state, batch))
      return {}
    data = exported.read(path)
    step, args = exported.flat_step(data, mesh, mesh_lib.batch_sharding(mesh))
    start = time.perf_counter()
    exported.lower(step, data, *args).compile()
    out = {'compile_s': time.perf_counter() - start}
    if mode == 'primed':
      start = time.perf_counter()
      assert exported.prime(step, args)
      out['prime_s'] = time.perf_counter() - start
    rng = np.random.default_rng(0)

    def value(a):
      if a.dtype == np.bool_:
        x = np.ones(a.shape, bool)
      elif np.issubdtype(a.dtype, np.integer):
        x = rng.integers(0, 65, a.shape).astype(a.dtype)
      else:
        x = (0.02 * rng.standard_normal(a.shape)).astype(a.dtype)
      return jax.device_put(x, a.sharding)

    leaves, batch = jax.tree.map(value, args)
    out['calls_s'] = []
    for _ in range(CALLS):
      start = time.perf_counter()
      leaves, metrics = step(leaves, batch)
      jax.block_until_ready((leaves, metrics))
      out['calls_s'].append(time.perf_counter() - start)
  return out


def spawn(kind: str, mode: str, cache: str) -> dict:
  proc = subprocess.run([sys.executable, '-m', 'benchmarks.speed.priming', f'--child={kind},{mode},{cache}'],
                        capture_output=True, text=True, check=True)
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(_):
  if _CHILD.value:
    kind, mode, cache = _CHILD.value.split(',', 2)
    print(json.dumps(child(kind, mode, cache)))
    return
  runs: dict[str, dict[str, list]] = {}
  with tempfile.TemporaryDirectory() as cache:
    for kind in _KINDS.value:
      spawn(kind, 'export', cache)
      spawn(kind, 'cold', cache)  # compiles the program into the cache: every timed run reads it back
      runs[kind] = {'primed': [], 'not_primed': []}
      for i in range(_RUNS.value):
        for mode in (('primed', 'cold') if i % 2 == 0 else ('cold', 'primed')):
          runs[kind]['primed' if mode == 'primed' else 'not_primed'].append(spawn(kind, mode, cache))
  summary = {}
  print('| kind | setting | priming | call 1 | call 2 | call 3 |')
  print('|---|---|---:|---:|---:|---:|')
  for kind, settings in runs.items():
    summary[kind] = {}
    for setting, rows in settings.items():
      calls = [statistics.median(r['calls_s'][i] for r in rows) for i in range(CALLS)]
      prime = statistics.median(r['prime_s'] for r in rows) if setting == 'primed' else None
      summary[kind][setting] = {'prime_s': prime, 'calls_s': calls}
      print(f'| {kind} | {setting} | {"" if prime is None else f"{prime:.3f} s"} | '
            + ' | '.join(f'{c:.3f} s' for c in calls) + ' |')
  result_files.write(_JSON.value, {'command': 'python -m benchmarks.speed.priming ' + ' '.join(sys.argv[1:]),
                                   'runs_per_setting': _RUNS.value, 'summary': summary, 'runs': runs})


if __name__ == '__main__':
  app.run(main)
