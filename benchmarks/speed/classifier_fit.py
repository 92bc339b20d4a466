"""Where the decompiler's classifier fit spends its time, and what other ways of solving its linear programs cost.

  python -m benchmarks.speed.classifier_fit --runs=RUN,RUN,... [--noways]
      [--json=benchmarks/results/classifier_fit.json]

``program_code.refit`` fits a Transformer Program's classifier anew over fewer variables: ``classifier_fit.sparsest``
drops variables while a linear program (``classifier_fit.separable``, HiGHS through SciPy) still finds integer
scores that give every tagged position of every input its tag. For each run this script takes the inputs ``refit``
hands ``sparsest`` (the decompile is run up to that call), times ``sparsest`` as the decompiler runs it, each
linear program apart, then solves the largest program that has a solution again in other ways: as the decompiler
does (the constraints one score meets set aside first, ``classifier_fit._peeled``), and whole, with HiGHS's dual
simplex (the decompiler before the constraints were set aside), its interior point method, its dual simplex
without presolve, and scores bounded to ±100 (a bounded program that has a solution is one of the unbounded one;
the unbounded one is still needed to show that none exists). Each way answers the same question; only the
seconds differ. Each program's work (HiGHS's iterations times the program's nonzeros) is reported beside
``classifier_fit.WORK_LIMIT``, past which the decompiler stops a program and its search.
"""

from __future__ import annotations

import time

import numpy as np
from absl import app, flags
from scipy import optimize

from benchmarks.lib import results as result_files

_RUNS = flags.DEFINE_list('runs', None, 'Run folders of model kind program on an enumerable task.', required=True)
_JSON = flags.DEFINE_string('json', 'benchmarks/results/classifier_fit.json', 'Output JSON.')
_WAYS = flags.DEFINE_bool('ways', True, 'Solve each run\'s largest program with a solution again every way.')

# The ways of solving one program: whether the constraints one score meets are set aside first, keyword arguments
# of scipy.optimize.linprog, and a bound on every score.
WAYS = {'set aside first (the decompiler)': (True, {'method': 'highs'}, None),
        'whole, highs': (False, {'method': 'highs'}, None),
        'whole, interior point (highs-ipm)': (False, {'method': 'highs-ipm'}, None),
        'whole, dual simplex, no presolve': (False, {'method': 'highs-ds', 'options': {'presolve': False}}, None),
        'whole, scores within ±100': (False, {'method': 'highs'}, 100.0)}


class _Captured(Exception):
  pass


def fit_inputs(run: str) -> tuple[np.ndarray, np.ndarray, int, list[int]]:
  """The arguments ``refit`` passes ``classifier_fit.sparsest`` when the run's best checkpoint is decompiled."""
  from symjax.proj import classifier_fit, program_code
  from symjax.run import workdir
  captured, real = {}, classifier_fit.sparsest

  def capture(held, tags, n_tags, order):
    captured.update(held=held, tags=tags, n_tags=n_tags, order=order)
    raise _Captured

  classifier_fit.sparsest = capture
  try:
    program_code.decompile(workdir.load(run, workdir.checkpoint_choice('best', '--which')))
  except _Captured:
    pass
  finally:
    classifier_fit.sparsest = real
  if not captured:
    raise ValueError(f'{run}: the decompiler fits no classifier anew (not enumerable, or under 2 variables)')
  return captured['held'], captured['tags'], captured['n_tags'], captured['order']


def timed_sparsest(held, tags, n_tags, order) -> tuple[dict, list[dict]]:
  """``sparsest`` as the decompiler runs it, with each ``separable`` call's columns, seconds and answer."""
  from symjax.proj import classifier_fit
  calls, real = [], classifier_fit.separable

  def timed(h, t, n, **kwargs):
    start, work[:], fit, settled = time.perf_counter(), [], None, False
    try:
      fit = real(h, t, n, **kwargs)
      settled = True
    finally:
      calls.append({'columns': h.shape[1], 'seconds': time.perf_counter() - start, 'solution': fit is not None,
                    'settled': settled, 'iterations': sum(w[0] for w in work),
                    'work': sum(w[0] * w[1] for w in work)})
    return fit

  def counted(*args, **kwargs):   # each HiGHS call's iterations, nonzeros and status
    found = real_linprog(*args, **kwargs)
    work.append((int(found.nit), int(kwargs['A_ub'].nnz), int(found.status)))
    return found

  work, real_linprog = [], classifier_fit.optimize.linprog
  classifier_fit.separable, classifier_fit.optimize.linprog = timed, counted
  unsettled = False
  try:
    start = time.perf_counter()
    try:
      fit = classifier_fit.sparsest(held, tags, n_tags, order)
    except classifier_fit.Unsettled:
      fit, unsettled = None, True
    total = time.perf_counter() - start
  finally:
    classifier_fit.separable, classifier_fit.optimize.linprog = real, real_linprog
  return {'seconds': total, 'columns': held.shape[1], 'rows': len(held),
          'kept': None if fit is None else len(fit.columns),
          'unsettled': unsettled or (fit is not None and fit.unsettled),
          'largest_work': max((c['work'] for c in calls), default=0), 'work_limit': classifier_fit.WORK_LIMIT}, calls


def solve_way(held, tags, n_tags, peel: bool, linprog_args: dict, bound: float | None) -> dict:
  """``separable`` on ``held``, the constraints one score meets set aside first or not (``peel``), linprog called
  as ``linprog_args`` say, the scores within ``bound``."""
  from symjax.proj import classifier_fit
  real, real_peeled = optimize.linprog, classifier_fit._peeled

  def linprog(c, **kwargs):
    kwargs.update(linprog_args)
    if bound is not None:
      kwargs['bounds'] = (-bound, bound)
    return real(c, **kwargs)

  classifier_fit.optimize.linprog = linprog
  # Every way runs to its answer: the decompiler's limit on one program's work would stop the slow ones.
  limit, classifier_fit.WORK_LIMIT = classifier_fit.WORK_LIMIT, 10**18
  if not peel:
    classifier_fit._peeled = lambda features, tag_index, nt, nf: (np.arange(nt)[None] != tag_index[:, None], [])
  try:
    start = time.perf_counter()
    fit = classifier_fit.separable(held, tags, n_tags)
    return {'seconds': time.perf_counter() - start, 'solution': fit is not None}
  finally:
    classifier_fit.optimize.linprog, classifier_fit._peeled = real, real_peeled
    classifier_fit.WORK_LIMIT = limit


def trial_of(columns: int, tags, n_tags, order, index: int, calls: list[dict]) -> list[int]:
  """The columns ``sparsest`` tried on its call number ``index``, replayed from the recorded answers over a table
  whose every row is the column numbers (no program solved)."""
  from symjax.proj import classifier_fit
  answers, trials, real = iter(calls), [], classifier_fit.separable

  def replay(h, t, n, **kwargs):
    trials.append([int(c) for c in h[0]])
    return classifier_fit.Fit((), {}, {}, np.zeros(n, np.int64)) if next(answers)['solution'] else None

  classifier_fit.separable = replay
  try:
    classifier_fit.sparsest(np.tile(np.arange(columns), (len(tags), 1)), tags, n_tags, order)
  finally:
    classifier_fit.separable = real
  return trials[index]


def main(argv):
  del argv
  per_run = {}
  for run in _RUNS.value:
    held, tags, n_tags, order = fit_inputs(run)
    whole, calls = timed_sparsest(held, tags, n_tags, order)
    print(f'{run}: sparsest {whole["seconds"]:.1f} s over {len(calls)} programs', flush=True)
    per_run[run] = {'sparsest': whole, 'programs': calls}
    solved = [c for c in calls if c['solution']]
    if not (_WAYS.value and solved):
      continue
    # The largest program with a solution, solved again each way: the costly ones are those with a solution.
    largest = max(solved, key=lambda c: c['columns'])
    trial = trial_of(held.shape[1], tags, n_tags, order, calls.index(largest), calls)
    ways = {name: solve_way(held[:, trial], tags, n_tags, *way) for name, way in WAYS.items()}
    for name, got in ways.items():
      print(f'  {name}: {got["seconds"]:.1f} s, {"a solution" if got["solution"] else "none"}', flush=True)
    per_run[run]['largest_with_a_solution'] = {'columns': len(trial), 'ways': ways}
  print('| run | sparsest (s) | programs | of which with a solution (s) | largest work | stopped unsettled | '
        'largest: ' + ' | '.join(WAYS) + ' |')
  print('|---|---:|---:|---:|---:|---|' + '---:|' * len(WAYS))
  for run, r in per_run.items():
    solved = sum(c['seconds'] for c in r['programs'] if c['solution'])
    ways = r.get('largest_with_a_solution', {}).get('ways', {})
    print(f"| {run} | {r['sparsest']['seconds']:.1f} | {len(r['programs'])} | {solved:.1f} | "
          f"{r['sparsest']['largest_work']:.2g} | {'yes' if r['sparsest']['unsettled'] else 'no'} | "
          + ' | '.join(f"{ways[w]['seconds']:.1f}" if w in ways else '—' for w in WAYS) + ' |')
  result_files.write(_JSON.value, {
      'runs': per_run,
      'what': "seconds of the decompiler's classifier fit (classifier_fit.sparsest, as program_code.refit calls "
              'it on the run\'s best checkpoint) and of each linear program it solves (columns: the variables '
              'tried; solution: whether integer scores exist; settled: whether HiGHS settled it within '
              'classifier_fit.WORK_LIMIT; work: simplex iterations times nonzeros); then the largest program that '
              'has a solution '
              'solved again each way: with the constraints one score meets set aside first (the decompiler), or '
              'whole (the decompiler before that) by scipy.optimize.linprog methods and options, or every score '
              'bounded to ±100; every way gives the same answer'
              + ('' if _WAYS.value else ' (not run here: --noways)'),
      'intervals': 'none: one timing each, on one machine; the programs are deterministic'})


if __name__ == '__main__':
  app.run(main)
