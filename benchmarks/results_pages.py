"""Writes the docs' data pages from ``benchmarks/results/*.json``, one page per file, so that no table in
the docs is typed by hand from a JSON file.

  python -m benchmarks.results_pages            # writes docs/results/data/<name>.md and its index
  python -m benchmarks.results_pages --check    # exit 1 when a page differs from what would be written

Each page starts with the file's provenance (command, commit, device, date) and renders the rest
generically: scalars as a field table, lists of records and maps of records as tables (a mean ± 95%
interval record as one cell), anything deeper under a heading of its key. It also rewrites the generated
tables of README.md and docs/performance.md (``GENERATED``, between ``<!-- results:NAME start/end -->`` markers),
and the snippets a page includes whole (``SNIPPETS``: ``--8<-- "PATH"``), so that a long generated block does not
make its guide long. It writes the API reference, ``docs/api.md`` and ``docs/api/``, from the code's signatures
and docstrings (``benchmarks/lib/api_page.py``), and the source the config guide shows whole. CI runs ``--check``.
"""

from __future__ import annotations

import argparse
import glob
import html
import json
import os
import re
import sys
from typing import Any

from benchmarks.lib import api_page

RESULTS = 'benchmarks/results'
PAGES = 'docs/results/data'
PROVENANCE = ('command', 'commit', 'recorded_in', 'device', 'cpu', 'cpu_id', 'cores', 'date', 'provenance')
MAX_ROWS = 60
MAX_LIST = 12


def _cell(v: Any) -> str:
  if isinstance(v, dict) and 'mean' in v:
    text = _number(v['mean'])
    if v.get('ci95') is not None:
      half = v['ci95'] if not isinstance(v['ci95'], list) else (v['ci95'][1] - v['ci95'][0]) / 2
      text += f' ± {_number(half)}'
    if v.get('n') is not None:
      text += f" (n={v['n']})"
    return text
  if isinstance(v, float):
    return _number(v)
  if isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v):
    shown = ', '.join(_cell(x) for x in v[:MAX_LIST])
    return f'[{shown}{", …" if len(v) > MAX_LIST else ""}]' + (f' ({len(v)} values)' if len(v) > MAX_LIST else '')
  if isinstance(v, (dict, list)):
    return f'({type(v).__name__} of {len(v)})'
  return _text(v)


def _text(s: Any) -> str:
  """Text as Markdown shows it, in a table cell or a heading: a pipe would end the cell, and brackets such as
  "[--batch=16] [--profile_dir=DIR]" would read as a link reference. Values and keys alike pass through here."""
  return str(s).replace('|', '\\|').replace('[', '\\[').replace(']', '\\]').replace('\n', ' ')


def _number(x: Any) -> str:
  if isinstance(x, float):
    return f'{x:.6g}'
  return str(x)


def _flat(record: dict) -> dict:
  """One level of nesting flattened into dotted keys; stat records stay whole."""
  out = {}
  for k, v in record.items():
    if isinstance(v, dict) and 'mean' not in v and all(not isinstance(x, (dict, list)) or
                                                      (isinstance(x, dict) and 'mean' in x) for x in v.values()):
      out.update({f'{k}.{kk}': vv for kk, vv in v.items()})
    else:
      out[k] = v
  return out


def _is_table(rows: list) -> bool:
  return bool(rows) and all(isinstance(r, dict) and 'mean' not in r for r in rows)


def _table(rows: list[dict], first: list[str] | None = None) -> list[str]:
  flat = [_flat(r) for r in rows]
  columns = []
  for r in flat:
    columns += [k for k in r if k not in columns and k != '__key__' and not (isinstance(r[k], (dict, list)) and
                                                          not (isinstance(r[k], dict) and 'mean' in r[k]) and
                                                          not (isinstance(r[k], list) and len(r[k]) <= MAX_LIST))]
  columns = columns[:14]
  header = (first or []) + columns
  lines = ['| ' + ' | '.join(_text(h) for h in header) + ' |', '|' + '---|' * len(header)]
  for i, r in enumerate(flat[:MAX_ROWS]):
    lead = [_text(rows[i]['__key__'])] if first else []
    lines.append('| ' + ' | '.join([*lead, *(_cell(r.get(c, '')) for c in columns)]) + ' |')
  if len(rows) > MAX_ROWS:
    lines.append(f'\n{len(rows) - MAX_ROWS} more rows in the JSON file.')
  return lines


def render(value: Any, level: int) -> list[str]:
  heading = '#' * min(level, 6)
  if isinstance(value, list):
    if _is_table(value):
      return _table(value)
    return [_cell(value)]
  if not isinstance(value, dict):
    return [_cell(value)]
  out = []
  scalars = {k: v for k, v in value.items() if not isinstance(v, (dict, list)) or
             (isinstance(v, dict) and 'mean' in v) or (isinstance(v, list) and not _is_table(v)
                                                      and all(not isinstance(x, (dict, list)) for x in v))}
  if scalars:
    out += ['| field | value |', '|---|---|'] + [f'| {_text(k)} | {_cell(v)} |' for k, v in scalars.items()] + ['']
  rest = {k: v for k, v in value.items() if k not in scalars}
  records = {k: v for k, v in rest.items() if isinstance(v, dict) and 'mean' not in v
             and all(not isinstance(x, (dict, list)) or (isinstance(x, dict) and 'mean' in x)
                     or (isinstance(x, list) and len(x) <= MAX_LIST) for x in v.values())}
  if len(records) >= 2:
    out += _table([{'__key__': k, **v} for k, v in records.items()], first=['key']) + ['']
    rest = {k: v for k, v in rest.items() if k not in records}
  for k, v in rest.items():
    out += [f'{heading} {_text(k)}', ''] + render(v, level + 1) + ['']
  return out


def page(name: str, data: Any) -> str:
  lines = [f'# {name}', '', f'Generated from `{RESULTS}/{name}.json` by `python -m benchmarks.results_pages`; '
           'do not edit.', '']
  if isinstance(data, dict):
    meta = {k: data[k] for k in PROVENANCE if k in data}
    lines += ['| provenance | |', '|---|---|'] + [f'| {k} | {_cell(v)} |' for k, v in meta.items()] + ['']
    data = {k: v for k, v in data.items() if k not in PROVENANCE}
  lines += render(data, 2)
  while lines and lines[-1] == '':
    lines.pop()
  return '\n'.join(lines) + '\n'


def pages() -> dict[str, str]:
  out = {}
  names = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(RESULTS, '*.json')))
  for name in names:
    with open(os.path.join(RESULTS, name + '.json')) as f:
      data = json.load(f)
    out[os.path.join(PAGES, name + '.md')] = page(name, data)
  index = ['# Result files', '', 'Every JSON file under `benchmarks/results/`, rendered. Generated by '
           '`python -m benchmarks.results_pages`; do not edit.', '', '| file | device | date | command |',
           '|---|---|---|---|']
  for name in names:
    with open(os.path.join(RESULTS, name + '.json')) as f:
      d = json.load(f)
    d = d if isinstance(d, dict) else {}
    command = _cell(d.get('command', 'unknown'))
    command = command if len(command) <= 90 else command[:87] + '…'
    index.append(f"| [{name}]({name}.md) | {_cell(d.get('device', 'unknown'))} | {d.get('date', 'unknown')} | "
                 f'`{command}` |')
  out[os.path.join(PAGES, 'index.md')] = '\n'.join(index) + '\n'
  return out


README = 'README.md'


def vs_pytorch_table(data: dict, json_name: str = 'vs_pytorch_cpu', pages: str = 'docs/results/data') -> str:
  """A performance table, from ``json_name``.json (``benchmarks/speed/vs_pytorch.py``).

  Where the run sampled where the machine had put its two cores, a column gives the tokens/s ratio over the
  50-step blocks run with the cores near, the comparison that does not depend on when each program ran."""
  s = data['summary']
  ratio = lambda name, key: f"{s[name]['vs_pytorch'][key]['median']:.2f}×" if 'vs_pytorch' in s[name] else '1'
  near = any(row.get('vs_pytorch', {}).get('tokens_per_s_cores_near') for row in s.values())

  def near_cell(name: str) -> str:
    if not near:
      return ''
    if 'vs_pytorch' not in s[name]:
      return '1 | '
    value = s[name]['vs_pytorch'].get('tokens_per_s_cores_near')
    return f"{value['median']:.2f}× | " if value else '– | '

  lines = [f"{data['cpu']}, {data['cores']} cores, {data['date']}, commit `{data['commit'][:7]}`; the whole "
           f"{data['steps']}-step command, median of {data['rounds_run']} interleaved rounds, ratios to PyTorch "
           f"within a round; a timing of one seed's program, not a trained result, so no seeds or intervals "
           f"([all figures]({pages}/{json_name}.md)):", '',
           '| program | tokens/s | vs PyTorch | ' + ('vs PyTorch, cores near | ' if near else '') +
           'wall time | vs PyTorch | first step, warm cache | peak memory | vs PyTorch |',
           '|---|---:|---:|' + ('---:|' if near else '') + '---:|---:|---:|---:|---:|']
  for name, row in s.items():
    warm = row['seconds_to_first_step_warm']
    lines.append(f"| {'PyTorch (eager, same model)' if name == 'pytorch' else 'symjax ' + name} | "
                 f"{row['tokens_per_s']:,.0f} | {ratio(name, 'tokens_per_s')} | {near_cell(name)}"
                 f"{row['wall_s']:.0f} s | "
                 f"{ratio(name, 'wall_time')} | {'–' if warm is None else f'{warm:.1f} s'} | "
                 f"{row['peak_resident_mib']:.0f} MiB | {ratio(name, 'peak_resident_memory')} |")
  return '\n'.join(lines) + '\n'


def first_step_table(data: dict, json_name: str, pages: str) -> str:
  """The warm first step of each source tree and kind (``first_step_cpu.json``)."""
  trees = list(data['trees'])
  lines = [f"{data['cpu']}, {data['cores']} cores, {data['date']}; seconds from the training command's start to "
           f"its first finished step with a warm compilation cache, median and range of {data['runs']} runs per "
           f"tree, the trees alternated ([all figures]({pages}/{json_name}.md)):", '',
           '| kind | ' + ' | '.join(trees) + ' |', '|---|' + '---:|' * len(trees)]
  for kind, row in data['summary'].items():
    lines.append(f'| {kind} | ' + ' | '.join(f"{row[t]['median_s']:.1f} s ({row[t]['min_s']:.1f}–{row[t]['max_s']:.1f})"
                                             for t in trees) + ' |')
  return '\n'.join(lines) + '\n'


def accelerator_table(data: dict, json_name: str, pages: str) -> str:
  """The standard model's step on a GPU by batch (``benchmarks/speed/accelerator.py``)."""
  lines = [f"{data['device'].split(' (')[0]}, {data['date']}, commit `{data['commit'][:7]}`; each row one timed "
           f"run of {next(iter(data['rows'].values()))['timed_steps']} steps "
           f"([all figures]({pages}/{json_name}.md)):", '',
           '| row | batch | step | tokens/s | MFU | peak memory |', '|---|---:|---:|---:|---:|---:|']
  for name, row in data['rows'].items():
    lines.append(f"| {name.split(' ', 1)[1]} | {row['batch']} | {row['step_s'] * 1e3:.1f} ms | "
                 f"{row['tokens_per_s']:,.0f} | {row['mfu_percent']:.1f}% | "
                 f"{row['peak_bytes_in_use'] / 2**30:.2f} GiB |")
  return '\n'.join(lines) + '\n'


def transformer_lens_table(data: dict, json_name: str, pages: str) -> str:
  """symjax's interpretability workloads against TransformerLens (``benchmarks/speed/vs_transformer_lens.py``)."""
  shape = data['shape']
  lines = [f"{data['cpu']}, {data['cores']} cores, {data['date']}, TransformerLens {data['transformer_lens']}; "
           f"{shape['layers']} layers, {shape['heads']} heads × {shape['head_dim']}, MLP {shape['mlp']}, vocabulary "
           f"{shape['vocab']}, the same weights in both; forward passes on {shape['batch']} × {shape['context']} "
           f"tokens, sweeps on {shape['sweep_batch']} prompt pair(s) of {shape['context']}; one run, warm medians "
           f"of up to {data['repeats']} calls in bursts (a timing of programs, not a trained result: no seeds), "
           f"symjax's first call (compilation included) apart "
           f"([all figures]({pages}/{json_name}.md)):", '',
           '| workload | TransformerLens | symjax | speed-up | symbolic model | speed-up | symjax first call |',
           '|---|---:|---:|---:|---:|---:|---:|']
  for name, row in data['workloads'].items():
    symbolic = (f"{row['symjax_symbolic_s'] * 1e3:,.1f} ms | {row['speedup_symbolic']:.1f}×"
                if row.get('symjax_symbolic_s') is not None else '— | —')  # generation: the standard pair only
    lines.append(f"| {name.replace('_', ' ')} | {row['transformer_lens_s'] * 1e3:,.1f} ms | "
                 f"{row['symjax_s'] * 1e3:,.1f} ms | {row['speedup']:.1f}× | {symbolic} | "
                 f"{row['symjax_first_call_s']:.1f} s |")
  mixed = data.get('interference')
  if mixed:  # runs before the calls were timed in bursts have none
    lines += ['', f"Each library's calls are timed in bursts, after a pause: a forward pass right after one of "
              f"TransformerLens takes symjax {mixed['symjax_after_the_other_s'] * 1e3:.1f} ms against "
              f"{mixed['symjax_s'] * 1e3:.1f} ms back to back (PyTorch's threads still spin), and "
              f"TransformerLens {mixed['transformer_lens_after_the_other_s'] * 1e3:.1f} ms right after symjax's "
              f"against {mixed['transformer_lens_s'] * 1e3:.1f} ms. Those back-to-back passes, timed apart from the "
              f"table in the same run, give a forward ratio of "
              f"{mixed['transformer_lens_s'] / mixed['symjax_s']:.1f}× against the table's "
              f"{data['workloads']['forward']['speedup']:.1f}×: TransformerLens's time moves within a run as well "
              f"as between runs, so read the forward rows' ratios as a range."]
  return '\n'.join(lines) + '\n'


# The rows of a researcher's own code (benchmarks/lib/lens_pair.py), as the Reading page shows them: what the
# call is, and the speed-up it is aimed at.
IDIOMS = (('inline_hook_loss', 'a hook written inline (a new function per call), with the loss', 1.0),
          ('partial_loop_16', 'a loop of 16 head ablations, a new `functools.partial` per call', 1.2),
          ('zero_head_loop_16', 'the same loop with `interpret.zero_head(h)`', 1.2),
          ('hook_sweep_16', 'the same 16 ablations as one `sweep_hooks`', 10.0),
          ('heads_sweep_16_user_metric', 'heads sweep (16 patches), a `jnp` metric', 10.0),
          ('resid_pre_sweep_256_user_metric', 'residual sweep (256 patches), a `jnp` metric', 20.0),
          ('heads_by_position_sweep_1024_user_metric', 'heads × positions (1,024 patches), a `jnp` metric', 20.0),
          ('generate_120', '120 tokens after 4 prompts of 8, key–value caches', 2.0))


def idioms_table(data: dict, json_name: str, pages: str) -> str:
  """A researcher's own code against TransformerLens's (``benchmarks/speed/vs_transformer_lens.py``)."""
  lines = [f"{data['cpu']}, {data['cores']} cores, {data['date']}, TransformerLens {data['transformer_lens']}, the "
           f"same weights; warm medians, symjax's first call (compilation included) apart; a timing of "
           f"programs in one run, not a trained result, so no seeds or intervals "
           f"([all figures]({pages}/{json_name}.md)):", '',
           '| your code | TransformerLens | symjax | speed-up | aimed at | symjax first call |',
           '|---|---:|---:|---:|---:|---:|']
  for name, what, target in IDIOMS:
    row = data['workloads'].get(name)
    if row is None:
      continue
    lines.append(f"| {what} | {row['transformer_lens_s'] * 1e3:,.1f} ms | {row['symjax_s'] * 1e3:,.1f} ms | "
                 f"{row['speedup']:.1f}× | ≥ {target:g}× | {row['symjax_first_call_s']:.1f} s |")
  return '\n'.join(lines) + '\n'


def sweep_starts_table(data: dict, json_name: str, pages: str) -> str:
  """A sweep's first call and warm calls by its number of starts (``benchmarks.speed.vs_transformer_lens --starts``)."""
  buckets = list(next(iter(data['sweeps'].values())))
  lines = [f"{data['cpu']}, {data['cores']} cores, {data['date']}; the sweeps above, each (kind, sweep, starts) in a "
           f"fresh process: its first call (compilation included) and the median of {data['repeats']} warm calls; "
           f"one run, a timing of programs, not a trained result: no seeds "
           f"([all figures]({pages}/{json_name}.md)):", '',
           '| sweep | ' + ' | '.join(f'{b} start{"s" * (b != "1")}: first, warm' for b in buckets) + ' |',
           '|---|' + '---:|' * len(buckets)]
  for name, row in data['sweeps'].items():
    lines.append(f"| {name.replace('/', ': ').replace('_', ' ')} | "
                 + ' | '.join(f"{row[b]['first_call_s']:.1f} s, {row[b]['warm_s'] * 1e3:,.1f} ms" for b in buckets)
                 + ' |')
  return '\n'.join(lines) + '\n'


# "Learning Transformer Programs": test accuracy (Table 1) and lines of its published programs
# (princeton-nlp/TransformerPrograms, programs/rasp/<task>/<task>.py).
PUBLISHED_PROGRAMS = {'reverse': (99.79, 709), 'hist': (100.0, 195), 'double_hist': (98.40, 845),
                      'sort': (99.83, 917), 'most_freq': (75.69, 1230), 'dyck1': (99.30, 1109),
                      'dyck2': (99.09, 1258), 'induction': (100.0, None)}  # §4.1 prints no line count


PUBLISHED_ON_SPLIT = 'published_programs'  # benchmarks.suites.published_programs


def transformer_program_table(data: dict, json_name: str, pages: str) -> str:
  """Per RASP task: the published program against symjax's Transformer Program (``decompile_suite
  --modes=transformer_program``), with the issue's three targets marked, and the published program's accuracy on
  the same test split (``published_programs``)."""
  with open(os.path.join(RESULTS, f'{PUBLISHED_ON_SPLIT}.json')) as f:
    on_split = json.load(f)['on_this_split']
  ms = lambda st, f='{:.2f}': f"{f.format(st['mean'])} ± {f.format(st['ci95'])}"
  lines = [f"{data['cpu']}, {data['cores']} cores, {data['date']}; mean ± 95% interval over seeds "
           f"([per seed]({pages}/{json_name}.md)). ✓: at most 1.5× the published lines, accuracy at or above the "
           f"published one, fidelity 100.00% on every seed. The last column: seconds to tag the test split, the "
           f"program in one NumPy call against the model compiled and warm. \"Train\" is per seed: the sum over its "
           f"initialisations where a seed keeps the best of several on validation, as that paper keeps the best "
           f"of its runs. \"On this split\": the published program run on the same test split as symjax's "
           f"([{PUBLISHED_ON_SPLIT}]({pages}/{PUBLISHED_ON_SPLIT}.md)); the published accuracy is on that paper's own "
           f"data."]
  # Rows a later run of the suite replaced (a task whose recipe changed) say where they were measured.
  for task, where in data.get('rows_from', {}).items():
    lines[0] += f" The {task} row: {where['cpu']}, {where['cores']} cores, {where['date']}, a later run of the suite."
  lines += ['', '| task | published: lines | accuracy | on this split | symjax: lines | classifier entries | accuracy '
           '| fidelity | train | decompile | test split: program / model | seeds |',
           '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  def runs(seeds: dict) -> str:
    """The seeds, and where each kept the best of several initialisations on validation, how many."""
    restarts = sorted({len(r.get('restart_validation_accuracies', ())) or 1 for r in seeds.values()})
    return f'{len(seeds)}' if restarts == [1] else f"{len(seeds)}, each the best of {'/'.join(map(str, restarts))}"

  for task, (accuracy, published_lines) in PUBLISHED_PROGRAMS.items():
    st = data['summary'].get(f'{task}/transformer_program')
    if st is None:
      continue
    seeds = data['per_seed'][f'{task}/transformer_program']
    good = st['program_accuracy']['mean'] >= accuracy
    exact = all(r['fidelity'] == 100.0 for r in seeds.values())
    mark = lambda ok: ' ✓' if ok else ' ✗'
    train = f"{st['train_seconds']['mean'] / 60:.1f} min" if 'train_seconds' in st else '—'
    # Where the paper prints no line count there is no length target to mark.
    published, short = ('—', '') if published_lines is None else (
        f'{published_lines:,}', mark(st['lines']['mean'] <= 1.5 * published_lines))
    here = f"{on_split[task]['accuracy']:.2f}" if task in on_split else '—'
    lines.append(f"| {task} | {published} | {accuracy:.2f} | {here} | {ms(st['lines'], '{:.0f}')}{short} | "
                 f"{st['table_entries']['mean']:,.0f} | {ms(st['program_accuracy'])}{mark(good)} | "
                 f"{ms(st['fidelity'])}{mark(exact)} | {train} | {st['decompile_seconds']['mean']:.1f} s | "
                 f"{st['program_seconds']['mean']:.2f} / {st['model_seconds']['mean']:.2f} s | {runs(seeds)} |")
  return '\n'.join(lines) + '\n'


def readable_programs_table(data: dict, json_name: str, pages: str) -> str:
  """Per RASP task: how readable the Transformer Program kind's decompiled programs are against the targets of
  "Programs that read like their algorithm" (``decompile_suite --modes=transformer_program``, on runs trained by
  today's recipe and decompiled by today's code)."""
  ms = lambda st, f='{:.2f}': f"{f.format(st['mean'])} ± {f.format(st['ci95'])}"
  mark = lambda ok: ' ✓' if ok else ' ✗'
  # A row a later run of the suite replaced says where it comes from (rows_from); its flags are that run's.
  overrides = sorted({part for key, commands in data['commands'].items()
                      if key.split('/')[0] not in data.get('rows_from', {}) for part in commands[0].split()
                      if part.startswith('--config.') and not part.startswith(('--config.seed', '--config.progress'))})
  lines = [f"{data['cpu']}, {data['cores']} cores, {data['date']}; mean ± 95% interval over seeds "
           f"([per seed]({pages}/{json_name}.md))" + (f", trained with {', '.join(f'`{o}`' for o in overrides)}"
                                                        if overrides else '') +
           ". ✓ marks a target met: at most half the published lines; no data file; nothing left that the "
           "simplifier removes (a constant module, a predicate that never holds, a variable equal to an earlier "
           "one up to a renaming); accuracy on inputs of uniformly drawn length within 1 point of the test split's."
           + ''.join(f" The {task} row: {where['cpu']}, {where['cores']} cores, {where['date']}, a later run of the "
                     f"suite at {where['commit'][:7]}." for task, where in data.get('rows_from', {}).items()),
           '', '| task | published lines | symjax lines | of which `run` and decisions | seeds without a data file '
           '| left | test accuracy | uniform lengths | uniform − test |',
           '|---|---:|---:|---:|---:|---:|---:|---:|---:|']
  for task, (_, published_lines) in PUBLISHED_PROGRAMS.items():
    st = data['summary'].get(f'{task}/transformer_program')
    if st is None:
      continue
    seeds = data['per_seed'][f'{task}/transformer_program']
    free = sum(1 for r in seeds.values() if not r['data_file'])
    short = '' if published_lines is None else mark(st['lines']['mean'] <= 0.5 * published_lines)
    left = sum(r['left'] for r in seeds.values())
    uniform = ('—', '—') if 'uniform_minus_test' not in st else (
        ms(st['uniform_length_accuracy']),
        ms(st['uniform_minus_test']) + mark(all(abs(r['uniform_minus_test']) <= 1 for r in seeds.values())))
    if 'uniform_minus_test_at_test_lengths' in st:  # rows decompiled since the accuracy by length was kept
      uniform = (uniform[0], f"{uniform[1]} ({ms(st['uniform_minus_test_at_test_lengths'])} at the test's lengths)")
    lines.append(f"| {task} | {published_lines or '—'} | {ms(st['lines'], '{:.0f}')}{short} | "
                 f"{ms(st['model_lines'], '{:.0f}')} | {free} of {len(seeds)}{mark(free == len(seeds))} | "
                 f"{left}{mark(left == 0)} | "
                 f"{ms(st['program_accuracy'])} | {uniform[0]} | {uniform[1]} |")
  return '\n'.join(lines) + '\n'


def program_form_table(data: dict, json_name: str, pages: str) -> str:
  """Per RASP task: how near the program-trained Symbolic Transformer's program comes to a Transformer Program
  (``benchmarks.analysis.program_form``), beside the Transformer Program kind's lines on the same task."""
  with open(os.path.join(RESULTS, 'transformer_program_counts.json')) as f:
    kind = json.load(f)['summary']
  ms = lambda st, f='{:.1f}': f"{f.format(st['mean'])} ± {f.format(st['ci95'])}"
  lines = [f"{data['cpu']}, {data['cores']} cores, {data['date']}; mean ± 95% interval over runs "
           f"([per run]({pages}/{json_name}.md)), on {data['sample']:,} inputs drawn from each task's every input.",
           '', '| task | runs | lines | table entries | heads a predicate reproduces (all runs) '
           '| tokens the commonest predicate writes (%) | FFN channels two variables determine '
           '| variables the tags need | Transformer Program kind: lines |',
           '|---|---:|---:|---:|---:|---:|---:|---:|---:|']
  for task, st in data['summary'].items():
    runs = [r for r in data['per_run'].values() if r['task'] == task]
    other = kind.get(f'{task}/transformer_program')
    exact, heads = sum(r['heads_exact'] for r in runs), sum(r['heads'] for r in runs)
    lines.append(f"| {task} | {len(runs)} | {ms(st['lines'], '{:.0f}')} | {st['table_entries']['mean']:,.0f} | "
                 f"{exact} of {heads} | {ms(st['share'])} | "
                 f"{st['ffns_within_two']['mean']:.1f} of {st['ffns']['mean']:.0f} | {ms(st['readout_needs'])} | "
                 f"{ms(other['lines'], '{:.0f}') if other else '—'} |")
  return '\n'.join(lines) + '\n'


def transformer_program_example(data: dict, json_name: str, pages: str) -> str:
  """A whole decompiled program with one sentence per module, as "Learning Transformer Programs" shows its."""
  out = [f"The {data['task']} program of seed {data['seed']} (best on validation among the seeds): "
         f"{data['lines']:,} lines, test accuracy {data['program_accuracy']:.2f}%, fidelity "
         f"{data['fidelity']:.2f}% ([provenance]({pages}/{json_name}.md)). Trained by `{data['train_command']}`.",
         '', 'What each head and MLP does:', '']
  out += [f'- {note}' for note in data['notes']]
  # 'py', not 'python': the docs' python blocks are examples the tests run, and this one reads its classifier.
  out += ['', '```py', *data['source'].splitlines(), '```']
  return '\n'.join(out) + '\n'


CIRCUIT_METHODS = (('exact', 'exact edge patching'), ('eap', 'EAP'), ('eap_ig', 'EAP-IG'), ('atp_star', 'AtP*'),
                   ('acdc', 'ACDC'))


def circuits_table(data: dict, json_name: str, pages: str) -> str:
  """Per task and method: circuit discovery against the programs' own circuits (``benchmarks.suites.circuits``)."""
  ms = lambda st, f='{:.2f}': ('—' if st['mean'] != st['mean'] else f"{f.format(st['mean'])} ± {f.format(st['ci95'])}")
  lines = [f"{data['cpu']}, {data['cores']} cores, {data['date']}; mean ± 95% interval over "
           f"{len(next(iter(data['per_seed'].values())))} seeds ([per seed]({pages}/{json_name}.md)); "
           f"{data['examples']} test inputs a run, EAP-IG with {data['ig_steps']} steps, ACDC at threshold "
           f"{data['threshold']}. Precision and recall are those of the top k edges, k the number of true ones "
           "(ACDC: of the set it keeps); faithfulness is that circuit's.", '',
           '| task | true / read / all edges | method | AUROC | precision | recall | faithfulness | Spearman vs exact '
           '| seconds (warm) |', '|---|---|---|---:|---:|---:|---:|---:|---:|']
  for task, summary in data['summary'].items():
    truth = summary['truth']
    edges = (f"{truth['true_edges']['mean']:.0f} / {truth['read_edges']['mean']:.0f} / "
             f"{truth['edges']['mean']:.0f}")
    for i, (method, name) in enumerate(CIRCUIT_METHODS):
      st = summary[method]
      lines.append(f"| {task.split('/')[0] if i == 0 else ''} | {edges if i == 0 else ''} | {name} | "
                   f"{ms(st['auroc'])} | {ms(st['precision'])} | {ms(st['recall'])} | {ms(st['faithfulness'])} | "
                   f"{ms(st['spearman'])} | {ms(st['seconds'], '{:.3f}')} |")
  return '\n'.join(lines) + '\n'


def edges_speed_table(data: dict, json_name: str, pages: str) -> str:
  """Seconds per call of the edge methods on the text recipe's 4-layer model, per kind (``benchmarks.speed.edges``)."""
  methods = (('eap', 'EAP'), ('eap_ig_16', 'EAP-IG, 16 steps'),
             ('eap_ig_16_one_program', 'EAP-IG, the 16 steps in one program'), ('atp_star', 'AtP*'),
             ('exact', 'exact, every edge'), ('acdc', f"ACDC (threshold {data['threshold']})"))
  methods = tuple(m for m in methods if m[0] in next(iter(data['per_kind'].values())))
  lines = [f"{data['cpu']}, {data['cores']} cores, {data['date']}; {data['batch']} prompts of {data['length']} "
           f"tokens, warm (median of {data['repeats']}; exact and ACDC one call), the first call in brackets "
           f"([provenance]({pages}/{json_name}.md)).", '',
           '| kind | edges | ' + ' | '.join(name for _, name in methods) + ' |', '|---|---:|' + '---:|' * len(methods)]
  for kind, r in data['per_kind'].items():
    lines.append(f"| {kind} | {r['edges']} | " + ' | '.join(
        f"{r[m]['seconds']:.3f} s ({r[m]['seconds_first']:.1f} s)" for m, _ in methods) + ' |')
  return '\n'.join(lines) + '\n'


def head_sweep_table(data: dict, json_name: str, pages: str) -> str:
  """A text model's head sweep, exact against each estimate (``benchmarks.analysis.head_sweep``)."""
  ms = lambda st: f"{st['mean']:.2f} ± {st['ci95']:.2f}"
  runs = data['per_run']
  names = {'exact': 'exact', 'atp': 'attribution patching (AtP)', 'atp_star': 'AtP* (GradDrop)',
           'eap_ig': f"EAP-IG, {data['ig_steps']} steps"}
  sites = next(iter(runs.values()))['sites']
  lines = [f"{data['cpu']}, {data['cores']} cores, {data['date']}; {data['kind']}, {len(runs)} runs (seeds), "
           f"{sites} sites each ({data['prompts']} prompts of {data['length']} characters), mean ± 95% interval "
           f"([per run]({pages}/{json_name}.md)). AtP* gives magnitudes and is compared with the exact effects' "
           "magnitudes.", '',
           '| method | Pearson vs exact | Spearman vs exact | runs with the two largest exact effects in its top three '
           '| estimates of the two largest (run 1; exact in brackets) | seconds (warm) |',
           '|---|---:|---:|---:|---|---:|']
  first = next(iter(runs.values()))
  exact = [t['exact'] for t in first['two_largest']]
  for method, st in data['summary'].items():
    estimates = first['per_method'][method]['estimates_of_two_largest']
    pairs = ', '.join(f'{a:+.3f} ({b:+.3f})' for a, b in zip(estimates, exact))
    lines.append(f"| {names.get(method, method)} | {ms(st['pearson'])} | {ms(st['spearman'])} | "
                 f"{st['runs_with_two_largest_in_top_three']} of {len(runs)} | {pairs} | {ms(st['seconds'])} |")
  return '\n'.join(lines) + '\n'


def circuit_figure(data: dict) -> str:
  """An SVG of one run's circuit: its nodes by layer, every edge the model reads drawn as wide as the exact patch's
  effect (square root), the true edges (its decompiled code's) in green, the others grey and dashed."""
  fig = data['figure']
  nodes, layer = fig['nodes'], fig['layer']
  # Columns: the inputs, then each layer's heads and its MLPs apart (an MLP reads its own layer's heads).
  column = [0 if lay < 0 else 2 * lay + 1 if n == 'logits' or n.startswith('a') else 2 * lay + 2
            for n, lay in zip(nodes, layer)]
  columns = sorted(set(column))
  by_column = {c: [n for n, col in zip(nodes, column) if col == c] for c in columns}
  width, height, pad = 130 * len(columns) + 80, 60 * max(len(v) for v in by_column.values()) + 100, 60
  at = {}
  for x, c in enumerate(columns):
    names = by_column[c]
    for y, n in enumerate(names):
      at[n] = (pad + 130 * x, 70 + (height - 110) * (y + 0.5) / len(names))
  strongest = max((abs(e) for _, e, _ in fig['edges']), default=1.0) or 1.0
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
         f'font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>',
         f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="14">{fig["task"]}, seed {fig["seed"]}: '
         f'the edges the model reads, as wide as the exact patch\'s effect</text>',
         f'<text x="{width / 2}" y="40" text-anchor="middle" fill="#2e7d32">green: the decompiled code\'s circuit'
         f'</text>']
  for name, effect, true in sorted(fig['edges'], key=lambda e: (e[2], abs(e[1]))):
    source, rest = name.split('->')
    reader, _, slot = rest.partition('<')
    (x1, y1), (x2, y2) = at[source], at[reader]
    w = 0.6 + 7 * (abs(effect) / strongest) ** 0.5
    colour, dash = ('#2e7d32', '') if true else ('#9e9e9e', ' stroke-dasharray="4 3"')
    bend = (x1 + x2) / 2
    out.append(f'<path d="M{x1 + 28:.0f},{y1:.0f} C{bend:.0f},{y1:.0f} {bend:.0f},{y2:.0f} {x2 - 28:.0f},{y2:.0f}" '
               f'fill="none" stroke="{colour}" stroke-width="{w:.2f}" stroke-opacity="0.8"{dash}>'
               f'<title>{html.escape(name)}: {effect:+.4g}</title></path>')
    if slot:
      slot = slot.rstrip('>')
      offset = {'q': -6, 'k': 3, 'v': 12, 'first': -4, 'second': 10}.get(slot, 0)
      out.append(f'<text x="{x2 - 30:.0f}" y="{y2 + offset:.0f}" text-anchor="end" font-size="9" '
                 f'fill="{colour}">{slot}</text>')
  for n, (x, y) in at.items():
    out.append(f'<rect x="{x - 28:.0f}" y="{y - 13:.0f}" width="56" height="26" rx="5" fill="#e3f2fd" '
               f'stroke="#1565c0"/><text x="{x:.0f}" y="{y + 4:.0f}" text-anchor="middle">{n}</text>')
  return '\n'.join(out + ['</svg>']) + '\n'


def vocab_projection_table(data: dict, json_name: str, pages: str) -> str:
  """The vocabulary projection's memory and time, direct against streamed (``benchmarks/speed/vocab_projection.py``)."""
  gib = lambda b: f'{b / 2**30:.3f} GiB'
  temp, seconds = data['temp_bytes'], data['seconds']
  lines = [f"{data['date']}, {data['device']} ([all figures]({pages}/{json_name}.md)):", '',
           '| projection | vocabulary | temporaries |', '|---|---:|---:|']
  for name, b in temp.items():
    kind, vocab = name.rsplit('_', 1)
    lines.append(f'| {kind} | {int(vocab):,} | {gib(b)} |')
  lines += ['', f"Streamed temporaries are 1/{data['direct_over_streamed']:.0f} of direct and grow by "
            f"{100 * data['streamed_growth_50k_to_200k']:+.1f}% from 50,257 to 200,000. Time at N = "
            f"{data['time_tokens']}, V = {data['time_vocab']:,}: direct {seconds['direct'] * 1e3:.0f} ms, streamed "
            f"{seconds['streamed'] * 1e3:.0f} ms ({data['streamed_over_direct_time']:.2f}× the direct time), the "
            f"streamed one at {data['streamed_flops'] / 1e9:.1f} GFLOP/s counting 14·N·H·V·d, "
            f"{data['streamed_flops_fraction']:.0%} of a 2048² float32 matrix product's "
            f"{data['matmul_flops'] / 1e9:.1f} GFLOP/s in the same run."]
  return '\n'.join(lines) + '\n'


def train_step_table(data: dict, json_name: str, pages: str) -> str:
  """Compiled memory of one training step at the paper's size, every kind (``benchmarks/speed/train_step.py``)."""
  gib = lambda b: b / 2**30
  lines = [f"{data['date']}; {data['layers']} layers, batch 1 × {data['tokens']:,}, |V| = {data['vocab']:,}, float32 "
           f"([all figures]({pages}/{json_name}.md)):", '',
           '| model | parameters | state (args) | temporaries | peak | fits 80 GB |', '|---|---:|---:|---:|---:|:---:|']
  for name, row in data['rows'].items():
    lines.append(f"| {name} | {row['parameters']:,} | {gib(row['argument']):.2f} GiB | {gib(row['temp']):.2f} GiB | "
                 f"{gib(row['peak']):.2f} GiB | {'yes' if row['peak'] <= 80e9 else 'no'} |")
  rows = data['rows']
  streamed, factored = rows['symbolic (streamed projection)'], rows['token_factored']
  direct = rows['symbolic (direct projection)']
  lines += ['', f"The streamed Symbolic Transformer's step needs {data['symbolic_streamed_over_token_factored']:.2f}× "
            f"the Token-Factored one's memory ({gib(streamed['peak']):.2f} vs {gib(factored['peak']):.2f} GiB); the "
            f"direct one needs {gib(direct['peak']):.0f} GiB."]
  return '\n'.join(lines) + '\n'


def default_jobs_table(data: dict, json_name: str, pages: str) -> str:
  """The default job of each kind as a new user runs it (``benchmarks/analysis/default_jobs.py``)."""
  ms = lambda st: f"{st['mean']:.2f} ± {st['ci95']:.2f}%"
  seeds = len(next(iter(data['per_seed'].values())))
  first = next(iter(data['summary'].values()))
  lines = [f"{data['cpu']}, {data['cores']} cores, {data['date']}; {first['steps']} steps, batch "
           f"{first['batch_size']}, one job at a time, each with an empty compilation cache; mean ± 95% interval "
           f"over {seeds} seeds "
           f"([per seed]({pages}/{json_name}.md)):", '',
           '| config | parameters | test token accuracy | test sequence accuracy | wall time |',
           '|---|---:|---:|---:|---:|']
  for kind, row in data['summary'].items():
    wall = row['wall_s']
    lines.append(f"| `configs/{kind}.py` | {row['parameters']:,} | {ms(row['test_token_accuracy'])} | "
                 f"{ms(row['test_sequence_accuracy'])} | {wall['mean']:.0f} s ± {wall['ci95']:.0f} |")
  return '\n'.join(lines) + '\n'


def dual_stream_table(data: dict, json_name: str, pages: str) -> str:
  """The dual-stream family's reproduction on text (``benchmarks/analysis/dual_stream.py``)."""
  pm = lambda st, f='{:.4f}': f"{f.format(st['mean'])} ± {f.format(st['ci95'])}"
  pct = lambda st: f"{100 * (st['mean'] - 1):+.1f}% ± {100 * st['ci95']:.1f}"
  seeds = len(next(iter(data['variants'].values()))['validation_loss']['values'])
  lines = [f"{data['cpu']}, {data['cores']} cores, {data['date']}; mean ± 95% interval over {seeds} seeds, ratios "
           f"taken seed by seed ([per seed]({pages}/{json_name}.md)):", '',
           '| variant | parameters | learning rate | validation loss | test loss |', '|---|---:|---|---:|---:|']
  for name, row in data['variants'].items():
    lines.append(f"| `{name}` | {row['parameters']:,} | {row['point'].removeprefix('learning_rate=')} | "
                 f"{pm(row['validation_loss'])} | {pm(row['test_loss'])} |")
  lines += ['', '| comparison | validation loss, change | the papers (29M parameters) |', '|---|---:|---:|']
  for mixing, row in data['mixing_over_dense'].items():
    lines.append(f"| {mixing} head mixing over dense | {pct(row['validation_loss_ratio'])} | "
                 f"{100 * (row['papers_29M'] - 1):+.1f}% |")
  for stream, row in data['streams_over_token_factored'].items():
    lines.append(f"| {stream} stream over token-factored | {pct(row['validation_loss_ratio'])} | — |")
  pls = data['pls']
  lines.append(f"| per-layer supervision over none | {pct(pls['validation_loss_ratio_with_over_without'])} | — |")
  ablation, times = pls['head_ablation'], lambda st: pm(st, '{:.2f}') + '×'
  without, with_ = ablation['without'], ablation['with']
  lines += ['', '| head ablation: validation loss rise when one head is zeroed | without PLS | with PLS | '
                'with / without | the papers |', '|---|---:|---:|---:|---:|',
            f"| mean over heads of the absolute rise | {pm(without['mean_abs_effect'])} | "
            f"{pm(with_['mean_abs_effect'])} | {times(pls['mean_abs_effect_ratio_with_over_without'])} | "
            f"{pls['papers']} |",
            f"| largest rise | {pm(without['largest_effect'])} | {pm(with_['largest_effect'])} | "
            f"{times(pls['largest_effect_ratio_with_over_without'])} | |"]
  return '\n'.join(lines) + '\n'


def stream_cone_table(data: dict, json_name: str, pages: str) -> str:
  """How close each stream stays to token mixtures (``benchmarks.analysis.length_extrapolation --cone``)."""
  lines = [f"{data['cpu']}, {data['date']}; the default induction jobs: the cosine of each channel state to its "
           f"nearest token mixture, averaged over every position and head of the first {data['sequences']} test "
           f"sequences; mean ± 95% interval over "
           f"{len(next(iter(data['per_seed'].values())))} seeds ([per seed]({pages}/{json_name}.md)):", '']
  summary = data['summary']
  blocks = len(next(iter(summary.values()))['cone_cosine_x_t'])
  lines += ['| kind | ' + ' | '.join(f'{s} after block {l}' for s in ('X_t', 'X_e') for l in range(blocks)) +
            ' | largest reconstruction error (X_t, X_e) |', '|---|' + '---:|' * (2 * blocks + 1)]
  for kind, row in summary.items():
    cells = [f"{st['mean']:.3f} ± {st['ci95']:.3f}" for s in ('x_t', 'x_e') for st in row[f'cone_cosine_{s}']]
    error = (f"{row['reconstruction_error_x_t_largest']:.1e}, {row['reconstruction_error_x_e_largest']:.1e}"
             if 'reconstruction_error_x_t_largest' in row else '—')
    lines.append(f"| {kind} | {' | '.join(cells)} | {error} |")
  return '\n'.join(lines) + '\n'


def quickstart_block(data: dict, json_name: str, pages: str) -> str:
  """The quick start's printed lines (``benchmarks/analysis/default_jobs.py --quickstart``): its start, the
  first step lines, two evaluations and the final table."""
  lines = data['lines']
  evals = [l for l in lines if l.startswith('step ') and ': validation ' in l]
  table = lines[next(i for i, l in enumerate(lines) if l.startswith('final metrics')):]
  shown = [*lines[:4], '...', *evals[:2], '...', *[l for l in table if l.strip()]]
  # No link: the README's block is included in the docs' index too, where a relative link would not resolve.
  return (f"```\n{chr(10).join(shown)}\n```\n\n(One run, seed 0, recorded on {data['cpu']}, {data['cores']} cores, "
          f"{data['date']}, by "
          f"`python -m benchmarks.analysis.default_jobs --quickstart`; the losses of the first evaluations differ "
          f"in their digits between CPU models.)\n")


# Blocks written from result files into each page: (marker name, JSON file, renderer of the JSON, the file's
# name and the data pages' folder as the page links it). The CPU benchmarks have one file per CPU vendor the
# project's machines have had.
CPU_BLOCKS = (('vs-pytorch', 'vs_pytorch_cpu', vs_pytorch_table),
              ('vs-pytorch-amd', 'vs_pytorch_cpu_amd_2026_12_01', vs_pytorch_table))
QUICKSTART = (('quickstart', 'quickstart_output', quickstart_block),)
GENERATED = {
    README: (CPU_BLOCKS + QUICKSTART, 'docs/results/data'),
    'docs/performance.md': (CPU_BLOCKS + (('first-step', 'first_step_cpu', first_step_table),
                                          ('accelerator', 'accelerator_h100_batch64', accelerator_table),
                                          ('vs-transformer-lens', 'vs_transformer_lens_cpu_amd_2026_12_01_run2',
                                           transformer_lens_table),
                                          ('vs-transformer-lens-intel', 'vs_transformer_lens_cpu_intel_one_product_r45',
                                           transformer_lens_table),
                                          ('sweep-starts', 'sweep_starts_cpu_amd_run2', sweep_starts_table)),
                            'results/data'),
    'docs/results/programs_steps.md': ((('readable-programs', 'transformer_program_readable', readable_programs_table),
                                        ('readable-decisions-hist', 'transformer_program_decisions_hist',
                                         readable_programs_table),
                                        ('readable-dyck2', 'transformer_program_readable_dyck2',
                                         readable_programs_table),
                                        ('readable-untagged', 'transformer_program_untagged',
                                         readable_programs_table),
                                        ('readable-reverse-small', 'transformer_program_reverse_small',
                                         readable_programs_table),
                                        ('readable-counts-refit', 'transformer_program_counts_refit',
                                         readable_programs_table),
                                        ('readable-counts-dyck1', 'transformer_program_counts_dyck1',
                                         readable_programs_table),
                                        ('readable-double-hist-balanced', 'transformer_program_double_hist_balanced',
                                         readable_programs_table),
                                        ('readable-readout-sparsity', 'transformer_program_readout_sparsity',
                                         readable_programs_table)),
                                       'data'),
    'docs/results/programs.md': ((('transformer-program', 'transformer_program', transformer_program_table),
                                  ('readable-sort-balanced', 'transformer_program_readable_sort_balanced',
                                   readable_programs_table),
                                  ('readable-counts', 'transformer_program_counts', readable_programs_table),
                                  ('readable-counts-reverse', 'transformer_program_reverse_position_counts',
                                   readable_programs_table),
                                  ('readable-double-hist-small', 'transformer_program_double_hist_small',
                                   readable_programs_table)),
                                 'data'),
    'docs/results/programs_shapes.md': ((('double-hist-recipe', 'transformer_program_double_hist_recipe',
                                          readable_programs_table),), 'data'),
    'docs/results/symbolic_programs.md': ((('program-form', 'symbolic_program_form', program_form_table),), 'data'),
    'docs/scaling.md': ((('vocab-projection', 'vocab_projection', vocab_projection_table),
                         ('train-step', 'train_step', train_step_table)), 'results/data'),
    'docs/reading.md': ((('tl-idioms', 'vs_transformer_lens_cpu_amd_2026_12_01_run2', idioms_table),
                         ('stream-cone', 'stream_cone', stream_cone_table)), 'results/data'),
    'docs/training.md': ((('default-jobs', 'default_jobs', default_jobs_table), *QUICKSTART), 'results/data'),
    'docs/results/dual_stream.md': ((('dual-stream', 'dual_stream_text_cpu', dual_stream_table),), 'data'),
    'docs/results/circuits.md': ((('circuits', 'circuits', circuits_table),
                                  ('circuits-dyck2', 'circuits_dyck2', circuits_table),
                                  ('circuits-symbolic', 'circuits_symbolic', circuits_table),
                                  ('edges-speed', 'edges_speed', edges_speed_table),
                                  ('head-sweep', 'head_sweep_text', head_sweep_table),
                                  ('head-sweep-standard', 'head_sweep_text_standard', head_sweep_table),
                                  ('head-sweep-token-factored', 'head_sweep_text_token_factored', head_sweep_table)),
                                 'data'),
}
# Figures drawn from a JSON file: {the image's path: (the file, its drawing)}.
FIGURES = {'docs/results/circuit_figure.svg': ('circuits', circuit_figure)}
# Files a page includes whole (``--8<-- "PATH"``; mkdocs.yml's ``exclude_docs`` keeps them from being pages of
# their own): their JSON file, its renderer, and the data pages' folder as the including page links it.
SNIPPETS = {
    'docs/results/program_example.md': ('transformer_program_example', transformer_program_example, 'results/data'),
}


def snippets() -> dict[str, str]:
  out = {}
  for path, (name, render_block, pages) in SNIPPETS.items():
    with open(os.path.join(RESULTS, name + '.json')) as f:
      out[path] = (f'<!-- Generated from {RESULTS}/{name}.json by python -m benchmarks.results_pages; '
                   'do not edit. -->\n' + render_block(json.load(f), name, pages))
  return out


def generated(path: str, text: str) -> str:
  """``text`` of the page at ``path`` with every generated block rewritten from its JSON file."""
  blocks, pages = GENERATED[path]
  for marker, name, render_block in blocks:
    start, end = f'<!-- results:{marker} start -->\n', f'<!-- results:{marker} end -->'
    source = os.path.join(RESULTS, name + '.json')
    if start not in text or not os.path.isfile(source):
      continue
    with open(source) as f:
      block = render_block(json.load(f), name, pages)
    head, rest = text.split(start, 1)
    text = head + start + block + end + rest.split(end, 1)[1]
  return text


# Source the docs show in full (the config fields, the recipes), written into the page between
# ``<!-- source:PATH[:SECTION] start/end -->`` markers, so that a page reads the same on GitHub, in a clone
# and on the site; ``--check`` keeps it equal to the source. SECTION is a ``--8<-- [start:SECTION]`` /
# ``[end:SECTION]`` pair of the file. The markers' indentation (a tab of the site) is the block's.
INLINED = ('docs/configs.md',)
_SOURCE = re.compile(r'^( *)<!-- source:(\S+?) start -->\n.*?^\1<!-- source:\2 end -->', re.S | re.M)


def _source_text(spec: str) -> str:
  path, _, section = spec.partition(':')
  with open(path) as f:
    text = f.read()
  if section:
    text = text.split(f'--8<-- [start:{section}]\n', 1)[1].split(f'--8<-- [end:{section}]', 1)[0]
    text = text.rsplit('\n', 1)[0].rstrip('\n') + '\n'   # the end marker's comment line goes too
  return text


def inlined(text: str) -> str:
  """``text`` with every ``source`` block rewritten from its file."""
  def block(m: re.Match) -> str:
    pad, spec = m.group(1), m.group(2)
    code = ''.join(pad + line if line.strip() else line for line in _source_text(spec).splitlines(True))
    return (f'{pad}<!-- source:{spec} start -->\n{pad}```python\n{code}{pad}```\n'
            f'{pad}<!-- source:{spec} end -->')
  return _SOURCE.sub(block, text)


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--check', action='store_true', help='compare instead of writing; exit 1 on a difference')
  args = parser.parse_args(argv)
  wanted = {**pages(), **snippets(), **api_page.pages()}
  for path, (name, draw) in FIGURES.items():
    source = os.path.join(RESULTS, name + '.json')
    if os.path.isfile(source):
      with open(source) as f:
        wanted[path] = draw(json.load(f))
  for path in GENERATED:
    with open(path) as f:
      wanted[path] = generated(path, f.read())
  for path in INLINED:
    with open(path) as f:
      wanted[path] = inlined(wanted.get(path, f.read()))
  if args.check:
    stale = [p for p, text in wanted.items() if not os.path.isfile(p) or open(p).read() != text]
    extra = sorted(set(glob.glob(os.path.join(PAGES, '*.md'))) - set(wanted))
    for p in stale + extra:
      print(f'{p} differs from its JSON: run python -m benchmarks.results_pages', file=sys.stderr)
    return 1 if stale or extra else 0
  os.makedirs(PAGES, exist_ok=True)
  for p, text in wanted.items():
    with open(p, 'w') as f:
      f.write(text)
  print(f'wrote {len(wanted) - len(GENERATED) - len(SNIPPETS) - len(FIGURES) - len(api_page.PAGES)} pages under '
        f'{PAGES}, the snippets {list(SNIPPETS)}, the figures {list(FIGURES)}, the {len(api_page.PAGES)} API pages '
        f'and the generated tables of {list(GENERATED)}')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
