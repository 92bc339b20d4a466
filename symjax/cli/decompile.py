"""The decompile command: a trained Symbolic Transformer as a program one can run, with its fidelity.

  python -m symjax.decompile --workdir=W --output=program.py [--which=best] [--split=test]

Writes ``program.py`` (standard library and NumPy only) and its tables beside it (``program.npz``), then
prints on the task's split the program's fidelity to the model (the share of tagged positions where both
predict the same tag), the program's accuracy, the model's accuracy and the program's size; for a RASP task
whose inputs vary in length, the same on 2,000 inputs of uniformly drawn length. Without
``--output`` the program goes to ``<workdir>/program/program.py``, and never over an existing file.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import flags, logging

from symjax.cli import usage
from symjax.system.errors import InputError


def define_flags() -> None:
  """The CLI's flags, defined only when it runs as a program (importing this module defines none)."""
  flags.DEFINE_string('workdir', None, 'Work directory of a trained symbolic run.')
  flags.DEFINE_string('output', '', 'The program file to write (default: <workdir>/program/program.py).')
  flags.DEFINE_string('which', 'best', "Which checkpoint to decompile: 'best', 'latest' or a step number.")
  flags.DEFINE_string('split', 'test', 'The split fidelity and accuracy are measured on.')
  flags.DEFINE_string('json', '', 'Also write the measurements to this JSON file.')
  flags.DEFINE_bool('fit_classifier', True, "Transformer Programs on an enumerable task: fit the classifier anew "
                    "over fewer variables, exact on every input (shorter programs, from linear programs that take "
                    "longest on large classifiers). False keeps the model's classifier, pruned.")


def main():
  f = flags.FLAGS
  from symjax.proj import decompile
  from symjax.run import workdir as rundir
  from symjax.system import files
  path = os.path.abspath(f.output or os.path.join(f.workdir, 'program', 'program.py'))
  decompile.check_output(path, named=bool(f.output))  # before the work, not after
  if f.split not in ('train', 'validation', 'test'):
    raise InputError(f"--split must be one of ['train', 'validation', 'test'], got {f.split!r}")
  with files.refused_leaves_no_folder(os.path.dirname(path)):  # a refused run writes nothing
    usage.check_writable(os.path.dirname(path), '--output', path)
    loaded = rundir.load(f.workdir, rundir.checkpoint_choice(f.which, '--which'))
    start = time.perf_counter()
    data_file = os.path.basename(decompile.data_path(path))
    if loaded.model_config.kind == 'program':
      from symjax.proj import program_code
      program = program_code.decompile(loaded, data_file, f.fit_classifier)
    else:
      program = decompile.decompile(loaded, data_file)
    decompile_seconds = time.perf_counter() - start
    try:
      source, data = decompile.write(program, path)
    except OSError as e:
      raise usage.output_error(path, '--output', e) from None
  warning = decompile.not_exact(loaded.model_config)
  if warning:
    print(warning, file=sys.stderr)
  measured = decompile.evaluate(loaded, decompile.load_program(source), f.split)
  measured.update(lines=program.lines, table_entries=program.entries, program=source, tables=data,
                  workdir=os.path.abspath(f.workdir), step=loaded.step, task=loaded.task,
                  decompile_seconds=decompile_seconds)
  if hasattr(program, 'notes'):  # a Transformer Program's code: what each module kept does, in a sentence
    measured['notes'] = program.notes
    measured['left'] = program.left
    measured['model_lines'] = program.model_lines
  where = f'tables {data}' if data else 'no data file: the classifier is in the code'
  print(f'program: {source} ({program.lines} lines; {where}, {program.entries:,} entries; '
        f'decompiled in {decompile_seconds:.1f} s)')
  print(f"{f.split} split, {measured['positions']:,} tagged positions of {measured['sequences']:,} sequences: "
        f"fidelity {measured['fidelity']:.2f}%, program accuracy {measured['program_accuracy']:.2f}%, "
        f"model accuracy {measured['model_accuracy']:.2f}%")
  print(f"time over the split: program {measured['program_seconds']:.2f} s, model {measured['model_seconds']:.2f} s "
        f"(compiled, warm)")
  uniform = _uniform_lengths(loaded, decompile, source)
  if uniform:
    measured['uniform_lengths'] = uniform
    print(f"inputs of uniformly drawn length, {uniform['positions']:,} tagged positions of {uniform['sequences']:,} "
          f"sequences: fidelity {uniform['fidelity']:.2f}%, program accuracy {uniform['program_accuracy']:.2f}%, "
          f"model accuracy {uniform['model_accuracy']:.2f}%")
  if f.json:
    try:
      files.write_atomically(f.json, json.dumps(measured, indent=1))
    except OSError as e:
      raise usage.output_error(f.json, '--json', e) from None


def _uniform_lengths(loaded, decompile, source: str) -> dict | None:
  """The measurements on inputs of uniformly drawn length (``RaspTask.uniform_length_batches``), where the
  task draws them: the splits hold each input once, so mostly long ones."""
  from symjax import tasks
  batches = getattr(tasks.get_task(loaded.config), 'uniform_length_batches', lambda: [])()
  return decompile.evaluate(loaded, decompile.load_program(source), 'uniform_lengths', batches) if batches else None


def run():
  define_flags()
  usage.run(main, required=['workdir'], errors=(InputError, FileNotFoundError), status=2, verbosity=logging.ERROR)
