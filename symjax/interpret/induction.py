"""The induction circuit of models trained on the in-context learning task (``symjax.tasks.induction``):
find the previous-token and induction heads, knock them out, and compare with what is possible without
them.

Queries are letters seen earlier in the sequence (their tag is the number that followed the earlier
occurrence); the previous-token step acts at numbers that follow a letter. Accuracy is reported over the
queries, over the whole vocabulary and restricted to the four numbers (where chance is 25%), next to
``context_guess_accuracy``: the most frequent number seen so far, the best simple guess that does not
match letters.
"""

from __future__ import annotations

import numpy as np

from symjax.interpret import attribution, circuits, core, interventions
from symjax.system.errors import InputError
from symjax.tasks import induction


def _ids(vocab, symbols) -> list[int]:
  return [vocab.id(s) for s in symbols]


def queries(batch, vocab) -> np.ndarray:
  """``[batch, time]`` bool: positions whose target needs induction."""
  _, q = attribution.induction_truth(batch['inputs'], vocab)
  return q & (batch['weights'] > 0)


@core.takes_hooked_model
def find_circuit(model, params, batch, vocab, share: float = 0.75) -> circuits.Circuit:
  tokens = batch['inputs']
  letters, numbers = _ids(vocab, induction.LETTERS), _ids(vocab, induction.NUMBERS)
  prev_q = np.zeros(tokens.shape, bool)
  prev_q[:, 1:] = np.isin(tokens[:, 1:], numbers) & np.isin(tokens[:, :-1], letters)
  ignore = frozenset(set(range(len(vocab))) - set(letters))
  return circuits.find_induction_circuit(model, params, tokens, batch['key_mask'], ignore, prev_q, share)


def accuracies(logits: np.ndarray, batch, vocab) -> dict[str, float]:
  """Accuracy over the induction queries: argmax over the vocabulary, and over the four numbers only."""
  q = queries(batch, vocab)
  numbers = np.asarray(_ids(vocab, induction.NUMBERS))
  restricted = numbers[logits[..., numbers].argmax(-1)]
  n = max(q.sum(), 1)
  return {'accuracy': float(((logits.argmax(-1) == batch['targets']) & q).sum() / n),
          'numbers_accuracy': float(((restricted == batch['targets']) & q).sum() / n), 'queries': int(q.sum())}


def context_guess_accuracy(batch, vocab) -> float:
  """Accuracy over the queries of guessing the most frequent number so far (ties: the earliest seen)."""
  numbers = set(_ids(vocab, induction.NUMBERS))
  q = queries(batch, vocab)
  hits = 0
  for b, i in zip(*np.nonzero(q)):
    seen = [int(t) for t in batch['inputs'][b, :i] if int(t) in numbers]
    guess = max(seen, key=lambda t: (seen.count(t), -seen.index(t)))
    hits += guess == batch['targets'][b, i]
  return hits / max(q.sum(), 1)


KNOCKOUT_MODES = ('mean', 'zero', 'resample')


@core.takes_hooked_model
def knockouts(model, params, batch, vocab, circuit: circuits.Circuit, mode: str = 'resample'
              ) -> dict[str, dict[str, float]]:
  """Accuracies with nothing ablated, the top induction head, all induction heads, and the previous-token
  heads knocked out. ``mode``: 'resample' (each sequence gets the heads' outputs on the next sequence of
  the batch: same distribution, none of its information), 'mean' (their mean over the batch) or 'zero'."""
  if mode not in KNOCKOUT_MODES:
    raise InputError(f'knockout mode must be one of {list(KNOCKOUT_MODES)}, got {mode!r}')
  kw = {'reference': batch['inputs'], 'reference_mask': batch['key_mask']} if mode == 'mean' else {}
  if mode == 'resample':
    kw = {'source': np.roll(batch['inputs'], 1, axis=0), 'source_mask': np.roll(batch['key_mask'], 1, axis=0)}
  head = lambda lh: interventions.Ablation('head', lh[0], lh[1], mode='patch' if mode == 'resample' else mode)
  name = lambda heads: '+'.join(f'L{l}.H{h}' for l, h in heads)
  cases = {'none': [],
           f'induction head {name([circuit.induction_head])}': [head(circuit.induction_head)],
           f'all induction heads {name(circuit.induction_heads)}': [head(x) for x in circuit.induction_heads],
           f'previous-token heads {name(circuit.previous_token_heads)}':
               [head(x) for x in circuit.previous_token_heads]}
  out = {}
  for case, ablations in cases.items():
    if ablations:
      logits, _ = interventions.run_with(model, params, batch['inputs'], ablations, batch['key_mask'], **kw)
    else:
      logits, _ = core.run(core.analysis_model(model), params, batch['inputs'], batch['key_mask'])
    out[case] = accuracies(logits, batch, vocab)
  return out


def concat(batches) -> dict[str, np.ndarray]:
  """One batch from several (for analyses that want the whole split at once)."""
  batches = list(batches)
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
