"""Where a compiled step's time goes: jax.profiler's trace of a few steps, summed by op name.

``profile_ops(step, log_dir, process)`` runs ``step()`` a few times under ``jax.profiler.trace`` (which
writes a Perfetto JSON trace beside its own files), then sums the duration of every complete event of the
processes whose name holds ``process`` ('GPU' for a GPU's streams, 'CPU' for XLA:CPU's host threads), per
line (thread) of the trace and per event name. A line's busy time can exceed the step on a multi-threaded
host (lines run side by side) and its events nest (a module holds its ops), so compare names within one
line. ``by_op`` sums the numbered copies of an op (every ``dot.N`` as ``dot``), and is what is printed.

For a trace taken on one thread, where op times add up to the step:
``hlo_ops`` reads each instruction's op_name metadata and whether it is a matrix product from the optimised
HLO text, ``trace_events`` the trace's events of those instructions, and ``classify`` charges an op_name to its
pass and its part of the model.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re

import jax


def profile_ops(step, log_dir: str, process: str, steps: int = 3, top: int = 25) -> dict:
  """``{line: {'busy_ms_per_step': ..., 'top': {name: ms per step}}}`` over ``steps`` traced calls."""
  with jax.profiler.trace(log_dir, create_perfetto_trace=True):
    for _ in range(steps):
      jax.block_until_ready(step())
  events = load_trace(log_dir)
  meta = lambda kind: {(e['pid'], e.get('tid')) if kind == 'thread_name' else e['pid']: e['args']['name']
                       for e in events if e.get('ph') == 'M' and e.get('name') == kind}
  processes, threads = meta('process_name'), meta('thread_name')
  lines: dict[str, dict[str, float]] = {}
  for e in events:
    if e.get('ph') == 'X' and process in str(processes.get(e.get('pid'), '')):
      line = lines.setdefault(str(threads.get((e['pid'], e.get('tid')), e.get('tid'))), {})
      line[e['name']] = line.get(e['name'], 0.0) + e.get('dur', 0.0) / 1e3 / steps
  ranked = lambda t: dict(sorted(t.items(), key=lambda kv: -kv[1])[:top])
  return {line: {'busy_ms_per_step': sum(t.values()), 'top': ranked(t), 'by_op': ranked(by_op(t))}
          for line, t in lines.items()}


def load_trace(log_dir: str) -> list[dict]:
  """The events of the Perfetto trace ``jax.profiler.trace(log_dir, create_perfetto_trace=True)`` wrote."""
  path = sorted(glob.glob(os.path.join(log_dir, '**', 'perfetto_trace.json.gz'), recursive=True))[-1]
  with gzip.open(path, 'rt') as f:
    return json.load(f)['traceEvents']


def by_op(times: dict[str, float]) -> dict[str, float]:
  """Times summed over the numbered copies of one op (``dot.28``, ``dot.3`` -> ``dot``)."""
  out: dict[str, float] = {}
  for name, ms in times.items():
    base = re.sub(r'\.\d+$', '', name)
    out[base] = out.get(base, 0.0) + ms
  return out


def print_profile(label: str, step_ms: float, profile: dict, lines_with=('XLA Ops',)) -> None:
  for line, t in profile.items():
    print(f"\n{label}, {line}: busy {t['busy_ms_per_step']:.1f} ms of a {step_ms:.1f} ms step")
    if any(s in line for s in lines_with) or len(profile) == 1:
      for name, ms in t['by_op'].items():
        print(f'  {ms:7.2f} ms  {name[:110]}')


# A block's sub-module (the op_name component after the Transformer and its layer) -> the part it is charged to.
PARTS = {'attention': 'attention', 'value_projection': 'attention', 'value_map': 'attention', 'ffn': 'FFN',
         'embed': 'embedding and readout'}


def classify(op_name: str) -> tuple[str, str]:
  """(pass, part) of an HLO op from its metadata op_name, e.g.
  'jit(<lambda>)/transpose(jvp(Transformer))/layer_2/attention/out/dot_general' -> ('backward', 'attention')."""
  if 'transpose(' in op_name:
    stage = 'backward'
  elif 'jvp(' in op_name:
    stage = 'forward'
  else:
    return 'update and metrics', 'optimizer and metrics'
  path = op_name.split('/')
  inside = [i for i, p in enumerate(path) if p.endswith('(Transformer)') or p.endswith('(Transformer))')]
  if not inside:
    return stage, 'embedding and readout'  # the loss and the tied readout sit outside the Transformer module
  rest = [p for p in path[inside[0] + 1:] if not re.fullmatch(r'layer_\d+', p)]
  module = rest[0] if rest else ''
  if module.startswith('norm'):
    return stage, 'norms'
  return stage, PARTS.get(module, 'residual adds and other')


def hlo_ops(text: str) -> dict[str, tuple[str, bool]]:
  """Every instruction of optimised HLO text: name -> (op_name metadata, whether it is a matrix product).

  An instruction a compiler pass made (XLA:CPU's partial sums of a long reduction, a copy for a layout) has
  no metadata: it takes that of the nearest operand that has some, the op it computes for."""
  with_dot = set()
  for m in re.finditer(r'\n(%?[\w.\-]+) \([^\n]*\{\n(.*?)\n\}', text, re.S):
    if re.search(r'= \S+ dot\(', m.group(2)):
      with_dot.add(m.group(1).lstrip('%'))
  ops, operands = {}, {}
  for m in re.finditer(r'\n\s+(?:ROOT )?%([\w.\-]+) = (\S+) (\w[\w-]*)\(([^\n]*)', text):
    name, opcode, rest = m.group(1), m.group(3), m.group(4)
    called = re.search(r'calls=%([\w.\-]+)', rest)
    product = opcode == 'dot' or (opcode == 'fusion' and called is not None and called.group(1) in with_dot)
    meta = re.search(r'op_name="([^"]*)"', rest)
    ops[name] = (meta.group(1) if meta else '', product)
    operands[name] = re.findall(r'%([\w.\-]+)', rest.split(')')[0])
  for name, (op_name, product) in list(ops.items()):
    frontier, seen = list(operands[name]), set()
    while not op_name and frontier:
      nearest = frontier.pop(0)
      if nearest in ops and nearest not in seen:
        seen.add(nearest)
        op_name = ops[nearest][0]
        frontier += operands.get(nearest, [])
    ops[name] = (op_name, product)
  return ops


def trace_events(log_dir: str, names) -> tuple[list[tuple[str, float]], int]:
  """(name, µs) of every complete event of the trace named as one of the program's ``names`` (on whichever
  thread ran it: XLA:CPU runs a small program on the calling thread), and the number of steps they cover: the
  commonest count of one name (every op of the program runs once a step; the trace can miss a thread's first
  steps, so the calls made are not the steps seen)."""
  out = [(e['name'], e.get('dur', 0.0)) for e in load_trace(log_dir) if e.get('ph') == 'X' and e.get('name') in names]
  counts = collections.Counter(collections.Counter(name for name, _ in out).values())
  return out, counts.most_common(1)[0][0] if counts else 0
