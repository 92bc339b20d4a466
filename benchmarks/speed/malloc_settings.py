"""Page faults, system time, step time and resident memory of the training step under glibc malloc settings.

  python -m benchmarks.speed.malloc_settings [--steps=500] [--kinds=...] [--settings=...] [--json=...]

Each kind at the text recipe (benchmarks/lib/recipe.py: batch 12 × 64, |V| = 65, float32, random tokens)
runs --steps compiled training steps in a fresh process per (setting, kind), since malloc's settings are
process-wide. Per step, from getrusage over the timed steps: wall time, minor page faults, system and user
CPU time; the resident size every --every steps, the peak, and the loss after the last step (every setting
must give the same loss: only where buffers live changes). Settings: glibc's defaults, all three of
symjax.host's mallopt calls (what the trainer applies), each left out in turn, and each alone.
"""

import ctypes
import json
import os
import resource
import subprocess
import sys
import time

import jax
from absl import app, flags

from benchmarks.lib import results as result_files
from benchmarks.lib.recipe import compile_recipe_step
from symjax.system import host

_KINDS = flags.DEFINE_list('kinds', ['standard', 'token_factored', 'symbolic'], 'Model kinds.')
_STEPS = flags.DEFINE_integer('steps', 500, 'Timed steps per (setting, kind), after 20 warm-up steps.')
_SETTINGS = flags.DEFINE_list('settings', [], 'Which settings (names as printed); all by default.')
_EVERY = flags.DEFINE_integer('every', 100, 'Record the resident size every this many steps.')
_JSON = flags.DEFINE_string('json', 'benchmarks/results/malloc_settings.json', 'Where to write the results.')
_CHILD = flags.DEFINE_string('child', '', 'Internal: "setting,kind" to measure in this process.')

_NAMES = {host.M_TRIM_THRESHOLD: 'trim', host.M_MMAP_THRESHOLD: 'mmap', host.M_TOP_PAD: 'top_pad'}
SETTINGS = {'glibc defaults': (), 'symjax.system.host (all three)': host.SETTINGS,
            **{f'without {_NAMES[p]}': tuple(s for s in host.SETTINGS if s[0] != p) for p in _NAMES},
            **{f'{_NAMES[p]} only': tuple(s for s in host.SETTINGS if s[0] == p) for p in _NAMES}}


def resident_mib() -> float:
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20


def measure(setting: str, kind: str) -> dict:
  libc = ctypes.CDLL(None)
  if not all([libc.mallopt(param, value) for param, value in SETTINGS[setting]]):
    raise RuntimeError(f'mallopt refused a setting of {setting!r}')
  recipe = compile_recipe_step(kind)
  step, state, data = recipe.step, recipe.state, recipe.data
  for _ in range(20):
    state, metrics = step(state, data)
  jax.block_until_ready(metrics)
  resident = []
  before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
  for i in range(_STEPS.value):
    state, metrics = step(state, data)
    if (i + 1) % _EVERY.value == 0:
      jax.block_until_ready(metrics)
      resident.append(round(resident_mib()))
  jax.block_until_ready(metrics)
  wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
  n = _STEPS.value
  return {'setting': setting, 'kind': kind, 'mallopt': [list(s) for s in SETTINGS[setting]],
          'step_ms': 1e3 * wall / n, 'minor_faults_per_step': (after.ru_minflt - before.ru_minflt) / n,
          'system_ms_per_step': 1e3 * (after.ru_stime - before.ru_stime) / n,
          'user_ms_per_step': 1e3 * (after.ru_utime - before.ru_utime) / n,
          'resident_mib_every': resident, 'peak_resident_mib': after.ru_maxrss / 1024,
          'loss_after': float(metrics['loss'])}


def main(_):
  host.set_cpu_compiler_defaults()  # the allocator is what each child sets, row by row
  if _CHILD.value:
    setting, kind = _CHILD.value.rsplit(',', 1)
    print(json.dumps(measure(setting, kind)))
    return
  env = {k: v for k, v in os.environ.items() if k not in host.MALLOC_ENVS}
  rows = []
  for kind in _KINDS.value:
    for setting in _SETTINGS.value or SETTINGS:
      if setting not in SETTINGS:
        raise app.UsageError(f'unknown setting {setting!r}; the settings are {list(SETTINGS)}')
      out = subprocess.run([sys.executable, __file__, f'--child={setting},{kind}', f'--steps={_STEPS.value}',
                            f'--every={_EVERY.value}'], env=env, capture_output=True, text=True, check=True)
      rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
      r = rows[-1]
      print(f"{kind:15s} {setting:24s} step {r['step_ms']:6.1f} ms  faults {r['minor_faults_per_step']:8.0f}  "
            f"system {r['system_ms_per_step']:5.1f} ms  resident {r['resident_mib_every'][-1]} MiB "
            f"(peak {r['peak_resident_mib']:.0f})  loss {r['loss_after']:.6f}", flush=True)
  print(f'\n{_STEPS.value} steps per row, text recipe, this CPU ({jax.devices()[0].device_kind})')
  print('| kind | setting | step | minor faults / step | system time / step | resident at the end | peak | loss after |')  # noqa: E501
  print('|---|---|---:|---:|---:|---:|---:|---:|')
  for r in rows:
    print(f"| {r['kind']} | {r['setting']} | {r['step_ms']:.1f} ms | {r['minor_faults_per_step']:,.0f} | "
          f"{r['system_ms_per_step']:.1f} ms | {r['resident_mib_every'][-1]:,} MiB | {r['peak_resident_mib']:,.0f} MiB | "  # noqa: E501
          f"{r['loss_after']:.6f} |")
  result_files.write(_JSON.value, {'device': jax.devices()[0].device_kind, 'jax': jax.__version__, 'rows': rows,
               'command': 'python -m benchmarks.speed.malloc_settings ' + ' '.join(sys.argv[1:])})
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
