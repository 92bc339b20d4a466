"""symjax's interpretability loop against TransformerLens's own, side by side in one process on this CPU.

  pip install -e '.[bench]'      # PyTorch and TransformerLens 3.x
  python -m benchmarks.speed.vs_transformer_lens [--json=benchmarks/results/vs_transformer_lens_cpu.json]
  python -m benchmarks.speed.vs_transformer_lens --starts=1,2,4 [--starts_json=benchmarks/results/sweep_starts_cpu.json]

The model is nanoGPT's CPU shape (4 layers, 4 heads × 32, MLP 512, vocabulary 65, context 64), the standard
kind with learned positions, and the same weights are loaded into TransformerLens's ``HookedTransformer``, so
that both compute the same function: the script checks the logits and every sweep's values against each other
before it times anything. Workloads, each timed as the median of warm calls, the libraries' bursts of
calls interleaved so that a machine whose speed drifts slows them alike (the first call, with its
compilation, reported apart; ``timed_side_by_side`` says why in bursts):
- a forward pass, ``run_with_cache`` of every site and a hooked loss (one head zeroed) on 8 × 64 tokens;
- patching sweeps of one prompt pair (``--sweep_batch`` pairs) of 64 tokens, TransformerLens's
  ``get_act_patch_*`` against symjax's functions of the same names: heads of every block at all positions
  (16 patches), the residual stream before every block at every position (256), heads by position (1,024);
- the same symjax workloads on the symbolic kind of the same shape (TransformerLens has no such model: its
  ratios are against TransformerLens's standard model).
The corrupt prompt changes the clean one's middle token. symjax's sweeps recompute only what follows a patch
and skip the patches before the first changed token, so the two position sweeps are timed a second time with
the first token changed (``_from_0``): every patch then runs. The metric is the logit difference of two tokens
at the last position. Run it on an idle machine: with both
cores busy, eager PyTorch slows far more than XLA. Tests time nothing; ``docs/results/data/`` pages are
generated from the JSON (``python -m benchmarks.results_pages``).

``--against=COMMIT``: symjax's own workloads (``--workloads``, default the patching ones) in this tree and in
``COMMIT``'s, for the standard and the symbolic kind, each (tree, kind) in a fresh process whose first calls
compile, the trees alternating over ``--rounds`` rounds (no TransformerLens): what a change of the
interpretability path costs or saves, its first calls and its warm medians, the values checked equal.

``--starts``: what the number of starts a patching sweep recomputes from (``symjax.interpret.suffix.BUCKETS``)
costs at the first call and saves at the next (each start is a program to compile, and more starts recompute
fewer positions), for the sweeps above on the standard and the symbolic kind (symjax alone). Every (kind, sweep,
starts) runs in a fresh process, so its first call compiles everything it needs, as a researcher's first sweep of
a session does; then the median of ``--repeats`` warm calls. The values of every count are checked against each
other.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import statistics
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from benchmarks.lib import cli, timing
from benchmarks.lib import lens_pair as pair
from benchmarks.lib import results as result_files
from symjax.system import host

_JSON = cli.json_output('benchmarks/results/vs_transformer_lens_cpu.json')
_REPEATS = cli.repeats(15, 'Warm calls timed per workload and library, in bursts (the median is reported).')
_STARTS = flags.DEFINE_list('starts', [], 'Starts per input (suffix.BUCKETS) to compare, each sweep in a fresh '
                             'process, instead of the comparison with TransformerLens.')
_STARTS_JSON = flags.DEFINE_string('starts_json', 'benchmarks/results/sweep_starts_cpu.json', 'Where --starts writes.')
_STARTS_CHILD = 'SYMJAX_SWEEP_STARTS_CHILD'  # "kind sweep buckets", set in the processes --starts starts
_AGAINST = flags.DEFINE_string('against', None, 'A commit: time symjax\'s workloads in this tree and in that '
                               'commit\'s, in alternating processes, instead of the comparison with TransformerLens.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'With --against: rounds of the two trees\' processes.', lower_bound=1)
_AGAINST_CHILD = 'SYMJAX_AGAINST_CHILD'  # "kind workload,workload,...", set in the processes --against starts
AGAINST_WORKLOADS = ('patch_loop_16', 'heads_sweep_16', 'resid_pre_sweep_256', 'heads_by_position_sweep_1024',
                     'resid_pre_sweep_256_from_0')
_SWEEP_BATCH = flags.DEFINE_integer('sweep_batch', 1, 'Prompt pairs patched in every sweep.')
_WORKLOADS = flags.DEFINE_list('workloads', [], 'Workloads to time (default: all); a user-metric or loop row '
                               'needs the TransformerLens row it is compared with (lens_pair.SAME_FOR_LENS).')

def interference(symjax_call, lens_call, repeats: int) -> dict[str, float]:
  """Each library's forward pass timed back to back, and right after one call of the other library: what
  timing the libraries' single calls interleaved would measure."""
  out = {}
  for name, call, other in (('symjax', symjax_call, lens_call), ('transformer_lens', lens_call, symjax_call)):
    call()
    out[f'{name}_s'] = statistics.median(pair.seconds(call) for _ in range(repeats))
    after = []
    for _ in range(repeats):
      other()
      after.append(pair.seconds(call))
    out[f'{name}_after_the_other_s'] = statistics.median(after)
  return out


def cache_output_floor(hm, tokens, repeats: int) -> dict[str, float]:
  """What writing a full cache costs by itself: a compiled program that only fills fresh arrays of the
  cache's shapes (every sown site and the logits) with a constant, timed as the workloads are. XLA on a CPU
  gives a program's outputs new buffers on every call, so no faster forward pass removes this part of
  ``run_with_cache``."""
  logits, cache = hm.run_with_cache(tokens)
  shapes = [(np.shape(a), np.asarray(a).dtype) for a in (logits, *cache.intermediates.values())]
  fill = jax.jit(lambda x: [jnp.full(shape, x, dtype) for shape, dtype in shapes])
  first, warm = pair.timed(lambda: jax.block_until_ready(fill(1.0)), repeats)
  return {'arrays': len(shapes), 'megabytes': sum(int(np.prod(s)) * d.itemsize for s, d in shapes) / 1e6,
          'seconds': warm}


def lens_workloads(model, tokens, clean, corrupt):
  import torch
  from transformer_lens import patching
  to = lambda x: torch.tensor(np.asarray(x), dtype=torch.long)
  first = to(pair.first_token_corrupted(clean))
  tokens, clean, corrupt = to(tokens), to(clean), to(corrupt)
  with torch.no_grad():
    _, clean_cache = model.run_with_cache(clean)

  def metric(logits):
    return (logits[:, -1, pair.ANSWER] - logits[:, -1, pair.WRONG]).mean()

  def zero(value, hook):
    value[:, :, 0] = 0.0
    return value

  def no_grad(fn):
    def run():
      with torch.no_grad():
        return fn()
    return run
  import functools
  layers_heads = [(l, h) for l in range(pair.LAYERS) for h in range(pair.HEADS)]
  return {
      'forward': no_grad(lambda: model(tokens)),
      'inline_hook_loss': no_grad(lambda: model.run_with_hooks(
          tokens, return_type='loss', fwd_hooks=[('blocks.1.attn.hook_z', pair.scale_inline())])),
      'partial_loop_16': no_grad(lambda: [model.run_with_hooks(
          tokens, return_type='loss', fwd_hooks=[(f'blocks.{l}.attn.hook_z', functools.partial(pair.ablate, head=h))])
          for l, h in layers_heads]),
      'run_with_cache': no_grad(lambda: model.run_with_cache(tokens)),
      'hooked_loss': no_grad(lambda: model.run_with_hooks(tokens, return_type='loss',
                                                          fwd_hooks=[('blocks.1.attn.hook_z', zero)])),
      'heads_sweep_16': no_grad(lambda: patching.get_act_patch_attn_head_out_all_pos(model, corrupt, clean_cache,
                                                                                      metric)),
      'resid_pre_sweep_256': no_grad(lambda: patching.get_act_patch_resid_pre(model, corrupt, clean_cache, metric)),
      'heads_by_position_sweep_1024': no_grad(lambda: patching.get_act_patch_attn_head_out_by_pos(
          model, corrupt, clean_cache, metric)),
      'resid_pre_sweep_256_from_0': no_grad(lambda: patching.get_act_patch_resid_pre(model, first, clean_cache,
                                                                                     metric)),
      'heads_by_position_sweep_1024_from_0': no_grad(lambda: patching.get_act_patch_attn_head_out_by_pos(
          model, first, clean_cache, metric)),
  }


def generation_workloads() -> tuple[dict, dict]:
  """({library: a call generating}, {tokens that differ}): greedy generation on the context-256 pair, each
  library with its key-value cache (the timed calls), and the tokens in which symjax's differ from
  TransformerLens's full pass per token and from its cached loop (which, on near-tied logits of these random
  weights, can differ from its own full pass)."""
  import torch
  hm = pair.symjax_model('standard', pair.GENERATION_CONTEXT)
  lens = pair.lens_model(hm.params, pair.GENERATION_CONTEXT)
  prompts = pair.generation_prompts()
  ours = lambda: hm.generate(prompts, pair.GENERATION_NEW)
  as_torch = torch.tensor(prompts, dtype=torch.long)

  def theirs(cache: bool = True):
    with torch.no_grad():
      return lens.generate(as_torch, max_new_tokens=pair.GENERATION_NEW, do_sample=False, use_past_kv_cache=cache,
                           stop_at_eos=False, verbose=False)
  tokens = np.stack(ours())
  same = {'generate_120_tokens_differing_from_full_passes': int((tokens != theirs(False).numpy()).sum()),
          'generate_120_tokens_differing_from_cached_loop': int((tokens != theirs().numpy()).sum())}
  return {'symjax': ours, 'transformer_lens': theirs}, same


def check_same(hm, lens, tokens, clean, corrupt) -> dict[str, float]:
  """The largest difference between the two libraries' logits and sweep values (the same weights)."""
  sym, tl = pair.symjax_workloads(hm, tokens, clean, corrupt), lens_workloads(lens, tokens, clean, corrupt)
  out = {'logits': float(np.abs(np.asarray(sym['forward']()) - tl['forward']().numpy()).max())}
  as_array = lambda x: np.asarray([float(v) for v in x] if isinstance(x, list) else x.numpy())
  for name in (*pair.SWEEPS, *pair.SAME_FOR_LENS, 'inline_hook_loss'):
    ours, theirs = np.asarray(sym[name]()), as_array(tl[pair.SAME_FOR_LENS.get(name, name)]())
    theirs = theirs.reshape(ours.shape)  # TransformerLens: [layers, positions, heads] and lists, as symjax
    out[name] = float(np.abs(ours - theirs).max())
  return out


def one_sweep(kind: str, sweep: str, buckets: int) -> dict:
  """This process's first call, warm median and values of one sweep."""
  from symjax.interpret import suffix
  suffix.BUCKETS = buckets
  hm = pair.symjax_model(kind)
  call = pair.symjax_workloads(hm, *pair.prompts())[sweep]
  first = pair.seconds(call)
  values = np.asarray(call())
  warm = statistics.median(pair.seconds(call) for _ in range(_REPEATS.value))
  return {'first_call_s': first, 'warm_s': warm, 'values': values.tolist()}



def kind_workloads(kind: str, names: list[str]) -> dict:
  """``--against``'s child: {workload: first call, warm median and values} of ``kind`` in this process."""
  hm = pair.symjax_model(kind)
  calls = pair.symjax_workloads(hm, *pair.prompts(_SWEEP_BATCH.value))
  out = {}
  for name in names:
    first = pair.seconds(calls[name])
    values = np.asarray(calls[name](), float)
    warm = statistics.median(pair.seconds(calls[name]) for _ in range(_REPEATS.value))
    out[name] = {'first_call_s': first, 'warm_s': warm, 'values': values.ravel().tolist()}
  return out


def against(commit: str) -> None:
  """``--against``: each kind's workloads in a fresh process of this tree and of ``commit``'s, alternating which
  runs first, ``--rounds`` times; this tree's benchmark code times both (``symjax`` is each tree's own)."""
  names = _WORKLOADS.value or list(AGAINST_WORKLOADS)
  kinds = ('standard', 'symbolic')
  runs = {}
  with timing.two_trees(commit) as (folder, trees):
    ours = os.path.join(folder, 'bench')
    os.makedirs(ours)
    os.symlink(os.path.join(trees[0][1], 'benchmarks'), os.path.join(ours, 'benchmarks'))
    for r in range(_ROUNDS.value):
      for kind in kinds:
        for tree, root in trees[::1 if r % 2 == 0 else -1]:
          env = dict(os.environ, PYTHONPATH=f'{ours}:{root}', **{_AGAINST_CHILD: f'{kind} {",".join(names)}'})
          out = subprocess.run([sys.executable, '-m', 'benchmarks.speed.vs_transformer_lens',
                                f'--repeats={_REPEATS.value}', f'--sweep_batch={_SWEEP_BATCH.value}'],
                               cwd=ours, env=env, capture_output=True, text=True)  # not root: its benchmarks
          if out.returncode:
            raise SystemExit(f'{tree} {kind} failed:\n{out.stderr[-2000:]}')
          runs.setdefault(tree, {}).setdefault(kind, []).append(json.loads(out.stdout.strip().splitlines()[-1]))
  table, largest = {}, 0.0
  print(f'symjax workloads, this tree against {commit}: medians over {_ROUNDS.value} processes each '
        f'({result_files.cpu_model()})')
  print(f'| kind | workload | first call s, this | first call s, {commit} | warm s, this | warm s, {commit} '
        f'| warm this / {commit} |')
  print('|---|---|---:|---:|---:|---:|---:|')
  for kind in kinds:
    for name in names:
      row = {}
      for tree, _ in trees:
        per = [run[name] for run in runs[tree][kind]]
        row[tree] = {'first_call_s': [p['first_call_s'] for p in per], 'warm_s': [p['warm_s'] for p in per],
                     'median_first_call_s': statistics.median(p['first_call_s'] for p in per),
                     'median_warm_s': statistics.median(p['warm_s'] for p in per)}
        values = np.asarray(per[0]['values'])
      this = np.asarray(runs['this tree'][kind][0][name]['values'])
      largest = max(largest, float(np.nanmax(np.abs(this - values))) if this.shape == values.shape else np.inf)
      a, b = row['this tree'], row[commit]
      row['warm_ratio'] = a['median_warm_s'] / b['median_warm_s']
      table[f'{kind}/{name}'] = row
      print(f'| {kind} | {name} | {a["median_first_call_s"]:.2f} | {b["median_first_call_s"]:.2f} | '
            f'{a["median_warm_s"]:.4f} | {b["median_warm_s"]:.4f} | {row["warm_ratio"]:.3f} |')
  print(f'largest difference of the values between the trees: {largest:.3g}')
  if largest > 1e-4:
    raise SystemExit(f'the trees\' values differ by {largest:.3g}')
  result_files.write(_JSON.value, {
      'what': f'symjax interpretability workloads of benchmarks.speed.vs_transformer_lens, this tree against '
              f'{commit}: each (tree, kind) in a fresh process ({_ROUNDS.value} each, alternating which tree runs '
              f'first), its first calls (compilation included) and the median of {_REPEATS.value} warm calls',
      'against': commit, 'rounds': _ROUNDS.value, 'repeats': _REPEATS.value, 'jax': jax.__version__,
      'largest_difference': largest, 'workloads': table,
      'command': f'python -m benchmarks.speed.vs_transformer_lens --against={commit} --rounds={_ROUNDS.value} '
                 f'--repeats={_REPEATS.value}' + (f' --workloads={",".join(names)}' if _WORKLOADS.value else '')})


def starts() -> None:
  """``--starts``: every (kind, sweep, starts) in a fresh process of this script; the table and JSON."""
  buckets = [int(b) for b in _STARTS.value]
  table, largest = {}, 0.0
  print(f'{"kind":9s} {"sweep":36s} ' + ' '.join(f'{f"first s, B={b}":>13s} {f"warm s, B={b}":>12s}'
                                                  for b in buckets))
  for kind in ('standard', 'symbolic'):
    for sweep in pair.SWEEPS:
      row = {}
      for b in buckets:
        env = dict(os.environ, **{_STARTS_CHILD: f'{kind} {sweep} {b}'})
        out = subprocess.run([sys.executable, '-m', 'benchmarks.speed.vs_transformer_lens',
                              f'--repeats={_REPEATS.value}'],
                             env=env, capture_output=True, text=True)
        if out.returncode:
          raise SystemExit(f'{kind} {sweep} with {b} starts failed:\n{out.stderr[-2000:]}')
        row[b] = json.loads(out.stdout.strip().splitlines()[-1])
      values = [np.asarray(r.pop('values')) for r in row.values()]
      largest = max(largest, *(float(np.abs(v - values[0]).max()) for v in values))
      table[f'{kind}/{sweep}'] = {str(b): r for b, r in row.items()}
      print(f'{kind:9s} {sweep:36s} ' + ' '.join(f'{r["first_call_s"]:13.2f} {r["warm_s"]:12.4f}'
                                                 for r in row.values()))
  if largest > 1e-5:
    raise SystemExit(f'the sweeps differ between bucket counts by {largest:.3g}')
  print(f'largest difference of the sweep values between bucket counts: {largest:.3g}')
  result_files.write(_STARTS_JSON.value, {
      'what': 'patching sweeps of benchmarks.speed.vs_transformer_lens (nanoGPT CPU shape, one prompt pair of 64 '
              'tokens) by the number of starts they recompute from (symjax.interpret.suffix.BUCKETS): each '
              '(kind, sweep, starts) in a fresh process, its first call (compilation included) and the median '
              'of its warm calls',
      'shape': {'layers': pair.LAYERS, 'heads': pair.HEADS, 'head_dim': pair.HEAD_DIM, 'mlp': pair.MLP,
                'vocab': pair.VOCAB, 'context': pair.CONTEXT, 'sweep_batch': 1},
      'repeats': _REPEATS.value, 'jax': jax.__version__, 'largest_difference': largest, 'sweeps': table})



def main(argv):
  del argv
  host.prepare()  # the allocator and compiler flags every symjax process runs with
  if os.environ.get(_STARTS_CHILD):
    kind, sweep, buckets = os.environ[_STARTS_CHILD].split()
    print(json.dumps(one_sweep(kind, sweep, int(buckets))))
    return
  if os.environ.get(_AGAINST_CHILD):
    kind, names = os.environ[_AGAINST_CHILD].split()
    print(json.dumps(kind_workloads(kind, names.split(','))))
    return
  if _STARTS.value:
    return starts()
  if _AGAINST.value:
    return against(_AGAINST.value)
  import torch
  tokens, clean, corrupt = pair.prompts(_SWEEP_BATCH.value)
  standard, symbolic = pair.symjax_model('standard'), pair.symjax_model('symbolic')
  lens = pair.lens_model(standard.params)
  # Each workload in turn, the three libraries' calls interleaved; symjax's first calls compile.
  workloads = {'transformer_lens': lens_workloads(lens, tokens, clean, corrupt),
               'symjax': pair.symjax_workloads(standard, tokens, clean, corrupt),
               'symjax_symbolic': pair.symjax_workloads(symbolic, tokens, clean, corrupt)}
  chosen = [w for w in _WORKLOADS.value if w != 'generate_120'] or list(workloads['symjax'])
  rows = {name: pair.timed_side_by_side({kind: w[name] for kind, w in workloads.items() if name in w},
                                        _REPEATS.value) for name in chosen}
  if not _WORKLOADS.value or 'generate_120' in _WORKLOADS.value:
    calls, generation_same = generation_workloads()
    rows['generate_120'] = pair.timed_side_by_side(calls, _REPEATS.value)
  for name, row in rows.items():  # the rows that call the same TransformerLens function as another
    if 'transformer_lens' not in row:
      row['transformer_lens'] = rows[pair.SAME_FOR_LENS[name]]['transformer_lens']
  floor = {kind: cache_output_floor(hm, tokens, _REPEATS.value)
           for kind, hm in (('symjax', standard), ('symjax_symbolic', symbolic))}
  print(f'writing a full cache alone (fresh output buffers): {floor}')
  mixed = interference(workloads['symjax']['forward'], workloads['transformer_lens']['forward'], 3 * _REPEATS.value)
  print(f'forward passes back to back, and each right after the other library\'s: {mixed}')
  same = check_same(standard, lens, tokens, clean, corrupt)
  same.update(generation_same if 'generate_120' in rows else {})
  print(f'largest differences, symjax against TransformerLens (same weights): {same}')
  print(f'{"workload":30s} {"TL s":>9s} {"symjax s":>9s} {"ratio":>7s} {"symbolic s":>10s} {"ratio":>7s} '
        f'{"first call s":>12s}')
  table = {}
  for name, r in rows.items():
    # Generation runs the standard kind's pair alone (TransformerLens has no symbolic model to compare).
    first_sy, sy = r.get('symjax_symbolic', (None, None))
    tl, sj = r['transformer_lens'][1], r['symjax'][1]
    table[name] = {'transformer_lens_s': tl, 'symjax_s': sj, 'symjax_symbolic_s': sy, 'speedup': tl / sj,
                   'speedup_symbolic': None if sy is None else tl / sy, 'symjax_first_call_s': r['symjax'][0],
                   'symjax_symbolic_first_call_s': first_sy,
                   'transformer_lens_first_call_s': r['transformer_lens'][0]}
    symbolic = f'{sy:10.4f} {tl / sy:7.1f}' if sy is not None else f'{"—":>10s} {"—":>7s}'
    print(f'{name:30s} {tl:9.4f} {sj:9.4f} {tl / sj:7.1f} {symbolic} {r["symjax"][0]:12.2f}')
  result_files.write(_JSON.value, {
      'what': 'symjax interpretability workloads against TransformerLens (HookedTransformer, same weights), one '
              'process, warm medians of bursts of calls interleaved between the libraries, each burst after a '
              f'{pair.QUIET_S} s pause and {pair.WARM_UP_S} s of untimed calls; first calls (compilation '
              'included) apart',
      'shape': {'layers': pair.LAYERS, 'heads': pair.HEADS, 'head_dim': pair.HEAD_DIM, 'mlp': pair.MLP,
                'vocab': pair.VOCAB, 'context': pair.CONTEXT, 'batch': pair.BATCH, 'sweep_batch': _SWEEP_BATCH.value},
      'repeats': _REPEATS.value, 'transformer_lens': importlib.metadata.version('transformer_lens'),
      'torch': torch.__version__, 'torch_threads': torch.get_num_threads(), 'jax': jax.__version__,
      'largest_difference': same, 'workloads': table, 'cache_output_floor': floor, 'interference': mixed})


if __name__ == '__main__':
  app.run(main)
