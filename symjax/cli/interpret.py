"""The report command: an HTML report of a trained model on one input.

  python -m symjax.report --workdir=/tmp/symbolic --input="<s> a 1 b 2 c 3 d 0 a"

The input is tokenised as the run's task does (space-separated tokens for the built-in tasks, raw text
for character/BPE models); without --input the first test example of the task is used. The report goes
to ``<workdir>/interpret/report.html`` (or --output) and its path is printed.
"""

from __future__ import annotations

import os

from absl import flags, logging

from symjax.cli import usage
from symjax.system.errors import InputError

REPORT_DIR = 'interpret'


def define_flags() -> None:
  """The CLI's flags, defined only when it runs as a program (importing this module defines none)."""
  flags.DEFINE_string('workdir', None, 'Work directory of a training run.')
  flags.DEFINE_string('input', '', 'The input to read; empty: the first test example of the task.')
  flags.DEFINE_string('which', 'best', "Which checkpoint to load: 'best', 'latest' or a step number.")
  flags.DEFINE_string('output', '', 'Where to write the report (default: <workdir>/interpret/report.html).')
  flags.DEFINE_integer('position', -1, 'Position whose prediction is attributed (default: the last).')
  flags.DEFINE_integer('ig_steps', 128, 'Integrated-gradients steps.')


def default_input(loaded) -> list[int]:
  """The first test example of a built-in task, up to its last valid position."""
  from symjax import tasks
  if loaded.task == 'text':
    raise InputError('a text model needs --input (the text to read)')
  task = tasks.get_task(loaded.config)
  batch = next(task.eval_batches('test', 1, loaded.config.seed))
  n = int(batch['key_mask'][0].sum())
  return [int(t) for t in batch['inputs'][0][:n]]


def encode(loaded, text: str) -> list[int]:
  try:
    ids = [int(t) for t in loaded.tokenizer.encode(text)]
  except ValueError as e:  # the tokenizer's own errors too
    raise InputError(f'--input could not be tokenised for task {loaded.task!r}: {e}') from None
  if not ids:
    raise InputError('--input is empty after tokenisation')
  if len(ids) > loaded.model_config.max_len:
    raise InputError(f'--input is {len(ids)} tokens; this model reads at most model.max_len = '
                     f'{loaded.model_config.max_len}')
  return ids


def check_position(ids, position: int) -> None:
  if not -len(ids) <= position < len(ids):
    raise InputError(f'--position {position} is outside the input of {len(ids)} tokens '
                     f'(allowed: {-len(ids)}..{len(ids) - 1})')


def main():
  f = flags.FLAGS
  from symjax import tasks
  from symjax.interpret import induction as induction_tools
  from symjax.interpret import report
  from symjax.run import workdir as rundir
  from symjax.tasks import induction
  path = f.output or os.path.join(f.workdir, REPORT_DIR, 'report.html')
  report.check_report_path(path)  # before the work, not after
  from symjax.system import files
  with files.refused_leaves_no_folder(os.path.dirname(os.path.abspath(path))):  # a refused run writes nothing
    check_writable(path)
    loaded = rundir.load(f.workdir, rundir.checkpoint_choice(f.which, '--which'))
    ids = encode(loaded, f.input) if f.input else default_input(loaded)
    check_position(ids, f.position)
    decode = loaded.tokenizer.decode
    kw = {}
    if loaded.task == 'induction':  # score the heads on the test split, as the benchmark does
      vocab = loaded.tokenizer.vocab
      task = tasks.get_task(loaded.config)
      batch = next(task.eval_batches('test', 500, loaded.config.seed))
      kw = dict(circuit=induction_tools.find_circuit(loaded.model, loaded.params, batch, vocab),
                circuit_source='500 test sequences',
                ignore=frozenset(set(range(len(vocab))) - {vocab.id(s) for s in induction.LETTERS}))
    text = report.build_report(loaded.model, loaded.params, ids, decode,
                               title=f'{loaded.model_config.kind} · {loaded.task} · step {loaded.step}',
                               position=f.position, ig_steps=f.ig_steps, **kw)
    try:
      report.write_report(path, text)
    except OSError as e:
      raise usage.output_error(path, '--output', e) from None
  print(f'report: {os.path.abspath(path)}')


def check_writable(path: str) -> None:
  """The report's folder made and probed before the work."""
  usage.check_writable(os.path.dirname(os.path.abspath(path)), '--output', path)


def run():
  define_flags()
  usage.run(main, required=['workdir'], errors=(InputError, FileNotFoundError, RuntimeError), status=2,
            verbosity=logging.ERROR)
