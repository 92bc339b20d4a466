"""Peak resident memory and speed of the whole training command with CPU programs run inline (the trainer's
setting, ``symjax.system.host.run_cpu_programs_inline``) and with JAX's asynchronous dispatch
(``SYMJAX_KEEP_DISPATCH=1``), side by side.

  python -m benchmarks.speed.dispatch_memory --text_path=input.txt [--kinds=standard,symbolic] [--rounds=2] \\
      [--out=benchmarks/results/dispatch_memory.json]

The flags are ``benchmarks.speed.vs_pytorch``'s (``--rounds`` defaults to 3); it writes its JSON to ``--out``.
The text recipe's command of ``benchmarks.speed.vs_pytorch`` (2000 steps), read the same way: steady tokens/s
(the median 50-step block outside evaluations), wall time, peak resident memory (``ru_maxrss``) and the
losses. One compilation cache for every run, filled by an unmeasured run of each kind first, so every
measured run starts warm and the two settings differ only in how steps are dispatched; the settings
alternate within each round, the order swapped from round to round. The machine should be otherwise idle.
"""

from __future__ import annotations

import os
import statistics
import tempfile

from absl import app, flags

from benchmarks.lib import results as result_files
from benchmarks.speed import vs_pytorch
from symjax.system import host

_JSON_OUT = flags.DEFINE_string('out', 'benchmarks/results/dispatch_memory.json', 'Where to write the results.')

SETTINGS = {'inline (trainer default)': {}, 'asynchronous dispatch': {host.KEEP_DISPATCH_ENV: '1'}}
KEEP = ('step_ms', 'tokens_per_s', 'wall_s', 'peak_resident_mib', 'seconds_to_first_step', 'final_train_loss',
        'validation_losses', 'block_min_over_median', 'block_max_over_median')


def main(_):
  if not os.path.isfile(vs_pytorch._TEXT.value):
    raise app.UsageError(f'--text_path {vs_pytorch._TEXT.value!r} is not a file')
  os.environ.pop(host.KEEP_DISPATCH_ENV, None)  # the inline rows run with the trainer's default
  runs = []
  with tempfile.TemporaryDirectory(prefix='dispatch_memory_') as tmp:
    cache = os.path.join(tmp, 'compilation_cache')
    command = lambda kind, name: vs_pytorch.commands(kind, os.path.join(tmp, name), cache)
    for kind in vs_pytorch._KINDS.value:
      vs_pytorch.run_once(command(kind, f'{kind}_warmup'))
    for r in range(vs_pytorch._ROUNDS.value):
      names = list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]
      for kind in vs_pytorch._KINDS.value:
        for name in names:
          out = vs_pytorch.run_once(command(kind, f'{kind}_{r}_{len(runs)}'), SETTINGS[name])
          runs.append({'round': r + 1, 'kind': kind, 'setting': name, **{k: out[k] for k in KEEP}})
          print(f"round {r + 1} {kind} {name}: {out['step_ms']:.1f} ms/step, {out['wall_s']:.1f} s wall, "
                f"{out['peak_resident_mib']:.0f} MiB, final loss {out['final_train_loss']:.4f}", flush=True)

  print(f'\n{result_files.cpu_model()}, {os.cpu_count()} cores; warm compilation cache; median of '
        f'{vs_pytorch._ROUNDS.value} rounds (range)')
  print('| kind | setting | step | tokens/s | wall | peak resident memory | final training loss |')
  print('|---|---|---:|---:|---:|---:|---:|')
  summary = {}
  for kind in vs_pytorch._KINDS.value:
    for name in SETTINGS:
      rows = [x for x in runs if x['kind'] == kind and x['setting'] == name]
      col = lambda key, rows=rows: [x[key] for x in rows]
      summary[f'{kind}, {name}'] = {k: statistics.median(col(k)) for k in
                                    ('step_ms', 'tokens_per_s', 'wall_s', 'peak_resident_mib')}
      mib = col('peak_resident_mib')
      print(f"| {kind} | {name} | {statistics.median(col('step_ms')):.1f} ms | "
            f"{statistics.median(col('tokens_per_s')):,.0f} | {statistics.median(col('wall_s')):.1f} s | "
            f"{statistics.median(mib):.0f} MiB ({min(mib):.0f}–{max(mib):.0f}) | "
            f"{', '.join(f'{v:.4f}' for v in col('final_train_loss'))} |")
  result_files.write(_JSON_OUT.value, {'versions': vs_pytorch.versions(), 'steps': vs_pytorch._STEPS.value,
                                       'rounds_run': vs_pytorch._ROUNDS.value, 'summary': summary, 'runs': runs})
  print(f'wrote {_JSON_OUT.value}')


if __name__ == '__main__':
  app.run(main)
