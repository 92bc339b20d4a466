"""What each part of the standard model's training step costs on all of this machine's cores, in symjax and in
the PyTorch peer, measured by taking the part out of the step.

  python -m benchmarks.speed.part_costs [--one_core] [--rounds=2] [--blocks=11] [--steps=30] [--json=F]
  (PyTorch from the `bench` extra)

Each program builds its step at the text recipe (symjax: benchmarks/lib/recipe.py's compiled standard step, with
the trainer's host settings; PyTorch: benchmarks/speed/torch_gpt.py's model, clipped fused AdamW, as
benchmarks/speed/step_attribution.py times it) once as it is and once per knockout, all in one process per
program, then times them in interleaved blocks of --steps steps, so that every knockout's block runs beside a
block of the whole step; the two programs' processes alternate for --rounds rounds. A part's cost is the median,
over the blocks run with the cores near (benchmarks/speed/core_latency.py), of the whole step's block minus the
knockout's block beside it. Knockouts:

- attention core: the attention weights and their product with the values (scores, ALiBi bias, mask, softmax,
  weighted sum) are gone; the layer outputs its values plus 0 × (queries + keys), so the query, key, value and
  output projections still run, forward and backward;
- FFN: each block's FFN returns its input (its two products, GELU and biases gone);
- LayerNorms: every LayerNorm returns its input;
- AdamW and metrics: plain SGD without clipping in place of clipped AdamW, and in symjax no training-dynamics
  metrics.

The knocked-out steps train other models (their losses are not the model's); only their time is read. Taking a
part out can also change how the rest runs (what overlaps on the two cores), so the costs need not add up to
the step. With --one_core both programs run pinned to one CPU (XLA:CPU and PyTorch on one thread), so that two
runs say which parts gain from the second core. Timings, not trained models: one run, no seeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from benchmarks.lib.knockouts import KNOCKOUTS, WHOLE, costs, symjax_knockout, torch_model

_JSON = flags.DEFINE_string('json', 'benchmarks/results/part_costs.json', 'Where to write the results.')
_ROUNDS = flags.DEFINE_integer('rounds', 2, 'Rounds: one process per program each, the programs alternating.',
                               lower_bound=1)
_BLOCKS = flags.DEFINE_integer('blocks', 11, 'Timed blocks per variant and round (interleaved).', lower_bound=1)
_STEPS = flags.DEFINE_integer('steps', 30, 'Steps per block.', lower_bound=1)
_ONE_CORE = flags.DEFINE_bool('one_core', False, 'Run both programs pinned to one CPU.')
_WORKER = flags.DEFINE_enum('worker', '', ['', 'symjax', 'pytorch'], 'Internal: time one program.')


def symjax_steps() -> dict:
  """{variant: a function running one step and waiting for it}, the whole step and each knockout."""
  from symjax.system import host
  host.set_cpu_compiler_defaults('standard')
  import jax

  from benchmarks.lib.recipe import compile_recipe_step
  steps = {}
  for part in (None, *KNOCKOUTS):
    with symjax_knockout(part):
      recipe = compile_recipe_step('standard')
    box = [recipe.state]

    def step(recipe=recipe, box=box):
      box[0], metrics = recipe.step(box[0], recipe.data)
      jax.block_until_ready(metrics)
    steps[part or WHOLE] = step
  return steps


def pytorch_steps() -> dict:
  import torch
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  tokens = torch.randint(0, 65, (12, 65), generator=torch.Generator().manual_seed(1))
  steps = {}
  for part in (None, *KNOCKOUTS):
    model, update = torch_model(part)

    def step(model=model, update=update):
      loss = model(tokens[:, :-1], tokens[:, 1:])
      model.zero_grad(set_to_none=True)
      loss.backward()
      update()
    steps[part or WHOLE] = step
  return steps


def worker(program: str) -> dict:
  """Interleaved blocks of every variant: {variant: [{'ms', 'span_unix'}, ...]}."""
  if _ONE_CORE.value:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # before XLA or PyTorch size their thread pools
  steps = symjax_steps() if program == 'symjax' else pytorch_steps()
  for step in steps.values():
    for _ in range(5):
      step()
  blocks = {name: [] for name in steps}
  for _ in range(_BLOCKS.value):
    for name, step in steps.items():
      start, clock = time.time(), time.perf_counter()
      for _ in range(_STEPS.value):
        step()
      blocks[name].append({'ms': 1e3 * (time.perf_counter() - clock) / _STEPS.value,
                           'span_unix': (start, time.time())})
  return blocks


def child(program: str) -> dict:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get('PYTHONPATH')])))
  proc = subprocess.run([sys.executable, '-m', 'benchmarks.speed.part_costs', f'--worker={program}',
                         f'--blocks={_BLOCKS.value}', f'--steps={_STEPS.value}', f'--one_core={_ONE_CORE.value}'],
                        capture_output=True, text=True, env=env)
  lines = [line for line in proc.stdout.splitlines() if line.startswith('{')]
  if proc.returncode or not lines:
    sys.exit(f'error: the {program} child failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}')
  return json.loads(lines[-1])


def main(_):
  if _WORKER.value:
    print(json.dumps(worker(_WORKER.value)))
    return
  try:
    import torch  # noqa: F401
  except ImportError:
    sys.exit("error: PyTorch is not installed; pip install -e '.[bench]' --extra-index-url "
             'https://download.pytorch.org/whl/cpu')
  from benchmarks.lib import results as result_files
  from benchmarks.speed import core_latency
  record = {'steps': _STEPS.value, 'blocks': _BLOCKS.value, 'rounds': _ROUNDS.value, 'one_core': _ONE_CORE.value,
            'programs': {}}
  blocks: dict[str, dict[str, list]] = {'symjax': {}, 'pytorch': {}}
  samples = []
  with tempfile.TemporaryDirectory() as folder:
    probe, why_not = (None, '') if _ONE_CORE.value else core_latency.build(folder)  # one core: no pair to place
    if why_not:
      print(f"the cores' placement is not sampled: {why_not}", file=sys.stderr)
    for r in range(_ROUNDS.value):
      for program in blocks:
        log = os.path.join(folder, f'{program}_{r}.log')
        with core_latency.Monitor(probe, log, core_latency.INTERVAL_MS) as monitor:
          measured = child(program)
        samples += monitor.samples()
        for name, rows in measured.items():
          blocks[program].setdefault(name, []).extend(rows)
  samples.sort()
  limit = core_latency.FAR_FACTOR * min(ns for _, ns in samples) if samples else None
  for program, by_variant in blocks.items():
    for rows in by_variant.values():
      for row, ns in zip(rows, core_latency.slowest_between(samples, [tuple(r.pop('span_unix')) for r in rows])):
        row['core_round_trip_ns'] = ns
    record['programs'][program] = {'blocks': by_variant, **costs(by_variant, limit)}
  cores = 1 if _ONE_CORE.value else len(os.sched_getaffinity(0))
  print(f'standard model at the text recipe on {cores} core(s): ms per step, median of {_ROUNDS.value} × '
        f'{_BLOCKS.value} interleaved blocks of {_STEPS.value} steps' + ('' if _ONE_CORE.value else
                                                                         ', those with the cores near'))
  print(f"  {'':22s} {'symjax':>9s} {'PyTorch':>9s}")
  mine, peer = record['programs']['symjax'], record['programs']['pytorch']
  print(f"  {WHOLE:22s} {mine['step_ms'][WHOLE]:6.1f} ms {peer['step_ms'][WHOLE]:6.1f} ms")
  for part in KNOCKOUTS:
    print(f"  {part:22s} {mine['cost_ms'][part]:6.1f} ms {peer['cost_ms'][part]:6.1f} ms")
  if not _ONE_CORE.value:
    count = lambda program: min(record['programs'][program]['blocks_cores_near'].values())
    print(f"  {'pairs with the cores near':22s} {count('symjax'):9d} {count('pytorch'):9d}  (at least; 0: all blocks)")
  print('  (a part: the whole step minus the step without it, in blocks run side by side)')
  result_files.write(_JSON.value, record)


if __name__ == '__main__':
  app.run(main)
