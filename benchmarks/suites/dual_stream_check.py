"""Every variant of ``configs/dual_stream.py`` trains, resumes exactly after a kill and reads through the
interpretability API: the recipe's tiny induction run (40 steps) of each of its 54 combinations of head
mixing, FFN mixing, stream and gate (every third with per-layer supervision, alternately decoding X_t + X_e
and X_e), each

1. trained uninterrupted;
2. trained again in a process killed outright (SIGKILL) when it asks for step 25's batch, then resumed by the
   same call: its final parameters must equal the uninterrupted run's bit for bit;
3. read: ``run_with_cache`` has every site the config names (the gate and per-layer logits where they
   exist), the decomposition's terms through the frozen final norm give the logits, and zeroing a head
   through a hook changes the validation loss.

  python -m benchmarks.suites.dual_stream_check [--json=benchmarks/results/dual_stream_check.json] [--only=REGEX]

The tests check each variant's mathematics against the NumPy transcription; this runs the trainer, which
takes about half a minute per variant.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import tempfile
import textwrap

import jax
import numpy as np
from absl import app, flags

import symjax
import symjax.configs as configs
from benchmarks.lib import cli, results
from symjax import interpret
from symjax.interpret import core, decomposition
from symjax.train import trainer

_JSON = cli.json_output('benchmarks/results/dual_stream_check.json')
_ONLY = flags.DEFINE_string('only', '', 'Check only the variants whose name matches this regular expression.')

KILL_AT = 25
KILLED = textwrap.dedent(f"""
    import os, signal, sys
    from symjax.tasks import base
    batch = base.FixedSetTask.batch
    def killing_batch(self, split, step, *args):
      if split == 'train' and step == {KILL_AT}:
        os.kill(os.getpid(), signal.SIGKILL)
      return batch(self, split, step, *args)
    base.FixedSetTask.batch = killing_batch
    from benchmarks.suites.dual_stream_check import config
    from symjax.train import trainer
    trainer.train_and_evaluate(config(sys.argv[1], sys.argv[2]), sys.argv[3])
""")


def variants() -> list[str]:
  names = [f'{a}-{f}_{s}{g}' for a, f, s, g in itertools.product(('dns', 'ind', 'kron'), ('dns', 'ind'),
                                                                   ('T', 'C', 'S'), ('', '_G', '_Gs'))]
  return [n + ('', '', '_pls', '', '', '_pls_xe')[i % 6] for i, n in enumerate(names)]


def config(variant: str, cache: str):
  """The recipe's tiny induction run of ``variant``: 40 steps, the last two checkpoints kept."""
  c = configs.from_file(f'dual_stream:variant={variant},runlocal=true')
  c.total_steps, c.warmup_steps, c.batch_size, c.keep_checkpoints = 40, 5, 16, 2
  c.progress_bar = False
  c.compilation_cache_dir = cache  # the killed and resumed runs load what the first run compiled
  return c


def check(variant: str, folder: str, cache: str) -> dict:
  whole, killed = os.path.join(folder, 'whole'), os.path.join(folder, 'killed')
  final = trainer.train_and_evaluate(config(variant, cache), whole)
  proc = subprocess.run([sys.executable, '-c', KILLED, variant, cache, killed], capture_output=True, text=True)
  if proc.returncode != -9:
    return {'error': f'the killed run exited {proc.returncode}: {proc.stderr[-500:]}'}
  trainer.train_and_evaluate(config(variant, cache), killed)
  a, b = symjax.load(whole, 'latest'), symjax.load(killed, 'latest')
  differences = [float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                 for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params))]
  cfg = a.model_config
  batch = a.batches('validation', n=1)[0]
  logits, cache_ = interpret.run_with_cache(a.model, a.params, batch['inputs'], key_mask=batch['key_mask'])
  missing = sorted(set(cfg.sites()) - set(cache_.keys()))
  terms = np.stack([t for _, t in decomposition.block_terms(cfg, cache_)])
  scale, beta = decomposition.frozen_norm(cfg, a.params, cache_)
  recomposed = ((scale * core.centre(cfg, terms)).sum(0) + beta) @ core.readout_table(cfg, a.params).T
  base = a.evaluate('validation')['loss']
  ablated = a.evaluate('validation', hooks={'blocks.0.attn.z': interpret.zero_head(0)})['loss']
  return {'validation_accuracy': final['validation']['accuracy'], 'validation_loss': final['validation']['loss'],
          'resumed_equals_uninterrupted': max(differences) == 0.0, 'largest_parameter_difference': max(differences),
          'sites_missing_from_cache': missing,
          'decomposition_error': float(np.max(np.abs(recomposed - np.asarray(logits)))),
          'head_0_0_ablation_effect': ablated - base}


def main(argv):
  del argv
  chosen = [v for v in variants() if re.search(_ONLY.value, v)]
  rows = {}
  with tempfile.TemporaryDirectory() as tmp:
    cache = os.path.join(tmp, 'cache')
    for v in chosen:
      rows[v] = check(v, os.path.join(tmp, v), cache)
      print(v, rows[v], flush=True)
  ok = [v for v, r in rows.items() if r.get('resumed_equals_uninterrupted') and not r['sites_missing_from_cache']
        and r['decomposition_error'] < 1e-4 and r['head_0_0_ablation_effect'] != 0.0]
  record = {'what': 'every dual-stream variant trains (tiny induction, 40 steps), resumes bit for bit after a '
                    f'SIGKILL at step {KILL_AT}, and reads through the interpretability API',
            'variants_checked': len(rows), 'variants_passing': len(ok),
            'failing': sorted(set(rows) - set(ok)), 'rows': rows}
  results.write(_JSON.value, record)
  print(f'{len(ok)} of {len(rows)} variants pass')


if __name__ == '__main__':
  app.run(main)
