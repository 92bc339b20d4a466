"""Length extrapolation of the default induction models: trained on 10-token sequences, scored on 1×, 2×
and 4× that length, over seeds.

  python -m benchmarks.analysis.length_extrapolation [--kinds=token_factored,symbolic] [--seeds=0,1,2]
      [--runs=/tmp/symjax_extrapolation] [--json=benchmarks/results/induction_length_extrapolation.json]
  python -m benchmarks.analysis.length_extrapolation --workdir=runs/<dir> [--split=test] [--json=PATH]
  python -m benchmarks.analysis.length_extrapolation --cone [--cone_sequences=50]
      [--cone_json=benchmarks/results/stream_cone.json]

Each (kind, seed) is trained by the command a user types (``python -m symjax.main --config=<kind>
--config.seed=<seed>``, the recipe's default task, induction) unless its work directory already holds a
finished run; the checkpoint scored is the one ``symjax.load`` picks (best on validation). The longer
sequences follow the task's own rule (``symjax.tasks.induction``: ``<s>``, letter-number pairs under one
map, then a query letter), with n pairs for length 2n + 2, drawn from a generator of their own; 1× is the
task's test split. Scored: the letters whose tag is a number (the induction copy) and every tagged letter
(``<unk>`` included), and the number tags by the query's position and by how far back the copied number
is. Positions enter only through ALiBi biases, so nothing in the model is sized by the
training length; the standard model's learned position table stops at ``model.max_len`` and is not scored.

With ``--workdir``: one trained tagging run's token accuracy by sequence length and by position on one split
instead, counting only the positions with a target (weight > 0); position j is the j-th such position of a
sequence (for RASP tasks: the j-th content token, after ``<s>``). It prints one row per length and writes the
table as JSON where ``--json`` is given.

With ``--cone``: how close each stream of the same default induction models stays to token mixtures, over
seeds. On the first ``--cone_sequences`` test sequences it measures, for every channel of X_t and X_e after each
block, the cosine between the state and its nearest non-negative combination of that channel's token embeddings
(``interpret.tracing.cone``: 1 inside the vocabulary cone), averaged over positions and heads; and, where the
model is all-symbolic, the exact mixture trace's largest relative reconstruction error
(``interpret.mixtures.reconstruction_errors``; the tests require ≤ 1e-4).
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from benchmarks.lib import cli, default_runs
from benchmarks.lib import results as result_files
from benchmarks.lib.by_length import hits_by_length
from symjax import tasks
from symjax.interpret import core, mixtures, tracing
from symjax.tasks import base, induction
from symjax.train import sweep

_KINDS = cli.kinds(['token_factored', 'symbolic'], 'Model kinds (ALiBi-positioned ones).')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Training seeds (config.seed).')
_FACTORS = flags.DEFINE_list('factors', ['1', '2', '4'], 'Lengths scored, as multiples of the training length.')
_SEQUENCES = flags.DEFINE_integer('sequences', 4000, 'Sequences drawn per longer length.')
_RUNS = flags.DEFINE_string('runs', '/tmp/symjax_extrapolation', 'Where the runs are trained (or found).')
_JSON = cli.json_output('benchmarks/results/induction_length_extrapolation.json', 'Output ("" prints).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'A trained tagging run to score by length and position instead.')
_SPLIT = flags.DEFINE_string('split', 'test', 'The split --workdir is scored on.')
_CONE = flags.DEFINE_bool('cone', False, 'How close the streams stay to token mixtures, instead.')
_CONE_SEQUENCES = flags.DEFINE_integer('cone_sequences', 50, 'Test sequences --cone reads.', lower_bound=1)
_CONE_JSON = flags.DEFINE_string('cone_json', 'benchmarks/results/stream_cone.json', 'Where --cone writes ("" prints).')


def long_sequences(length: int, count: int, seed: int = 1234) -> tuple[np.ndarray, np.ndarray]:
  """``count`` induction sequences of ``length`` tokens (even, ≥ 4): ``<s>``, (length - 2) / 2 pairs under
  one letter -> number map, a query letter; inputs and tags as ids of the task's vocabulary."""
  if length % 2 or length < 4:
    raise ValueError(f'length must be even and at least 4, got {length}')
  vocab = induction.vocab()
  rng = base.rng_for(seed, 'lengths', length)
  inputs, targets = [], []
  for _ in range(count):
    mapping = {letter: induction.NUMBERS[rng.integers(len(induction.NUMBERS))] for letter in induction.LETTERS}
    letters = [induction.LETTERS[i] for i in rng.integers(len(induction.LETTERS), size=(length - 2) // 2)]
    tokens = [base.BOS, *[t for letter in letters for t in (letter, mapping[letter])],
              induction.LETTERS[rng.integers(len(induction.LETTERS))]]
    inputs.append(vocab.encode(tokens))
    targets.append(vocab.encode(induction.tag_sequence(tokens)))
  return np.asarray(inputs, np.int32), np.asarray(targets, np.int32)


def score(run, inputs: np.ndarray, targets: np.ndarray, batch: int = 500) -> dict[str, float]:
  """Accuracy (%) on the letters tagged with a number and on every tagged position."""
  vocab = induction.vocab()
  numbers = np.isin(targets, [vocab.id(n) for n in induction.NUMBERS])
  tagged = targets != vocab.id(base.PAD)
  predictions = np.concatenate([
      np.asarray(run.model.apply({'params': run.params}, inputs[i:i + batch])).argmax(-1)
      for i in range(0, len(inputs), batch)])
  correct = predictions == targets
  # Where the errors are: by the query's position (bands of the training length) and by how far back the
  # number it copies is.
  query = np.broadcast_to(np.arange(inputs.shape[1]), inputs.shape)
  distance = query - induction.source_positions(inputs, vocab).argmax(-1)
  bands = lambda x: {f'{lo}-{hi - 1}': float(100 * correct[numbers & (x >= lo) & (x < hi)].mean())
                     for lo, hi in ((0, 10), (10, 20), (20, 40)) if (numbers & (x >= lo) & (x < hi)).any()}
  return {'number_tags': float(100 * correct[numbers].mean()), 'all_tags': float(100 * correct[tagged].mean()),
          'number_positions': int(numbers.sum()), 'tagged_positions': int(tagged.sum()),
          'number_tags_by_query_position': bands(query), 'number_tags_by_source_distance': bands(distance)}


def by_position(workdir: str, split: str, json_path: str) -> None:
  """A trained tagging run's token accuracy by sequence length and position on ``split`` (``--workdir``)."""
  hits = hits_by_length(workdir, split)
  table = {}
  print(f'{workdir}, split {split}: token accuracy (%) by length and position')
  print('| length | sequences | accuracy | by position |')
  print('|---:|---:|---:|---|')
  for length in sorted(hits):
    rows = hits[length]
    per_position = 100 * rows.mean(0)
    table[length] = {'sequences': len(rows), 'accuracy': float(100 * rows.mean()),
                     'by_position': [float(p) for p in per_position]}
    print(f'| {length} | {len(rows)} | {100 * rows.mean():.1f} | '
          + ' '.join(f'{p:.0f}' for p in per_position) + ' |')
  if json_path:
    result_files.write(json_path, {'workdir': workdir, 'split': split, 'by_length': table})
    print(f'wrote {json_path}')



STREAMS = ('x_t', 'x_e')


def measure(run, inputs: np.ndarray, real: np.ndarray) -> dict:
  """Mean cone cosine per stream after each block over the ``real`` (unpadded) positions, and the mixture
  trace's reconstruction error."""
  cfg = run.model.config
  tr = tracing.trace(run.model, run.params, inputs, key_mask=real, with_cone=False)
  table = core.embedding_table(run.params)
  row = {}
  for stream in STREAMS:
    row[f'cone_cosine_{stream}'] = [
        float(tracing.cone(tr.streams[l][stream], table, cfg.num_heads, cfg.vocab_size)[real].mean())
        for l in range(1, cfg.num_layers + 1)]
  if tr.mixture is not None:
    errors = mixtures.reconstruction_errors(tr.mixture, table, cfg.num_heads)
    row.update({f'reconstruction_error_{s}': max(errors[s]) for s in STREAMS})
  return row


def cone() -> None:
  """``--cone``: the streams' cone cosines and reconstruction errors over seeds."""
  per_run, commands = {}, {}
  for kind in _KINDS.value:
    for seed in map(int, _SEEDS.value):
      commands[f'{kind}/{seed}'], run = default_runs.induction_run(kind, seed, _RUNS.value)
      task = tasks.get_task(run.config)
      inputs = task.data.inputs['test'][:_CONE_SEQUENCES.value]
      per_run.setdefault(kind, {})[str(seed)] = row = {'step': run.step,
                                                       **measure(run, inputs, inputs != task.pad_id)}
      print(kind, seed, row, flush=True)

  summary = {}
  print('\n| kind | stream | block | cone cosine |\n|---|---|---:|---:|')
  for kind, seeds in per_run.items():
    rows = list(seeds.values())
    for stream in STREAMS:
      key = f'cone_cosine_{stream}'
      for l in range(len(rows[0][key])):
        stat = sweep.stat([r[key][l] for r in rows])
        summary.setdefault(kind, {}).setdefault(key, []).append(stat)
        print(f"| {kind} | {stream} | {l} | {stat['mean']:.3f} ± {stat['ci95']:.3f} |")
      if f'reconstruction_error_{stream}' in rows[0]:
        summary[kind][f'reconstruction_error_{stream}_largest'] = max(
            r[f'reconstruction_error_{stream}'] for r in rows)
  if _CONE_JSON.value:
    result_files.write(_CONE_JSON.value, {
        'what': 'mean cosine between each channel state and its nearest non-negative token mixture (1: a '
                'token mixture), after each block (index 0 = block 0), over positions and heads of the first '
                f'{_CONE_SEQUENCES.value} test sequences, default induction jobs, mean and 95% t-interval over '
                'seeds; all-symbolic models also the exact mixture trace\'s largest relative reconstruction '
                'error over blocks',
        'train_commands': commands, 'sequences': _CONE_SEQUENCES.value, 'summary': summary, 'per_seed': per_run})



def main(_):
  if _CONE.value:
    return cone()
  if _WORKDIR.value:
    return by_position(_WORKDIR.value, _SPLIT.value, _JSON.value if _JSON.present else '')
  factors = [int(f) for f in _FACTORS.value]
  per_run, commands = {}, {}
  for kind in _KINDS.value:
    for seed in map(int, _SEEDS.value):
      commands[f'{kind}/{seed}'], run = default_runs.induction_run(kind, seed, _RUNS.value)
      rows = {}
      for factor in factors:
        if factor == 1:
          data = tasks.get_task(run.config).data
          inputs, targets = data.inputs['test'], data.targets['test']
        else:
          inputs, targets = long_sequences(factor * run.seq_len, _SEQUENCES.value)
        rows[f'{factor}x'] = {'length': int(inputs.shape[1]), **score(run, inputs, targets)}
      per_run.setdefault(kind, {})[str(seed)] = {'step': run.step, **rows}
      print(kind, seed, {k: round(v['number_tags'], 2) for k, v in rows.items() if isinstance(v, dict)}, flush=True)

  summary = {}
  print('\n| kind | length | number tags (%) | every tag (%) |\n|---|---:|---:|---:|')
  for kind, seeds in per_run.items():
    for factor in factors:
      key = f'{factor}x'
      number = sweep.stat([s[key]['number_tags'] for s in seeds.values()])
      every = sweep.stat([s[key]['all_tags'] for s in seeds.values()])
      summary.setdefault(kind, {})[key] = {'number_tags': number, 'all_tags': every}
      length = next(iter(seeds.values()))[key]['length']
      print(f"| {kind} | {length} ({key}) | {number['mean']:.2f} ± {number['ci95']:.2f} | "
            f"{every['mean']:.2f} ± {every['ci95']:.2f} |")
  if _JSON.value:
    result_files.write(_JSON.value, {
        'what': 'induction accuracy at 1x, 2x and 4x the training length (10 tokens), default recipes, '
                'mean and 95% t-interval over seeds; 1x is the test split',
        'train_commands': commands, 'sequences_per_longer_length': _SEQUENCES.value,
        'summary': summary, 'per_seed': per_run})


if __name__ == '__main__':
  app.run(main)
