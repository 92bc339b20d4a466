"""How near the program of each program-trained Symbolic Transformer comes to a Transformer Program, the form
the simplifier of ``symjax.proj.program_code`` takes (``symjax.proj.program_form``).

  python -m benchmarks.analysis.program_form --runs=DIR,DIR,... [--sample=4000]
      [--json=benchmarks/results/symbolic_program_form.json]

Each run is a program-trained RASP tagging run's work directory (``python -m symjax.main
--config=rasp:task=T,model=symbolic,program=true``; the checkpoint ``symjax.load`` picks). Per run, on
``--sample`` inputs drawn at random from the task's every input (its train and validation inputs where those
cannot be listed): how many heads some predicate over two of the program's variables reproduces exactly, how
often the best such predicate writes the head's token, how many FFN channels two of their variables determine,
and how many variables the tags need; beside the decompiled program's lines and table entries. Per task the
mean and 95% interval over its runs.
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from benchmarks.lib import cli
from benchmarks.lib import results as result_files
from symjax import load, tasks
from symjax.proj import decompile, program_code, program_form
from symjax.train import sweep

_RUNS = flags.DEFINE_list('runs', [], 'Work directories of program-trained Symbolic Transformer runs.')
_SAMPLE = flags.DEFINE_integer('sample', 4000, 'Inputs drawn from the task\'s every input.')
_JSON = cli.json_output('benchmarks/results/symbolic_program_form.json', 'Output ("" prints).')

MEASURES = ('heads', 'heads_exact', 'share', 'ffns', 'ffns_constant', 'ffns_within_two', 'readout_needs', 'lines',
            'table_entries')


def measured(workdir: str, sample: int) -> tuple[str, dict]:
  """The run's task and its measures (``MEASURES``), with every module's own."""
  loaded = load(workdir)
  decompile.check_supported(loaded.model_config, loaded.task)
  task = tasks.get_task(loaded.config)
  inputs, _ = task.input_space()
  inputs = inputs[np.random.default_rng(0).choice(len(inputs), min(sample, len(inputs)), replace=False)]
  lengths = (inputs != task.pad_id).sum(1)
  real = np.arange(inputs.shape[1])[None] < lengths[:, None]
  tagged = real & ~np.isin(inputs, program_code.untagged_tokens(task))
  form = program_form.form_of(loaded.params, loaded.model_config, inputs, lengths, tagged)
  heads = [v for k, v in form.items() if k.startswith('attn')]
  ffns = [v for k, v in form.items() if k.startswith('ffn')]
  program = decompile.decompile(loaded)
  return loaded.task, {
      'heads': len(heads), 'heads_exact': sum(h['exact'] is not None for h in heads),
      'share': 100 * float(np.mean([h['share'] for h in heads])), 'ffns': len(ffns),
      'ffns_constant': sum(f['values'] == 1 for f in ffns), 'ffns_within_two': sum(f['pair'] is not None for f in ffns),
      'readout_needs': len(form['readout']['needs']), 'lines': program.lines, 'table_entries': program.entries,
      'sample': len(inputs), 'step': loaded.step, 'modules': form}


def main(_):
  if not _RUNS.value:
    raise app.UsageError('give --runs=DIR,DIR,...: program-trained Symbolic Transformer runs')
  per_run, by_task = {}, {}
  for workdir in _RUNS.value:
    task, record = measured(workdir, _SAMPLE.value)
    per_run[workdir] = {'task': task, **record}
    by_task.setdefault(task, []).append(record)
  summary = {task: {m: sweep.stat([r[m] for r in records]) for m in MEASURES} for task, records in by_task.items()}
  print('| task | heads exact | best predicate writes the token (%) | FFN channels of two variables '
        '| variables the tags need | lines | table entries |\n|---|---:|---:|---:|---:|---:|---:|')
  for task, s in summary.items():
    print(f"| {task} | {s['heads_exact']['mean']:.1f} of {s['heads']['mean']:.0f} | {s['share']['mean']:.1f} ± "
          f"{s['share']['ci95']:.1f} | {s['ffns_within_two']['mean']:.1f} of {s['ffns']['mean']:.0f} | "
          f"{s['readout_needs']['mean']:.1f} ± {s['readout_needs']['ci95']:.1f} | {s['lines']['mean']:.0f} | "
          f"{s['table_entries']['mean']:,.0f} |")
  if _JSON.value:
    result_files.write(_JSON.value, {
        'what': 'per program-trained Symbolic Transformer run, on a sample of the task\'s every input: heads whose '
                'reads (attending) or selections (counting) a predicate over one query and one key variable of '
                'its program reproduces exactly; the mean share (%) of positions where the commonest such '
                'predicate writes the head\'s token; FFN channels that two variables determine; the variables the '
                'tags need (fewest found by leaving one out after another); the decompiled program\'s lines and '
                'table entries. Per task the mean and 95% t-interval over runs',
        'sample': _SAMPLE.value, 'summary': summary, 'per_run': per_run})


if __name__ == '__main__':
  app.run(main)
