"""symjax against a PyTorch GPT on this machine's CPU, side by side in one run: the whole training command as
a user types it, for the PyTorch peer (``benchmarks/lib/torch_gpt.py``) and symjax's three kinds at the
text recipe (nanoGPT's CPU recipe for Tiny Shakespeare: 4 layers, 4 heads, width 128, context 64, batch 12,
2000 steps, AdamW).

  pip install -e '.[bench]' --extra-index-url https://download.pytorch.org/whl/cpu
  python -m benchmarks.speed.vs_pytorch --text_path=input.txt [--rounds=3] \
      [--json=benchmarks/results/vs_pytorch_cpu.json]

Each round runs every command once, one after another, the order rotated from round to round; the machine
should be otherwise idle. Per command:
- steady-state tokens/s: the median of its 50-step blocks (the time between two of its ``step N/T`` lines,
  taken by this script as the lines arrive), leaving out the first block (compilation) and every block that
  holds an evaluation and checkpoint; the blocks' spread about that median;
- the wall time of the whole command, and the time from the command to its first finished step;
- its peak resident memory (the child's ``ru_maxrss``);
symjax runs keep their compiled steps in a compilation cache made fresh for this benchmark: the first round
compiles (a cold cache), later rounds read it (a warm one, as a rerun or resume on the user's machine does).
The ratios against PyTorch are taken within each round and their median reported. Tests time nothing; the
README's table and ``docs/results/data/vs_pytorch_cpu.md`` are generated from the JSON
(``python -m benchmarks.results_pages``).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from benchmarks.lib import cli
from benchmarks.lib import results as result_files

_TEXT = flags.DEFINE_string('text_path', '../shared/data/tinyshakespeare.txt', 'The corpus (Tiny Shakespeare).')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Rounds; every command runs once per round.')
_KINDS = cli.kinds(help='symjax model kinds.')
_STEPS = cli.steps(2000, 'Training steps of every command (the recipe: 2000).')
_JSON = cli.json_output('benchmarks/results/vs_pytorch_cpu.json')

PEER = 'pytorch'
BLOCK = 50          # steps between two progress lines of either program
TOKENS = 12 * 64    # per step
STEP_LINE = re.compile(r'^step (\d+)/\d+: loss ([\d.]+), ')
EVAL_LINE = re.compile(r'^step (\d+): validation loss=([\d.]+)')
FIRST_LINE = re.compile(r'^first step done')


def commands(kind: str, workdir: str, cache: str) -> list[str]:
  if kind == PEER:
    return [sys.executable, '-c', 'from benchmarks.lib import torch_gpt; torch_gpt.main()',
            f'--text_path={_TEXT.value}', f'--workdir={workdir}',
            f'--steps={_STEPS.value}']
  return [sys.executable, '-m', 'symjax.main', f'--config={kind}:task=text,size=medium',
          f'--config.text_path={_TEXT.value}', f'--config.total_steps={_STEPS.value}', f'--workdir={workdir}',
          f'--config.compilation_cache_dir={cache}']


def run_once(argv: list[str], extra_env: dict[str, str] | None = None) -> dict:
  """Runs one command to its end, reading its output as it comes (``extra_env``: variables set for it)."""
  env = {**os.environ, **(extra_env or {}), 'PYTHONUNBUFFERED': '1'}
  start = time.perf_counter()
  proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
  steps, evals, first, tail, losses, unix = {}, [], None, [], {}, {}
  for line in proc.stdout:
    now = time.perf_counter() - start
    tail = (tail + [line])[-20:]
    if m := STEP_LINE.match(line):
      steps[int(m.group(1))] = now
      unix[int(m.group(1))] = time.time()
      losses[int(m.group(1))] = float(m.group(2))
    elif m := EVAL_LINE.match(line):
      evals.append((int(m.group(1)), float(m.group(2))))
    elif first is None and FIRST_LINE.match(line):
      first = now
  _, status, usage = os.wait4(proc.pid, 0)
  wall = time.perf_counter() - start
  if status != 0:
    raise RuntimeError(f'{" ".join(argv)} failed:\n{"".join(tail)}')
  evaluated = {s for s, _ in evals}
  marks = sorted(steps)
  blocks = []
  for a, b in zip(marks, marks[1:]):
    # A block that follows an evaluation holds it (both programs evaluate right after a progress line).
    blocks.append({'steps': b - a, 'seconds': steps[b] - steps[a], 'evaluation': a in evaluated,
                   'unix': (unix[a], unix[b])})
  for x in blocks:
    x['steady'] = not x['evaluation'] and x['steps'] == BLOCK
  steady = [x['seconds'] / x['steps'] for x in blocks if x['steady']]
  median = statistics.median(steady)
  deviation = [t / median - 1 for t in steady]
  return {'wall_s': wall, 'seconds_to_first_step': first, 'peak_resident_mib': usage.ru_maxrss / 1024,
          'step_ms': 1e3 * median, 'tokens_per_s': TOKENS / median,
          'block_min_over_median': min(steady) / median, 'block_max_over_median': max(steady) / median,
          'blocks_outside_15pct': sum(abs(d) > 0.15 for d in deviation), 'steady_blocks': len(steady),
          'first_block_s': steps[marks[0]] if marks else None,
          'final_train_loss': losses[max(losses)], 'validation_losses': evals,
          'block_ms_per_step': [round(1e3 * x['seconds'] / x['steps'], 2) for x in blocks],
          'block_steady': [x['steady'] for x in blocks], 'block_spans_unix': [x['unix'] for x in blocks]}


def versions() -> dict[str, str]:
  out = {}
  for name in ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'numpy', 'torch'):
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = 'not installed'
  return out


def main(_):
  try:
    import torch  # noqa: F401  (only to fail early with the install line)
  except ImportError:
    sys.exit("PyTorch is not installed: pip install -e '.[bench]' --extra-index-url https://download.pytorch.org/whl/cpu")
  if not os.path.isfile(_TEXT.value):
    sys.exit(f'--text_path {_TEXT.value!r} is not a file')
  names = [PEER, *_KINDS.value]
  rounds = []
  with tempfile.TemporaryDirectory(prefix='vs_pytorch_') as tmp:
    cache = os.path.join(tmp, 'compilation_cache')
    for r in range(_ROUNDS.value):
      order = names[r % len(names):] + names[:r % len(names)]
      row = {}
      for name in order:
        workdir = os.path.join(tmp, f'{name}_{r}')
        row[name] = run_once(commands(name, workdir, cache))
        row[name].pop('block_spans_unix')
        print(f"round {r + 1} {name}: {row[name]['step_ms']:.1f} ms/step, {row[name]['wall_s']:.1f} s wall, "
              f"first step {row[name]['seconds_to_first_step']:.1f} s, "
              f"{row[name]['peak_resident_mib']:.0f} MiB", flush=True)
      rounds.append({'order': order, 'runs': row})

  def median_of(name, key, warm_only=False):
    values = [rd['runs'][name][key] for i, rd in enumerate(rounds) if not (warm_only and i == 0)]
    return statistics.median(values) if values else None

  def ratio(name, key):
    per_round = [rd['runs'][name][key] / rd['runs'][PEER][key] for rd in rounds]
    return {'median': statistics.median(per_round), 'per_round': per_round}

  summary = {}
  for name in names:
    summary[name] = {'tokens_per_s': median_of(name, 'tokens_per_s'), 'step_ms': median_of(name, 'step_ms'),
                     'wall_s': median_of(name, 'wall_s'), 'peak_resident_mib': median_of(name, 'peak_resident_mib'),
                     'seconds_to_first_step_cold': rounds[0]['runs'][name]['seconds_to_first_step'],
                     'seconds_to_first_step_warm': median_of(name, 'seconds_to_first_step', warm_only=True),
                     'worst_block_deviation': max(max(abs(rd['runs'][name]['block_min_over_median'] - 1),
                                                      abs(rd['runs'][name]['block_max_over_median'] - 1))
                                                  for rd in rounds)}
    if name != PEER:
      summary[name]['vs_pytorch'] = {'tokens_per_s': ratio(name, 'tokens_per_s'),
                                     'wall_time': ratio(name, 'wall_s'),
                                     'peak_resident_memory': ratio(name, 'peak_resident_mib')}

  print(f'\n{result_files.cpu_model()}, {os.cpu_count()} cores; median of {_ROUNDS.value} rounds; '
        'ratios within a round')
  print('| program | step | tokens/s | × PyTorch | wall | × PyTorch | first step (cold / warm) | blocks within | '
        'peak resident | × PyTorch |')
  print('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
  for name in names:
    s = summary[name]
    vs = s.get('vs_pytorch')
    cell = lambda key: (f"{vs[key]['median']:.2f}×" if vs[key] else '–') if vs else '1'
    warm = s['seconds_to_first_step_warm']
    print(f"| {name} | {s['step_ms']:.1f} ms | {s['tokens_per_s']:,.0f} | {cell('tokens_per_s')} | "
          f"{s['wall_s']:.1f} s | {cell('wall_time')} | {s['seconds_to_first_step_cold']:.1f} / "
          f"{'–' if warm is None else f'{warm:.1f}'} s | ±{100 * s['worst_block_deviation']:.0f}% | "
          f"{s['peak_resident_mib']:.0f} MiB | {cell('peak_resident_memory')} |")
  result_files.write(_JSON.value, {'versions': versions(), 'rounds_run': _ROUNDS.value, 'steps': _STEPS.value,
                                   'summary': summary, 'rounds': rounds})


if __name__ == '__main__':
  app.run(main)
