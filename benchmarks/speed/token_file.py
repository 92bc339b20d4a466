"""Training from a memory-mapped token folder against training from the text in memory, side by side.

  python -m benchmarks.speed.token_file --text_path=tinyshakespeare.txt [--steps=300] [--kind=token_factored]

Tokenizes the text once (`symjax.tasks.text.write_token_file`), then trains the same config twice — text
in memory, then `--config.token_path` — and prints for each: training tokens/s (median of the logged
intervals after the first), the time to draw one batch on the host, and whether the two runs' logged
training losses are identical (the same windows for every step). JSON to benchmarks/results/.
"""

import json
import os
import statistics
import sys
import tempfile
import time

from absl import app, flags

from benchmarks.lib import results as result_files
from symjax.tasks import text
from symjax.train import config as config_lib
from symjax.train import trainer as train

_TEXT = flags.DEFINE_string('text_path', '../shared/data/tinyshakespeare.txt', 'A UTF-8 corpus.')
_STEPS = flags.DEFINE_integer('steps', 300, 'Training steps per run.')
_KIND = flags.DEFINE_string('kind', 'token_factored', 'Model kind.')
_JSON = flags.DEFINE_string('json', 'benchmarks/results/token_file.json', 'Where to write the results.')


def run(config, workdir: str) -> dict:
  train.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    records = [r for r in map(json.loads, f) if r['split'] == 'train']
  return {'tokens_per_second': statistics.median(r['tokens_per_second'] for r in records[1:]),
          'losses': [r['loss'] for r in records]}


def batch_seconds(task) -> float:
  start = time.perf_counter()
  for step in range(1000):
    task.batch('train', step, 12, 0)
  return (time.perf_counter() - start) / 1000


def main(_):
  tmp = tempfile.mkdtemp()
  start = time.perf_counter()
  meta = text.write_token_file(_TEXT.value, os.path.join(tmp, 'tokens'))
  tokenize_s = time.perf_counter() - start
  config = config_lib.from_file(f'{_KIND.value}:task=text,size=medium')
  config.total_steps, config.warmup_steps = _STEPS.value, 10
  config.eval_every_steps = config.log_every_steps = max(_STEPS.value // 10, 1)
  config.eval_windows, config.progress_bar = 24, False
  rows = {}
  for name, source in (('in memory', {'text_path': _TEXT.value}), ('memory-mapped', {'token_path': os.path.join(tmp, 'tokens')})):  # noqa: E501
    c = config.copy_and_resolve_references()
    c.text_path, c.token_path = source.get('text_path', ''), source.get('token_path', '')
    result = run(c, os.path.join(tmp, name.replace(' ', '_')))
    task = text.TextTask(c.text_path, c.seq_len, token_path=c.token_path)
    rows[name] = {**result, 'batch_seconds': batch_seconds(task)}
  same = rows['in memory']['losses'] == rows['memory-mapped']['losses']
  print(f'\n{_KIND.value}, text recipe, {_STEPS.value} steps; tokenized {meta["count"]:,} tokens in {tokenize_s:.2f} s')
  print('| source | training tokens/s | one batch on the host |')
  print('|---|---:|---:|')
  for name, r in rows.items():
    print(f"| {name} | {r['tokens_per_second']:,.0f} | {1e6 * r['batch_seconds']:.0f} µs |")
  ratio = rows['memory-mapped']['tokens_per_second'] / rows['in memory']['tokens_per_second']
  print(f'memory-mapped / in memory tokens/s = {ratio:.3f}; logged training losses identical: {same}')
  result_files.write(_JSON.value, {'kind': _KIND.value, 'steps': _STEPS.value, 'tokenize_seconds': tokenize_s, 'meta': meta,  # noqa: E501
               'rows': rows, 'ratio': ratio, 'identical_losses': same,
               'command': 'python -m benchmarks.speed.token_file ' + ' '.join(sys.argv[1:])})
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
