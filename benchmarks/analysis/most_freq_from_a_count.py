"""Most_freq trained from a count of its own tokens: whether the count a ranking needs leads training to it.

  python -m benchmarks.analysis.most_freq_from_a_count --config=rasp:task=most_freq,model=program --config.seed=0
      --config.progress_bar=false --workdir=RUN [--config.model.relaxed=true --config.model.gumbel_scale=0.3
      --config.model.gumbel_scale_end=0.01]

The command of ``symjax.main`` (every flag the same), with one change: the first numerical head of layer 0 starts
counting the keys that hold the query's token (the histogram the published most_freq program ranks by); every
other parameter starts random, and training may move it. Reverse found its length-general program from the count
it needs (``model.position_counts``, ``benchmarks/analysis/reverse_from_its_program.py``); this asks the same of
most_freq. It writes what ``symjax.main`` writes into RUN; score the run on validation (its ``metrics.jsonl``):
the test split is not read.
"""

from __future__ import annotations

import jax.numpy as jnp

from benchmarks.lib import program_start
from symjax.model import transformer_program as tp


def same_token_count(params: dict, cfg) -> dict:
  """``params`` (traced) with the first numerical head of layer 0 counting the keys holding the query's token."""
  card, name = tp.cardinality(cfg), f'attn_0_{cfg.num_heads - cfg.program.numerical_heads}'
  reads = tp.head_reads(cfg, 0, numerical=True)
  tokens = jnp.where(jnp.arange(len(reads)) == reads.index('tokens'), tp.SET_LOGIT, 0.0)
  return {**params, name: {**params[name], 'select_query': tokens, 'select_key': tokens,
                           'predicate': jnp.where(jnp.eye(card, dtype=bool), tp.SET_LOGIT, -tp.SET_LOGIT)}}


if __name__ == '__main__':
  program_start.train_from('most_freq', lambda params, cfg, _: same_token_count(params, cfg))
