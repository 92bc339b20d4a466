"""The first-order-logic next-symbol task: transformers of the three kinds, the LSTM, and the uniform and
n-gram baselines, all scored by the same metric code on the test split.

  python -m benchmarks.suites.fol [--json=fol.json] [--steps=3000] [--workdir=/tmp/fol_bench]

Prints a Markdown table (perplexity, top-1/5/10 accuracy, syntactic validity of 100 sampled formulas,
parameters, training time) and writes JSON.
"""

import json
import os
import time

from absl import app, flags

from benchmarks.lib import cli
from benchmarks.lib import results as result_files

_JSON = cli.json_output('fol.json')
_STEPS = cli.steps(3000, 'Training steps per model.')
_WORKDIR = flags.DEFINE_string('workdir', '/tmp/fol_bench', 'Parent of the runs\' work directories.')
_SAMPLES = flags.DEFINE_integer('samples', 100, 'Sampled formulas per model for validity.')
_ORDER = flags.DEFINE_integer('order', 3, 'n of the n-gram baseline.')


def main(_):
  import symjax
  from symjax import configs
  from symjax.run import sample
  from symjax.tasks import fol
  from symjax.train import baselines
  from symjax.train import trainer as train
  results = json.load(open(_JSON.value)) if os.path.exists(_JSON.value) else {}
  top_ks = (5, 10)
  task = fol.FOLTask()
  row = lambda m, **kw: {'perplexity': m['perplexity'], 'top1': m['accuracy'], 'top5': m['top5_accuracy'],
                         'top10': m['top10_accuracy'], **kw}
  if 'uniform' not in results:
    results['uniform'] = row(baselines.score(baselines.uniform(len(task.vocab)), task, 'test', 64, top_ks),
                             parameters=0, seconds=0.0, valid=None)
  name = f'{_ORDER.value}-gram (Witten-Bell)'
  if name not in results:
    start = time.time()
    weights = task.data.targets['train'] != task.pad_id
    ngram = baselines.NGram(_ORDER.value, len(task.vocab)).fit(task.data.inputs['train'],
                                                                task.data.targets['train'], weights)
    results[name] = row(baselines.score(ngram.log_probs, task, 'test', 64, top_ks), parameters=None,
                        seconds=time.time() - start, valid=None)
  for kind in ('lstm', 'standard', 'token_factored', 'symbolic'):
    if kind in results:
      continue
    config = configs.from_file(f'configs/fol.py:model={kind}')
    config.total_steps = _STEPS.value
    config.progress_bar = False
    workdir = os.path.join(_WORKDIR.value, kind)
    start = time.time()
    final = train.train_and_evaluate(config, workdir)
    seconds = time.time() - start
    loaded = symjax.load(workdir)
    validity = sample.fol_validity(loaded.model, loaded.params, _SAMPLES.value)
    results[kind] = row(final['test'], parameters=symjax.count_params(loaded.model_config), seconds=seconds,
                        valid=validity['valid'])
    result_files.write(_JSON.value, results)
  result_files.write(_JSON.value, results)
  print('| model | parameters | test perplexity | top-1 | top-5 | top-10 | valid samples | training time |')
  print('|---|---:|---:|---:|---:|---:|---:|---:|')
  for model, r in results.items():
    params = '—' if r['parameters'] is None else f"{r['parameters']:,}"
    valid = '—' if r['valid'] is None else f"{100 * r['valid']:.0f}%"
    print(f"| {model} | {params} | {r['perplexity']:.3f} | {100 * r['top1']:.2f}% | {100 * r['top5']:.2f}% | "
          f"{100 * r['top10']:.2f}% | {valid} | {r['seconds']:.0f} s |")
  print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
