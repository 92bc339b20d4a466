"""Training-step time, measured side by side in one run: the three kinds at the text recipe's shape, and
several seeds trained together (vmapped and unrolled, `symjax.train.seeds.combined_step`) against one seed at the
default induction config.

  python -m benchmarks.speed.step_time [--json=benchmarks/results/step_time.json] [--steps=100] [--repeats=3]
  python -m benchmarks.speed.step_time --allocator [--json=benchmarks/results/allocator_ab.json]
  python -m benchmarks.speed.step_time --against=COMMIT [--command --steps=1000] [--json=PATH]
  python -m benchmarks.speed.step_time --against=COMMIT --programs [--json=PATH]

``--allocator``: the kinds' step with and without ``symjax.system.host.retain_freed_memory`` (glibc's
defaults: ``SYMJAX_KEEP_MALLOC=1``), each in its own process since malloc's settings are process-wide,
the two alternating ``repeats`` times; the median of each is reported.
``--against=COMMIT``: the kinds' step of this tree and of COMMIT's (checked out in a temporary worktree, its
own ``step_time`` run), after one untimed process, the two in turn for ``repeats`` rounds, which runs first
alternating too: an A/B of two trees in one run. Each round's ratio of the two is reported, their median and
range: single processes of one tree spread by more than most changes, so the range says what a ratio can
show (``--against=HEAD`` times this code against itself). With
``--command``, each tree's whole training command instead (``python -m symjax.main
--config=<kind>:task=text,size=medium`` for ``--steps`` steps on ``--text_path``, its own compilation cache
warmed first): the median tokens/s of its progress lines after the first, so that the loop around the step
is timed too. With ``--programs``, no timing: each tree compiles each kind's step (and the program kind's at
``PROGRAM_RECIPES``) and the SHA-256 of XLA's optimised program (its text, source locations removed) is
compared — equal digests are the same machine code, so no timing noise can hide or fake a difference.

Kinds: 4 layers, 4 heads × 32, |V| = 65 (Tiny Shakespeare's characters), batch 12 × 64 tokens, AdamW
(``configs/<kind>.py:task=text,size=medium``); a fixed random batch, so only the compiled step is timed.
Seeds: ``configs/symbolic.py`` (induction, batch 64), the host building each seed's batch every step as
the trainer does. Compilation is excluded (warm-up steps first); the variants are timed in turn, ``repeats``
rounds, and the fastest round of each is reported, so that other load on the machine affects every
variant alike.
"""

import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import symjax.configs as configs
from benchmarks.lib import cli, recipe
from benchmarks.lib import results as result_files
from benchmarks.lib.timing import in_turn, round_ratios, two_trees
from symjax import model as model_lib
from symjax import tasks
from symjax.system import host
from symjax.train import config as config_lib
from symjax.train import optim, seeds
from symjax.train import trainer as train

_JSON = cli.json_output('benchmarks/results/step_time.json')
_STEPS = cli.steps(100, 'Timed steps per round.')
_REPEATS = cli.repeats(4, 'Rounds; the fastest is reported (A/Bs: processes per side, best even).')
_SEEDS = flags.DEFINE_integer('seeds', 3, 'Seeds trained together in the seeds comparison.')
_ALLOCATOR = flags.DEFINE_bool('allocator', False, 'A/B of the allocator setting instead (see the docstring).')
_AGAINST = flags.DEFINE_string('against', '', 'A commit to time against this tree (see the docstring).')
_COMMAND = flags.DEFINE_bool('command', False, 'With --against: the whole training command of each tree.')
_TEXT = flags.DEFINE_string('text_path', '../shared/data/tinyshakespeare.txt', 'The corpus --command trains on.')
_PROGRAMS = flags.DEFINE_bool('programs', False, "With --against: compare the trees' compiled steps, not their times.")
_KINDS_ONLY = flags.DEFINE_bool('kinds_only', False, 'Time the kinds only (the allocator A/B runs this).')
KINDS = ('standard', 'token_factored', 'symbolic')


def recipe_step(kind: str):
  """A closure running one training step of ``kind`` at the recipe's shape, and the parameter count."""
  config = configs.from_file(f'{kind}:task=text,size=medium')
  model = model_lib.build(config_lib.model_config(config, 65, causal=True))
  tx = optim.make_optimizer(config)
  train_step, _ = train.make_steps(model, tx, recipe.text_options(config))
  step = jax.jit(train_step, donate_argnums=0)
  rng = jax.random.key(0)
  state = jax.jit(lambda k: jax.tree.map(lambda x: x, optim.init_state(model, tx, k, config.seq_len)))(rng)
  state = jax.tree.map(lambda x: getattr(x, 'value', x), state, is_leaf=lambda x: hasattr(x, 'value'))
  r = np.random.default_rng(0)
  shape = (config.batch_size, config.seq_len)
  batch = {'inputs': r.integers(0, 65, shape, dtype=np.int32), 'targets': r.integers(0, 65, shape, dtype=np.int32),
           'weights': np.ones(shape, np.float32), 'key_mask': np.ones(shape, bool)}
  holder = {'state': state}

  def run():
    holder['state'], metrics = step(holder['state'], batch, rng)
    return metrics
  return run, sum(x.size for x in jax.tree.leaves(state.params))


def seeds_step(num_seeds: int, how: str = 'vmap'):
  """One training step of ``num_seeds`` seeds of the default induction config, batches built on the host,
  the seeds combined as ``symjax.train.seeds.combined_step(..., how)`` does."""
  config = configs.from_file('symbolic')
  task = tasks.get_task(config)
  model = model_lib.build(config_lib.model_config(config, len(task.vocab), task.causal))
  tx = optim.make_optimizer(config)
  train_step, _ = train.make_steps(model, tx, train.StepOptions.of(config, task))
  init = lambda key: jax.tree.map(lambda x: getattr(x, 'value', x), optim.init_state(model, tx, key, task.seq_len),
                                  is_leaf=lambda x: hasattr(x, 'value'))
  keys = jnp.stack([jax.random.key(s) for s in range(num_seeds)])
  step = seeds.combined_step(train_step, num_seeds, how)
  holder = {'state': jax.jit(jax.vmap(init))(keys), 'step': 0}

  def run():
    batches = [task.batch('train', holder['step'], config.batch_size, s) for s in range(num_seeds)]
    batch = jax.tree.map(lambda *xs: np.stack(xs), *batches)
    holder['state'], metrics = step(holder['state'], batch, keys)
    holder['step'] += 1
    return metrics
  return run


def time_rounds(runs: dict, steps: int, repeats: int) -> dict[str, float]:
  """Seconds per step of each closure: warm-up, then ``repeats`` rounds in turn; the fastest round."""
  for run in runs.values():
    for _ in range(5):
      jax.block_until_ready(run())
  best = {name: float('inf') for name in runs}
  for _ in range(repeats):
    for name, run in runs.items():
      start = time.perf_counter()
      for _ in range(steps):
        out = run()
      jax.block_until_ready(out)
      best[name] = min(best[name], (time.perf_counter() - start) / steps)
  return best


def allocator_ab() -> None:
  """The kinds' step in processes with and without the allocator setting, alternating."""
  times: dict[str, dict[str, list[float]]] = {mode: {k: [] for k in KINDS} for mode in ('retained', 'glibc default')}
  with tempfile.TemporaryDirectory() as folder:
    for r in range(_REPEATS.value):
      for mode in in_turn(tuple(times), r):
        out = os.path.join(folder, f'{r}_{mode}.json')
        env = dict(os.environ, **({host.KEEP_MALLOC_ENV: '1'} if mode == 'glibc default' else {}))
        subprocess.run([sys.executable, '-m', 'benchmarks.speed.step_time', '--kinds_only', '--repeats=1',
                        f'--steps={_STEPS.value}', f'--json={out}'], env=env, check=True, capture_output=True)
        with open(out) as f:
          step = json.load(f)['recipe_step_seconds']
        for k in KINDS:
          times[mode][k].append(step[k])
  median = {mode: {k: statistics.median(v) for k, v in by_kind.items()} for mode, by_kind in times.items()}
  print(f'\nTraining step at the text recipe shape, with and without the allocator setting, median of '
        f'{_REPEATS.value} alternating processes ({result_files.cpu_model() + ", " + result_files.cpu_id()})')
  print('| kind | retained (ms) | glibc default (ms) | speed-up |')
  print('|---|---:|---:|---:|')
  for k in KINDS:
    a, b = median['retained'][k], median['glibc default'][k]
    print(f'| {k} | {1e3 * a:.1f} | {1e3 * b:.1f} | {b / a:.2f}× |')
  result = {'steps': _STEPS.value,
            'repeats': _REPEATS.value, 'step_seconds': times, 'median_step_seconds': median,
            'command': f'python -m benchmarks.speed.step_time --allocator --steps={_STEPS.value} '
                       f'--repeats={_REPEATS.value}'}
  result_files.write(_JSON.value, result)


def command_rate(kind: str, cwd: str, folder: str) -> float:
  """The median tokens/s of the progress lines of one training command run in the tree at ``cwd`` (its first
  line, with the compilation, left out)."""
  workdir, cache = os.path.join(folder, 'run'), os.path.join(folder, f'cache_{os.path.basename(cwd)}_{kind}')
  argv = [sys.executable, '-m', 'symjax.main', f'--config={kind}:task=text,size=medium',
          f'--config.text_path={os.path.abspath(_TEXT.value)}', f'--config.total_steps={_STEPS.value}',
          f'--workdir={workdir}', f'--config.compilation_cache_dir={cache}', '--config.progress_bar=False']
  subprocess.run(['rm', '-rf', workdir], check=True)
  out = subprocess.run(argv, cwd=cwd, check=True, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=cwd))
  rates = [float(m.group(1).replace(',', '')) for m in
           (re.search(r'^step \d+/\d+: loss [\d.]+, ([\d,]+) tokens/s', line) for line in out.stdout.splitlines()) if m]
  return statistics.median(rates[1:])


def report(commit: str, values: dict, what: str, unit: str, show, name: str, flags_: str) -> None:
  """The medians of ``values`` {tree: {kind: [per round]}} as a table of this tree against ``commit``, each
  round's ratio of the two (``round_ratios``), their median and range, and JSON."""
  median = {tree: {k: statistics.median(v) for k, v in by_kind.items()} for tree, by_kind in values.items()}
  ratios = {k: round_ratios(values['this tree'][k], values[commit][k]) for k in KINDS}
  print(f'\n{what}, this tree against {commit}, {_REPEATS.value} rounds of the two in turn '
        f'({result_files.cpu_model()}, {result_files.cpu_id()})')
  print(f'| kind | this tree ({unit}, median) | {commit} ({unit}, median) | this / {commit}, median of rounds | '
        f'range over rounds |')
  print('|---|---:|---:|---:|---:|')
  for k in KINDS:
    print(f'| {k} | {show(median["this tree"][k])} | {show(median[commit][k])} | '
          f'{statistics.median(ratios[k]):.3f} | {min(ratios[k]):.3f} to {max(ratios[k]):.3f} |')
  result_files.write(_JSON.value, {'against': commit, 'steps': _STEPS.value, 'repeats': _REPEATS.value,
                                   name: values, f'median_{name}': median, 'round_ratios': ratios,
                                   'median_round_ratio': {k: statistics.median(v) for k, v in ratios.items()},
                                   'command': f'python -m benchmarks.speed.step_time --against={commit}{flags_} '
                                              f'--steps={_STEPS.value} --repeats={_REPEATS.value}'})


def trees_ab(commit: str) -> None:
  """The kinds' step of this tree and of ``commit``'s, in processes taking turns (``in_turn``), after one
  untimed process: the first process after a pause runs slower."""
  times: dict[str, dict[str, list[float]]] = {t: {k: [] for k in KINDS} for t in ('this tree', commit)}
  with two_trees(commit) as (folder, trees):
    # Both stop after the kinds, unless the commit is from before --kinds_only (it would refuse the flag).
    theirs = os.path.join(trees[1][1], 'benchmarks', 'speed', 'step_time.py')
    knows = os.path.exists(theirs) and "'kinds_only'" in pathlib.Path(theirs).read_text()
    sides = tuple(zip(trees, (['--kinds_only'], ['--kinds_only'] if knows else [])))
    for r in range(-1, _REPEATS.value):
      for (tree, cwd), extra in in_turn(sides, max(r, 0)):
        out = os.path.join(folder, f'{r}.json')
        subprocess.run([sys.executable, '-m', 'benchmarks.speed.step_time', '--repeats=1', '--seeds=1',
                        f'--steps={_STEPS.value}', f'--json={out}', *extra], cwd=cwd, check=True,
                       capture_output=True, env=dict(os.environ, PYTHONPATH=cwd))
        if r < 0:
          break  # the untimed process
        with open(out) as f:
          step = json.load(f)['recipe_step_seconds']
        for k in KINDS:
          times[tree][k].append(step[k])
  report(commit, times, 'Training step at the text recipe shape', 'ms', lambda t: f'{1e3 * t:.1f}', 'step_seconds',
         '')


# Run in each tree (its own symjax first on the path): the digest of each kind's compiled training step.
DIGEST = """
import dataclasses, hashlib, json, re, sys
import jax, numpy as np
import symjax.configs as configs
from symjax import model as model_lib
from symjax.tasks.text import TextTask
from symjax.train import config as config_lib, optim, trainer
from symjax import tasks
out = {}
for kind in sys.argv[1].split(','):
  if kind.startswith('program:'):  # the Transformer Program kind at a RASP task's recipe
    config = configs.from_file(f'rasp:task={kind.split(":")[1]},model=program')
    task = tasks.get_task(config)
    model = model_lib.build(config_lib.model_config(config, len(task.vocab), task.causal))
    options, seq_len = trainer.StepOptions.of(config, task), task.seq_len
  else:
    config = configs.from_file(f'{kind}:task=text,size=medium')
    model = model_lib.build(config_lib.model_config(config, 65, causal=True))
    options = dataclasses.replace(trainer.StepOptions.of(config), key_mask=TextTask.pads_inputs)
    seq_len = config.seq_len
  tx = optim.make_optimizer(config)
  step, _ = trainer.make_steps(model, tx, options)
  state = jax.eval_shape(lambda k: optim.init_state(model, tx, k, seq_len), jax.random.key(0))
  state = jax.tree.map(lambda x: getattr(x, 'value', x), state, is_leaf=lambda x: hasattr(x, 'value'))
  shape = (config.batch_size, seq_len)
  batch = {'inputs': jax.ShapeDtypeStruct(shape, np.int32), 'targets': jax.ShapeDtypeStruct(shape, np.int32),
           'weights': jax.ShapeDtypeStruct(shape, np.float32), 'key_mask': jax.ShapeDtypeStruct(shape, bool)}
  text = jax.jit(step, donate_argnums=0).lower(state, batch, jax.random.key(0)).compile().as_text()
  text = re.sub(r'^\\d+ (\\{file_name_id|").*$', '', text, flags=re.M)   # the source-location tables
  text = re.sub(r',? ?stack_frame_id=\\d+', '', text)
  out[kind] = hashlib.sha256(text.encode()).hexdigest()
print(json.dumps(out))
"""


# The Transformer Program kind's step, at RASP recipes of each of its shapes (3 layers of 8 heads, 1 layer of 4,
# the relaxation): compared by ``--programs`` beside the kinds.
PROGRAM_RECIPES = ('program:most_freq', 'program:hist', 'program:reverse')


def programs_ab(commit: str) -> None:
  """``--against --programs``: the digests of the kinds' compiled steps, and of the program kind's at
  ``PROGRAM_RECIPES``, in this tree and in ``commit``'s."""
  digests, steps = {}, KINDS + PROGRAM_RECIPES
  with two_trees(commit) as (_, trees):
    for tree, cwd in trees:
      proc = subprocess.run([sys.executable, '-c', DIGEST, ','.join(steps)], cwd=cwd, check=True,
                            capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=cwd))
      digests[tree] = json.loads(proc.stdout.strip().splitlines()[-1])
  same = {k: digests['this tree'][k] == digests[commit][k] for k in steps}
  print(f'\nCompiled training step (kinds at the text recipe shape; program:<task> at that RASP recipe), this '
        f'tree against {commit}')
  print('| kind | same program |\n|---|---|')
  for k in steps:
    print(f'| {k} | {"yes" if same[k] else "no"} |')
  result_files.write(_JSON.value, {'against': commit, 'program_sha256': digests, 'same_program': same,
                                   'command': f'python -m benchmarks.speed.step_time --against={commit} --programs'})


def commands_ab(commit: str) -> None:
  """``--against --command``: each kind's whole training command in this tree and in ``commit``'s, alternating
  ``repeats`` times after one warm-up each (which fills each tree's compilation cache)."""
  rates: dict[str, dict[str, list[float]]] = {t: {k: [] for k in KINDS} for t in ('this tree', commit)}
  with two_trees(commit) as (folder, trees):
    for k in KINDS:
      for _, cwd in trees:
        command_rate(k, cwd, folder)  # warm-up: each tree's programs compiled into its own cache
    for r in range(_REPEATS.value):
      for k in KINDS:
        for tree, cwd in in_turn(trees, r):
          rates[tree][k].append(command_rate(k, cwd, folder))
  report(commit, rates, f'The training command at the text recipe ({_STEPS.value} steps)', 'tokens/s',
         lambda r: f'{r:,.0f}', 'tokens_per_second', ' --command')


def main(_):
  host.prepare()  # the trainer's compiler flags and allocator; SYMJAX_KEEP_XLA_FLAGS=1 keeps XLA's flags
  if _ALLOCATOR.value:
    return allocator_ab()
  if _AGAINST.value:
    ab = programs_ab if _PROGRAMS.value else commands_ab if _COMMAND.value else trees_ab
    return ab(_AGAINST.value)
  kinds = {k: recipe_step(k) for k in KINDS}
  kind_times = time_rounds({k: run for k, (run, _) in kinds.items()}, _STEPS.value, _REPEATS.value)
  if _KINDS_ONLY.value:
    return result_files.write(_JSON.value, {'recipe_step_seconds': kind_times})
  print(f'\nOne training step at the text recipe shape (batch 12 × 64, 4 layers, 4 × 32, |V| = 65), '
        f'{jax.devices()[0].platform}, fastest of {_REPEATS.value} rounds of {_STEPS.value} steps')
  print('| kind | parameters | step (ms) | tokens/s | vs token_factored |')
  print('|---|---:|---:|---:|---:|')
  for k in KINDS:
    t = kind_times[k]
    print(f'| {k} | {kinds[k][1]:,} | {1e3 * t:.1f} | {12 * 64 / t:,.0f} | {t / kind_times["token_factored"]:.2f}× |')

  n = _SEEDS.value
  seed_times = time_rounds({'1 seed': seeds_step(1), f'{n} seeds vmap': seeds_step(n, 'vmap'),
                           f'{n} seeds unroll': seeds_step(n, 'unroll')}, _STEPS.value, _REPEATS.value)
  ratio = {how: seed_times[f'{n} seeds {how}'] / seed_times['1 seed'] for how in ('vmap', 'unroll')}
  print("\nDefault induction config (configs/symbolic.py), batches built on the host each step")
  print('| seeds | step (ms) | vs 1 seed | vs 1 seed run n times |')
  print('|---|---:|---:|---:|')
  for name, t in seed_times.items():
    k = int(name.split()[0])
    print(f'| {name} | {1e3 * t:.2f} | {t / seed_times["1 seed"]:.2f}× | {t / (k * seed_times["1 seed"]):.2f} |')
  result = {'device': str(jax.devices()[0]), 'steps': _STEPS.value, 'repeats': _REPEATS.value,
            'recipe_step_seconds': kind_times, 'parameters': {k: int(v[1]) for k, v in kinds.items()},
            'symbolic_over_token_factored': kind_times['symbolic'] / kind_times['token_factored'],
            'seeds_step_seconds': seed_times, f'{n}_seeds_over_1': ratio,
            'seed_step_auto': 'unroll' if jax.default_backend() == 'cpu' else 'vmap',
            'xla_flags': os.environ.get('XLA_FLAGS', ''),
            'command': 'python -m benchmarks.speed.step_time ' + ' '.join(
                f'--{f}={flags.FLAGS[f].value}' for f in ('steps', 'repeats', 'seeds'))}
  os.makedirs(os.path.dirname(_JSON.value) or '.', exist_ok=True)
  result_files.write(_JSON.value, result)


if __name__ == '__main__':
  app.run(main)
