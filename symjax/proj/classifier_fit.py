"""A Transformer Program's classifier fit anew over fewer of its variables, exact on the combinations given.

"Learning Transformer Programs" (§3.4) reads each position's tag off a linear classifier over every variable of
the program: one row of scores per value of each variable, summed, and the highest-scoring tag wins. Its model
learns that classifier by gradient descent, and spreads it over every variable it can. Over the finite set of
combinations the task's inputs reach, a classifier of the same form over far fewer variables may give exactly the
same tags; then every head and MLP that only the dropped variables read leaves the program.

Whether one exists over a set of variables is a linear feasibility problem (``separable``): a score per (variable
value, tag) and per tag (the bias) such that at every combination the tag it has beats every other tag by a
margin of 1. ``sparsest`` drops variables greedily, each one whose removal leaves the problem feasible, and
returns integer scores: exact in any arithmetic, so the program ties nowhere.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import optimize, sparse


@dataclasses.dataclass(frozen=True)
class Fit:
  """The classifier over ``columns`` (of the combinations' columns): ``rows[c]`` ``[values, tags]`` the integer
  scores of column ``c``'s values, in the order of ``values[c]`` (the values reached); ``bias`` ``[tags]``."""

  columns: tuple[int, ...]
  values: dict[int, np.ndarray]
  rows: dict[int, np.ndarray]
  bias: np.ndarray
  unsettled: bool = False   # ``sparsest`` stopped at a program past ``WORK_LIMIT``: more columns might go


def distinct_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The first row of each distinct row of ``values`` ``[rows, columns]`` (ints ≥ 0), and each row's group id
  (equal exactly for equal rows). A row is sorted as one byte string: the positions of a task's every input
  run to millions of rows, which ``np.unique(axis=0)`` sorts many times slower."""
  small = np.ascontiguousarray(values.astype(np.min_scalar_type(max(int(values.max(initial=0)), 1))))
  rows = small.view(np.dtype((np.void, small.shape[1] * small.itemsize)))[:, 0]
  _, first, group = np.unique(rows, return_index=True, return_inverse=True)
  return first, group.reshape(-1)


def decides(values: np.ndarray, tags: np.ndarray) -> bool:
  """Whether the rows of ``values`` ``[combinations, variables]`` determine ``tags``: no two equal rows with
  different tags (a classifier of any form needs it)."""
  if not values.shape[1]:
    return bool((tags == tags[0]).all())
  group = distinct_rows(values)[1]
  first = np.zeros(group.max() + 1 if len(group) else 0, np.int64)
  first[group] = tags
  return bool((first[group] == tags).all())


def _distinct(held: np.ndarray, tags: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """One row of each distinct (values, tag) of ``held`` and ``tags``, the distinct tags, and the index of each
  row's tag among them: a linear program needs each constraint once."""
  rows = distinct_rows(np.column_stack([held, tags]))[0]
  reached, tag_index = np.unique(tags[rows], return_inverse=True)
  return held[rows], reached, tag_index


# The most nonzeros a linear program of ``separable`` may hold: a most_freq classifier's 178 million took the
# decompiler past 20 GiB, killed for memory; the largest of one sort, reverse and double_hist run each: 4, 9
# and 17 million.
LP_LIMIT = 40_000_000
# The most work one linear program may take, in simplex iterations times its nonzeros: far more than any of the
# recipes' runs takes, far less than those of a run that fits its task poorly can, where setting constraints
# aside (``_peeled``) leaves nearly all of them (``benchmarks.speed.classifier_fit`` reports each program's).
WORK_LIMIT = 10_000_000_000


class Unsettled(Exception):
  """A linear program HiGHS did not settle within ``WORK_LIMIT``: whether it has a solution is not known."""


def separable(held: np.ndarray, tags: np.ndarray, n_tags: int, raise_unsettled: bool = False) -> Fit | None:
  """Integer scores over every column of ``held`` ``[rows, columns]`` (ids ≥ 0) and a bias, under which each row's
  tag in ``tags`` (ids < ``n_tags``) scores at least 1 above every other tag; None where none exist, or where the
  program would hold more than ``LP_LIMIT`` nonzeros or take more than ``WORK_LIMIT`` (unsolved, as if none
  existed; past ``WORK_LIMIT`` ``Unsettled`` is raised instead where ``raise_unsettled``).

  The linear program (HiGHS) finds real scores with that margin; scaled by one more than the number of terms a
  score sums and rounded, they keep a margin of at least 1 (each term moves by at most ½). A tag no row has
  scores below every reachable score through its bias alone. The constraints a score of one sign alone can
  meet are set aside first (``_peeled``) and met after the program is solved (``_unpeeled``)."""
  if not decides(held, tags):
    return None
  held, reached, tag_index = _distinct(held, tags)
  nt = len(reached)
  values, features, base = [], [], 0
  for c in range(held.shape[1]):
    v, inverse = np.unique(held[:, c], return_inverse=True)
    values.append(v)
    features.append(base + inverse)
    base += len(v)
  features = np.column_stack(features + [np.full(len(held), base)])   # [rows, terms]: the last is the bias
  terms = features.shape[1]
  n = len(held) * (nt - 1)   # a constraint per row and tag other than its own
  if not n:  # one tag everywhere: every score 0, the other tags below it
    return _integer(np.zeros((base + 1, 1)), values, tag_index, features, reached, n_tags, 1)
  if 2 * n * terms > LP_LIMIT:
    return None
  active, peeled = _peeled(features, tag_index, nt, base + 1)
  try:
    scores = _solved(features, tag_index, nt, base + 1, active)
    if scores is None:   # no solution to a part of the constraints: none to them all
      return None
    fit = _integer(_unpeeled(scores, peeled, features, tag_index), values, tag_index, features, reached, n_tags,
                   terms + 1)
    if fit is None:   # scores pushed too far for exact rounding: the whole program, as it stands
      full = _solved(features, tag_index, nt, base + 1, np.arange(nt)[None] != tag_index[:, None])
      fit = None if full is None else _integer(full, values, tag_index, features, reached, n_tags, terms + 1)
  except Unsettled:
    if raise_unsettled:
      raise
    return None
  return fit


def _solved(features: np.ndarray, tag_index: np.ndarray, nt: int, nf: int, active: np.ndarray) -> np.ndarray | None:
  """Real scores ``[nf, nt]`` under which each ``active[row, tag]`` constraint holds: the row's own tag at least 1
  above that tag; None where HiGHS finds none (infeasible, or not solved). ``Unsettled`` where it stops at
  ``WORK_LIMIT``: its iterations are counted, so where it stops does not hang on the machine's speed."""
  who, against = np.nonzero(active)
  n, terms = len(who), features.shape[1]
  if not n:
    return np.zeros((nf, nt))
  # Row k: Σ_terms (score[f, other] − score[f, own]) ≤ −1, scores flattened as feature · nt + tag.
  cols = np.concatenate([features[who] * nt + tag_index[who, None], features[who] * nt + against[:, None]], 1)
  data = np.concatenate([-np.ones((n, terms)), np.ones((n, terms))], 1)
  a = sparse.csr_matrix((data.ravel(), (np.repeat(np.arange(n), 2 * terms), cols.ravel())), shape=(n, nf * nt))
  found = optimize.linprog(np.zeros(nf * nt), A_ub=a, b_ub=-np.ones(n), bounds=(None, None), method='highs',
                           options={'maxiter': int(np.clip(WORK_LIMIT // a.nnz, 1, np.iinfo(np.int32).max))})
  if found.status == 1:   # the iteration limit
    raise Unsettled(f'a linear program of {a.nnz} nonzeros unsettled after {found.nit} iterations')
  return found.x.reshape(nf, nt) if found.status == 0 else None


def _peeled(features: np.ndarray, tag_index: np.ndarray, nt: int,
            nf: int) -> tuple[np.ndarray, list[tuple[np.ndarray, ...]]]:
  """The constraints left once those a score of one sign alone can meet are set aside, ``active`` ``[rows, nt]``,
  and what was set aside, round by round: (rows, tags, the score meeting each, which scores rise).

  A score (feature f, tag t) that adds to a row's own tag wherever it enters a constraint, and never to its
  rival (every row with f still constrained has tag t), meets all of them by rising far enough, whatever the
  other scores; one that only ever adds to the rival, by falling. Setting its constraints aside leaves a program
  that has a solution exactly where the whole one has, and may free more scores. HiGHS's own presolve finds
  such reductions too, but its return to the whole program then repairs it by simplex for most of the time
  (``benchmarks.speed.classifier_fit``)."""
  terms = features.shape[1]
  active = np.arange(nt)[None] != tag_index[:, None]
  own = features * nt + tag_index[:, None]   # [rows, terms]: the scores each row's every constraint raises
  peeled, none = [], nf * nt
  while True:
    raising = np.bincount(own.ravel(), np.repeat(active.sum(1), terms), minlength=none)
    lowering = sum(np.bincount((features * nt + t).ravel(), np.repeat(active[:, t], terms), minlength=none)
                   for t in range(nt))
    rises, falls = (raising > 0) & (lowering == 0), (lowering > 0) & (raising == 0)
    if not (rises.any() or falls.any()):
      return active, peeled
    # Each constraint set aside is met by the first free score it holds, so the scores are set in reverse:
    # a constraint holds no score freed earlier (it was set aside with it) nor one before its own in the order.
    first_own = np.where(rises[own], own, none).min(1)
    who, tag, by = [], [], []
    for t in range(nt):
      score = np.minimum(first_own, np.where(falls[features * nt + t], features * nt + t, none).min(1))
      hit = np.nonzero(active[:, t] & (score < none))[0]
      who.append(hit)
      tag.append(np.full(len(hit), t))
      by.append(score[hit])
      active[hit, t] = False
    peeled.append((np.concatenate(who), np.concatenate(tag), np.concatenate(by), rises))


def _unpeeled(scores: np.ndarray, peeled: list[tuple[np.ndarray, ...]], features: np.ndarray,
              tag_index: np.ndarray) -> np.ndarray:
  """``scores`` of the program ``_peeled`` left, with each score set aside moved (in reverse) just far enough
  that its constraints hold."""
  scores = scores.copy()
  nt = scores.shape[1]
  for who, tag, by, rises in reversed(peeled):
    for score in np.unique(by)[::-1]:
      mine = by == score
      rows = who[mine]
      total = scores[features[rows]].sum(1)   # [rows, tags]
      need = (total[np.arange(len(rows)), tag[mine]] - total[np.arange(len(rows)), tag_index[rows]] + 1).max()
      scores[score // nt, score % nt] += max(need, 0.0) if rises[score] else -max(need, 0.0)
  return scores


def _integer(scores: np.ndarray, values: list[np.ndarray], tag_index: np.ndarray, features: np.ndarray,
             reached: np.ndarray, n_tags: int, scale: int) -> Fit | None:
  """The real ``scores`` ``[features, reached tags]`` scaled and rounded, checked exactly, spread over every tag."""
  whole = np.rint(scores * scale).astype(np.int64)
  total = whole[features].sum(1)   # [rows, reached tags]
  own = total[np.arange(len(total)), tag_index]
  rival = np.where(np.arange(len(reached))[None] == tag_index[:, None], np.iinfo(np.int64).min, total).max(1)
  if len(reached) > 1 and not (own > rival).all():   # a solver's tolerance the rounding did not absorb
    return None
  full = np.zeros((len(whole), n_tags), np.int64)
  full[:, reached] = whole
  unreached = np.setdiff1d(np.arange(n_tags), reached)
  full[-1, unreached] = -np.abs(whole).sum() - 1   # below every score a row can reach
  offsets = np.cumsum([0] + [len(v) for v in values])
  return Fit(tuple(range(len(values))), dict(enumerate(values)),
             {c: full[offsets[c]:offsets[c + 1]] for c in range(len(values))}, full[-1])


def sparsest(held: np.ndarray, tags: np.ndarray, n_tags: int, order: list[int]) -> Fit | None:
  """The classifier over the fewest columns of ``held`` that ``separable`` finds, dropping the columns of ``order``
  one at a time, each where the rest stay separable; None where not one can go (the classifier stays as it
  was). ``columns`` and the keys of ``values`` and ``rows`` index ``held``'s columns.

  A block of ``order`` is tried at once first, then each half where it cannot go: whatever can be left out with
  more columns out can be left out with fewer, so this drops what one at a time would, in far fewer programs
  (and those over few columns are the fast ones).

  The search stops at the first program HiGHS does not settle within ``WORK_LIMIT`` (``unsettled`` on the fit
  found so far; ``Unsettled`` raised where none was): one such program is rarely alone, and each takes the limit.
  """
  kept, best = list(range(held.shape[1])), None

  def drop(block: list[int]) -> None:
    nonlocal kept, best
    trial = [k for k in kept if k not in block]
    # Rows that do not decide the tags settle it without a program.
    fit = separable(held[:, trial], tags, n_tags, raise_unsettled=True)
    if fit is not None:
      kept, best = trial, fit
    elif len(block) > 1:
      drop(block[:len(block) // 2])
      drop(block[len(block) // 2:])

  try:
    drop(list(order))
    unsettled = False
  except Unsettled:
    if best is None:
      raise
    unsettled = True
  if best is None:
    return None
  return Fit(tuple(kept), {kept[i]: v for i, v in best.values.items()},
             {kept[i]: r for i, r in best.rows.items()}, best.bias, unsettled)


@dataclasses.dataclass(frozen=True)
class Affine:
  """A classifier whose score of each tag is affine in the numbers: ``weights[c]`` ``[tags]`` the whole multiple of
  column ``c``'s value each tag adds (a number: a count or a position), ``rows[c]`` ``[values, tags]`` the score
  of each value of column ``c`` in the order of ``values[c]`` (any other column, read by value); ``bias``
  ``[tags]``; ``tags`` the tag ids scored, those the combinations have."""

  tags: np.ndarray
  bias: np.ndarray
  weights: dict[int, np.ndarray]
  values: dict[int, np.ndarray]
  rows: dict[int, np.ndarray]


# The largest whole multiple ``affine`` scales a solution by before it takes the one rounding cannot break.
SMALL_SCALE = 12
# The most nonzeros a linear program of ``affine`` may hold. Scores are written in the code only at up to 64
# entries, over few variables; a program this large comes from a classifier over many variables or values,
# which scores that short rarely tag (dyck1's over a dozen variables: none), and solving it would add seconds
# to minutes to every decompile.
AFFINE_LIMIT = 4_000_000


def affine(held: np.ndarray, tags: np.ndarray, numbers: list[bool]) -> Affine | None:
  """Integer scores under which each row of ``held`` ``[rows, columns]`` gives its tag by a margin of at least 1,
  each tag's score a whole multiple of each number column's value (``numbers[c]``) plus a score per value of
  each other column and a bias; None where none exist, or above ``AFFINE_LIMIT`` nonzeros.

  "Learning Transformer Programs" (§3.4) scores a tag by a row per value of each variable: a count of up to 16
  values takes 16 rows. Where the tags are regions of the counts cut by hyperplanes (sort's tag is the first
  token whose count of smaller tokens reaches the position), one weight per count does, and the classifier fits
  in a few lines of code. The linear program (HiGHS) minimises the scores' total magnitude, so that the
  smallest multiple that keeps every margin once rounded is small."""
  if not decides(held, tags):
    return None
  held, reached, tag_index = _distinct(held, tags)
  nt = len(reached)
  if nt < 2:
    return None
  values = {c: np.unique(held[:, c]) for c in range(held.shape[1]) if not numbers[c]}
  terms = 1 + sum(1 if numbers[c] else len(values[c]) for c in range(held.shape[1]))   # the last is the bias
  n = len(held) * (nt - 1)   # a constraint per row and tag other than its own
  if 2 * n * terms > AFFINE_LIMIT:
    return None
  features = np.column_stack([held[:, c:c + 1].astype(np.float64) if numbers[c] else
                              np.eye(len(values[c]))[np.searchsorted(values[c], held[:, c])]
                              for c in range(held.shape[1])] + [np.ones((len(held), 1))])   # [rows, terms]
  who = np.concatenate([np.nonzero(tag_index != t)[0] for t in range(nt)])
  against = np.concatenate([np.full(int((tag_index != t).sum()), t) for t in range(nt)])
  # Row k: Σ_terms feature · (score[term, other] − score[term, own]) ≤ −1; the scores are split into positive and
  # negative parts, whose sum the program minimises.
  cols = np.concatenate([np.arange(terms)[None] * nt + tag_index[who, None],
                         np.arange(terms)[None] * nt + against[:, None]], 1)
  data = np.concatenate([-features[who], features[who]], 1)
  a = sparse.csr_matrix((data.ravel(), (np.repeat(np.arange(n), 2 * terms), cols.ravel())), shape=(n, terms * nt))
  found = optimize.linprog(np.ones(2 * terms * nt), A_ub=sparse.hstack([a, -a]), b_ub=-np.ones(n),
                           bounds=(0, None), method='highs')
  if found.status != 0:
    return None
  real = (found.x[:terms * nt] - found.x[terms * nt:]).reshape(terms, nt)
  for scale in [*range(1, SMALL_SCALE + 1), 1 + int(np.abs(features).max(0).sum())]:
    whole = np.rint(real * scale).astype(np.int64)
    total = features.astype(np.int64) @ whole   # [rows, tags]
    own = total[np.arange(len(total)), tag_index]
    rival = np.where(np.arange(nt)[None] == tag_index[:, None], np.iinfo(np.int64).min, total).max(1)
    if (own > rival).all():
      break
  else:
    return None
  weights, rows_of, at = {}, {}, 0
  for c in range(held.shape[1]):
    width = 1 if numbers[c] else len(values[c])
    (weights if numbers[c] else rows_of)[c] = whole[at] if numbers[c] else whole[at:at + width]
    at += width
  return Affine(reached, whole[-1], weights, values, rows_of)
