"""The classifier fit anew (symjax.proj.classifier_fit): exact integer scores, and the fewest variables it needs."""

import itertools

import numpy as np
import pytest

from symjax.proj import classifier_fit


def scores(fit: classifier_fit.Fit, held: np.ndarray) -> np.ndarray:
  """The fit's score of every tag at each row of ``held``, summed as the written classifier sums its rows."""
  total = np.broadcast_to(fit.bias, (len(held), len(fit.bias))).copy()
  for c in fit.columns:
    total += fit.rows[c][np.searchsorted(fit.values[c], held[:, c])]
  return total


def margins(fit: classifier_fit.Fit, held: np.ndarray, tags: np.ndarray) -> np.ndarray:
  """How far each row's own tag scores above its best rival under the fit."""
  got = scores(fit, held)
  own = got[np.arange(len(held)), tags]
  got[np.arange(len(held)), tags] = np.iinfo(np.int64).min
  return own - got.max(1)


def every_combination(*sizes: int) -> np.ndarray:
  return np.array(list(itertools.product(*[range(n) for n in sizes])), np.int64)


def test_an_additive_tagging_is_fit_with_integer_scores_that_win_by_at_least_one():
  rng = np.random.default_rng(0)
  held = every_combination(4, 5, 3)
  weights = [rng.normal(size=(n, 6)) for n in (4, 5, 3)]
  tags = sum(w[held[:, c]] for c, w in enumerate(weights)).argmax(-1)
  fit = classifier_fit.separable(held, tags, 6)
  assert fit is not None and fit.columns == (0, 1, 2) and fit.bias.dtype == np.int64
  assert (margins(fit, held, tags) >= 1).all()


def test_a_tag_no_row_has_never_wins():
  held = every_combination(3, 3)
  tags = np.where(held[:, 0] + held[:, 1] >= 2, 1, 3)   # tags 0 and 2 of 4 are never the answer
  fit = classifier_fit.separable(held, tags, 4)
  assert fit is not None
  assert (scores(fit, held).argmax(-1) == tags).all()


def test_exclusive_or_is_no_sum_of_rows_but_its_own_column_is():
  held = every_combination(2, 2)
  xor = held[:, 0] ^ held[:, 1]
  assert classifier_fit.separable(held, xor, 2) is None      # decided by both, separable by neither
  assert classifier_fit.separable(held[:, :1], xor, 2) is None  # not even decided
  with_xor = np.column_stack([held, xor])
  fit = classifier_fit.sparsest(with_xor, xor, 2, order=[0, 1, 2])
  assert fit.columns == (2,) and (scores(fit, with_xor).argmax(-1) == xor).all()


def one_at_a_time(held: np.ndarray, tags: np.ndarray, n_tags: int, order: list[int]) -> tuple[int, ...]:
  """The greedy the blocks of ``sparsest`` shortcut: each column of ``order`` left out where the rest still fit."""
  kept = list(range(held.shape[1]))
  for c in order:
    trial = [k for k in kept if k != c]
    if classifier_fit.separable(held[:, trial], tags, n_tags) is not None:
      kept = trial
  return tuple(kept)


def test_the_blocks_leave_out_what_one_at_a_time_would():
  rng = np.random.default_rng(1)
  for trial in range(4):
    held = rng.integers(0, 4, size=(300, 7))
    held[:, 5] = held[:, 1]                   # a copy of a deciding column
    held[:, 6] = (held[:, 0] + held[:, 2]) % 4   # decides with column 0 what column 2 does
    weights = [rng.normal(size=(4, 5)) for _ in range(3)]
    tags = (weights[0][held[:, 0]] + weights[1][held[:, 1]] + weights[2][held[:, 2]]).argmax(-1)
    order = list(rng.permutation(7))
    fit = classifier_fit.sparsest(held, tags, 5, order)
    assert fit.columns == one_at_a_time(held, tags, 5, order)
    assert len(fit.columns) < 7 and (scores(fit, held).argmax(-1) == tags).all()
    assert 3 not in fit.columns and 4 not in fit.columns   # the noise goes


def test_nothing_to_leave_out_keeps_the_classifier_as_it_was():
  held = every_combination(2, 2)
  tags = held[:, 0] * 2 + held[:, 1]   # four tags, each needing both columns
  assert classifier_fit.sparsest(held, tags, 4, order=[1, 0]) is None


def test_a_program_above_the_limit_is_not_solved_and_fewer_columns_may_still_go(monkeypatch):
  """A linear program of more nonzeros than LP_LIMIT is not built: as if no fit existed. ``sparsest`` then keeps
  trying fewer columns, whose programs are smaller: the copy of a deciding column still goes."""
  held = every_combination(4, 5, 3)
  held = np.column_stack([held, held[:, 1]])
  rng = np.random.default_rng(0)
  weights = [rng.normal(size=(n, 6)) for n in (4, 5, 3)]
  tags = sum(w[held[:, c]] for c, w in enumerate(weights)).argmax(-1)
  reached, rows = len(np.unique(tags)), len(held)
  nonzeros = lambda columns: 2 * rows * (reached - 1) * (columns + 1)   # every row distinct, each against the rest
  assert classifier_fit.separable(held, tags, 6) is not None
  monkeypatch.setattr(classifier_fit, 'LP_LIMIT', nonzeros(4) - 1)
  assert classifier_fit.separable(held, tags, 6) is None
  fit = classifier_fit.sparsest(held, tags, 6, order=[3, 2, 1, 0])
  assert fit is not None and fit.columns == (0, 1, 2)
  assert (scores(fit, held).argmax(-1) == tags).all()


def affine_scores(fit: classifier_fit.Affine, held: np.ndarray) -> np.ndarray:
  """The affine fit's score of each tag it scores at each row of ``held``: whole multiples of the numbers, a row
  per value of the others, and the bias."""
  total = np.broadcast_to(fit.bias, (len(held), len(fit.tags))).copy()
  for c, w in fit.weights.items():
    total += held[:, c:c + 1] * w[None]
  for c, rows in fit.rows.items():
    total += rows[np.searchsorted(fit.values[c], held[:, c])]
  return total


def sort_like(held: np.ndarray) -> np.ndarray:
  """Sorting's tag at a position over symbols a < b < c: the first symbol whose count of symbols at or below it
  reaches the position (columns: position, count of a, count of a or b, the query's symbol)."""
  position, at_most_a, at_most_b = held[:, 0], held[:, 1], held[:, 2]
  return np.where(position <= at_most_a, 0, np.where(position <= at_most_b, 1, 2))


def test_tags_cut_by_comparisons_of_counts_are_scored_by_a_whole_multiple_of_each_count():
  """The tag is the first threshold a position does not pass: a score per tag that grows by a whole multiple of
  the position and of each count gives every row its tag by at least 1, in a few small integers; a symbol read
  by value that changes no tag scores nothing."""
  held = np.array([(p, a, b, s) for b in range(6) for a in range(b + 1) for p in range(1, 6) for s in range(3)],
                  np.int64)
  tags = sort_like(held) + 4   # the ids of the tags, as a vocabulary numbers them
  fit = classifier_fit.affine(held, tags, [True, True, True, False])
  assert fit is not None and list(fit.tags) == [4, 5, 6]
  got = affine_scores(fit, held)
  own = got[np.arange(len(held)), tags - 4]
  got[np.arange(len(held)), tags - 4] = np.iinfo(np.int64).min
  assert (own - got.max(1) >= 1).all()
  assert not fit.rows[3].any()   # the symbol changes no tag: its scores are all 0 at the fewest magnitudes
  assert max(np.abs(w).max() for w in fit.weights.values()) <= 4


def test_tags_no_comparison_of_the_numbers_cuts_have_no_affine_scores():
  """Tag 1 exactly where a count equals 2 and 0 elsewhere, over one number: no score growing by a multiple of
  that number is highest for tag 1 there and lower on both sides; read by value, it is."""
  held = every_combination(5)
  tags = (held[:, 0] == 2).astype(np.int64)
  assert classifier_fit.affine(held, tags, [True]) is None
  by_value = classifier_fit.affine(held, tags, [False])
  assert by_value is not None and (affine_scores(by_value, held).argmax(-1) == tags).all()
  # An interval is a region two comparisons cut: a middle tag between two others is affine in the number.
  middle = np.where(held[:, 0] < 2, 0, np.where(held[:, 0] == 2, 1, 2))
  fit = classifier_fit.affine(held, middle, [True])
  assert fit is not None and (affine_scores(fit, held).argmax(-1) == middle).all()


def test_an_affine_program_above_its_limit_is_not_solved(monkeypatch):
  """Past ``AFFINE_LIMIT`` nonzeros no scores are sought: None, as where none exist."""
  held = np.array([(p, a, b) for b in range(6) for a in range(b + 1) for p in range(1, 6)], np.int64)
  tags = sort_like(held)
  assert classifier_fit.affine(held, tags, [True] * 3) is not None
  monkeypatch.setattr(classifier_fit, 'AFFINE_LIMIT', 2 * len(held) * 2 * 4 - 1)   # rows × 2 rivals × 4 terms
  assert classifier_fit.affine(held, tags, [True] * 3) is None


def test_setting_aside_what_one_score_meets_changes_no_answer(monkeypatch):
  """Constraints a score of one sign alone meets are set aside before the program is solved and met after it:
  whether scores exist is the whole program's answer, and the scores found give every row its tag."""
  rng = np.random.default_rng(2)
  cases = []
  for trial in range(12):
    held = rng.integers(0, 3, size=(60, 3))
    held[held[:, 0] == 0, 1] = 0               # rows with a value only one tag has: their constraints go first
    tags = np.where(held[:, 1] == 0, 2, (held[:, 0] * (trial % 3) + held[:, 2]) % 3)
    cases.append((held, tags))
  peeled = [classifier_fit.separable(held, tags, 3) for held, tags in cases]
  monkeypatch.setattr(classifier_fit, '_peeled', lambda features, tag_index, nt, nf:
                      (np.arange(nt)[None] != tag_index[:, None], []))
  whole = [classifier_fit.separable(held, tags, 3) for held, tags in cases]
  assert [f is None for f in peeled] == [f is None for f in whole]
  assert 0 < sum(f is None for f in whole) < len(cases)   # both answers occur
  for (held, tags), fit in zip(cases, peeled):
    if fit is not None:
      assert (margins(fit, held, tags) >= 1).all()


def test_a_value_only_one_tag_has_sets_its_rows_aside():
  held = every_combination(3, 4)
  tags = np.where(held[:, 0] == 0, 2, (held[:, 0] + held[:, 1]) % 2)   # column 0's value 0: tag 2 alone
  features = np.column_stack([held[:, 0], 3 + held[:, 1], np.full(len(held), 7)])
  active, peeled = classifier_fit._peeled(features, tags, 3, 8)
  assert peeled and not active[held[:, 0] == 0].any()    # every constraint of those rows met by raising one score
  # The other rows keep their constraints between tags 0 and 1, where each value has both; tag 2 no longer
  # occurs there, so lowering its scores meets every constraint against it.
  rest = held[:, 0] != 0
  assert (active[rest] == ((np.arange(3)[None] != tags[rest, None]) & (np.arange(3)[None] != 2))).all()


def test_a_program_past_the_work_limit_is_unsettled_and_stops_the_search_where_it_found_none(monkeypatch):
  """HiGHS stops at ``WORK_LIMIT`` (iterations × nonzeros): ``separable`` then answers None, or raises where asked,
  and ``sparsest`` raises where it had found no fit before that program."""
  rng = np.random.default_rng(0)
  held = every_combination(6, 6, 6)
  weights = [rng.normal(size=(6, 6)) for _ in range(3)]
  tags = sum(w[held[:, c]] for c, w in enumerate(weights)).argmax(-1)
  assert classifier_fit.separable(held, tags, 6) is not None
  monkeypatch.setattr(classifier_fit, 'WORK_LIMIT', 1)   # one iteration, which this program does not settle in
  assert classifier_fit.separable(held, tags, 6) is None
  with pytest.raises(classifier_fit.Unsettled):
    classifier_fit.separable(held, tags, 6, raise_unsettled=True)
  with_copy = np.column_stack([held, held[:, 0]])   # the copy could go, were the program over the rest settled
  with pytest.raises(classifier_fit.Unsettled):
    classifier_fit.sparsest(with_copy, tags, 6, order=[3, 2, 1, 0])


def test_the_search_stops_at_the_first_unsettled_program_and_keeps_the_fit_found_before_it(monkeypatch):
  held = every_combination(4, 5, 3)
  held = np.column_stack([held, held[:, 1]])
  rng = np.random.default_rng(0)
  weights = [rng.normal(size=(n, 6)) for n in (4, 5, 3)]
  tags = sum(w[held[:, c]] for c, w in enumerate(weights)).argmax(-1)
  real, calls, found = classifier_fit.separable, [], []

  def settles_until_a_fit_is_found(h, t, n, raise_unsettled=False):
    calls.append(h.shape[1])
    if found:
      raise classifier_fit.Unsettled('past the limit')
    fit = real(h, t, n)
    found.extend([fit] if fit is not None else [])
    return fit

  monkeypatch.setattr(classifier_fit, 'separable', settles_until_a_fit_is_found)
  fit = classifier_fit.sparsest(held, tags, 6, order=[3, 2, 1, 0])
  assert fit.unsettled and fit.columns == (0, 1, 2)   # the copy went; the search stopped at the next program
  assert calls[-1] < 3 and (scores(fit, held).argmax(-1) == tags).all()
  monkeypatch.setattr(classifier_fit, 'separable', real)
  assert not classifier_fit.sparsest(held, tags, 6, order=[3, 2, 1, 0]).unsettled
