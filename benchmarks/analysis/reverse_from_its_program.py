"""Reverse trained from its length-general program, or from its count alone: whether training keeps it, finds it.

  python -m benchmarks.analysis.reverse_from_its_program --config=rasp:task=reverse,model=program --config.seed=0
      --config.progress_bar=false --config.model.position_counts=false --config.model.gumbel_scale=3
      --workdir=RUN [--start=count]

(the reverse recipe before bbcdcca, which starts from position counts with the relaxation at 0.3: give the
temperature to try, 3 or 0.3, and no position counts, as the runs of its results file do).

The command of ``symjax.main`` (every flag the same), with one change: the fresh initialisation holds the program
that reverses every input ("Learning Transformer Programs", Appendix C.3, reports its training misses it, as
symjax's does from a random start): the first numerical head of layer 0 counts the keys at or after the query
(n − i), head 0 of layer 1 reads the position one below that count and copies its token, and the classifier
reads that head alone (the other modules keep their random initialisation; the classifier reads none of them).
Its selections, predicates and classifier rows are set to ±``SCALE``, so the relaxation's samples start on that
program. Before the first step it tags every input right; whether it still does after training is the question
(score the run with ``python -m symjax.decompile --workdir=RUN --json=…``). ``tests/test_transformer_program.py``
sets the same two heads by hand. With ``--start=count`` only the count (n − i) is set and the copy and classifier
start random: whether training finds the rest of the program once the count it needs is there.
(``model.position_counts`` starts three counts of positions, this one among them, on any task, through
``symjax.main`` itself.)
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from absl import flags

from benchmarks.lib import program_start
from symjax.model import transformer_program as tp

SCALE = 10.0  # logits of the chosen selections and predicate rows; the others at −SCALE
_START = flags.DEFINE_enum('start', 'program', ['program', 'count'],
                           'What the initialisation holds: the whole program, or its count (n − i) alone.')


def _choose(among: list, name: str):
  return jnp.asarray(np.where(np.arange(len(among)) == among.index(name), SCALE, 0.0))


def _count_name(cfg) -> str:
  return f'attn_0_{cfg.num_heads - cfg.program.numerical_heads}'


def count_from_end(params: dict, cfg) -> dict:
  """``params`` with the first numerical head of layer 0 counting the keys at or after the query (n − i)."""
  card, count = tp.cardinality(cfg), _count_name(cfg)
  q, k = np.indices((card, card))
  counting = tp.head_reads(cfg, 0, numerical=True)
  return {**params, count: {**params[count], 'select_query': _choose(counting, 'positions'),
                            'select_key': _choose(counting, 'positions'),
                            'predicate': jnp.asarray(np.where(k >= q, SCALE, -SCALE))}}


def general_reverse(params: dict, cfg) -> dict:
  """``params`` (traced) with the length-general reverse program set into its first numerical head of layer 0,
  head 0 of layer 1 and the classifier."""
  card, names = tp.cardinality(cfg), tp.variable_names(cfg)
  count, copy = _count_name(cfg), 'attn_1_0'
  q, k = np.indices((card, card))
  below = tp.variable_names(cfg, 1)
  params = count_from_end(params, cfg)
  params[copy] = {**params[copy], 'select_query': _choose(below, count), 'select_key': _choose(below, 'positions'),
                  'select_value': _choose(below, 'tokens'),
                  'predicate': jnp.asarray(np.where(k == q - 1, SCALE, -SCALE))}
  readout = np.zeros(params['readout'].shape, np.float32)  # the copied token's id is its tag's
  readout[np.arange(cfg.vocab_size), names.index(copy) * card + np.arange(cfg.vocab_size)] = SCALE
  params['readout'] = jnp.asarray(readout)
  return params


if __name__ == '__main__':
  program_start.train_from('reverse', lambda params, cfg, _: (count_from_end if _START.value == 'count' else
                                                              general_reverse)(params, cfg))
