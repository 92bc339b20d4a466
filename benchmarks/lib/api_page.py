"""The API reference, ``docs/api.md`` and the pages under ``docs/api/``, written from the package's own signatures
and docstrings, so that it reads the same on GitHub, in a clone and on the site; ``python -m
benchmarks.results_pages --check`` keeps it equal to the code.

``PAGES`` names what each page shows, in order: a dotted name (a module, a class or a function), and for a
module or a class the members shown (``None``: every public one defined there; ``()``: none); a page stays
short enough to read (under 30 KB).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
from typing import Any

PAGES: tuple[tuple[str, str, str, tuple], ...] = (
    # (file, title, what it holds, its sections: (heading, ((dotted name, members), ...))). The first is the index.
    ('docs/api.md', 'API reference', 'loading a run, training, the work directory', (
        ('The package', (
            ('symjax.load', None),
            ('symjax.run.workdir.Loaded', ('batches', 'evaluate', 'loss')),
        )),
        ('Training', (
            ('symjax.train.trainer.train_and_evaluate', None),
            ('symjax.train.seeds.train_seeds', None),
            ('symjax.train.sweep.run', None),
        )),
        ('Work directory', (
            ('symjax.run.workdir.load', None),
            ('symjax.run.sample.generate', None),
        )),
    )),
    ('docs/api/model.md', 'Model', 'the config, the modules, the named sites', (
        ('Model', (
            ('symjax.model.config.ModelConfig', ()),
            ('symjax.model.transformer.Transformer', ()),
            ('symjax.model.transformer.Suffix', ()),
            ('symjax.model.transformer.build', None),
            ('symjax.model.intermediates', None),
            ('symjax.model.symbolic.KroneckerValue', ()),
            ('symjax.model.symbolic.ChannelLayerNorm', ()),
            ('symjax.model.symbolic.VocabProjection', ()),
            ('symjax.model.symbolic.VocabFFN', ()),
            ('symjax.model.attention.Attention', ()),
            ('symjax.model.transformer_program', ('TransformerProgram', 'CategoricalHead', 'NumericalHead',
                                                  'ProgramMLP', 'variable_names', 'cardinality')),
        )),
    )),
    ('docs/api/kernels.md', 'Kernels', 'the projection, attention and readout kernels', (
        ('Kernels', (
            ('symjax.ops.projection', None),
            ('symjax.ops.attention', None),
            ('symjax.ops.readout', None),
        )),
    )),
    ('docs/api/hooks.md', 'Hooks', 'the engine, the model object, hooks and caches, hook sweeps', (
        ('Interpretability: the engine and hooks', (
            ('symjax.interpret', ()),
            ('symjax.interpret.engine', None),
            ('symjax.interpret.hooked.HookedModel', None),
            ('symjax.interpret.hooks', None),
            ('symjax.interpret.grid', None),
        )),
    )),
    ('docs/api/patching.md', 'Patching', 'generation, patching, circuits, head patterns, attribution', (
        ('Interpretability: patching and attribution', (
            ('symjax.interpret.generation', None),
            ('symjax.interpret.decomposition', ()),
            ('symjax.interpret.patching', None),
            ('symjax.interpret.suffix', None),
            ('symjax.interpret.circuits', None),
            ('symjax.interpret.patterns', None),
            ('symjax.interpret.attribution', None),
        )),
    )),
    ('docs/api/circuits.md', 'Circuits', 'edge graphs, edge patching and circuit discovery', (
        ('Interpretability: circuits over edges', (
            ('symjax.interpret.edges', ('Edges', 'Graph', 'graph_of', 'residual_graph', 'read_edges',
                                        'resample_pairs', 'log_prob_metric', 'auroc', 'precision_recall', 'top')),
        )),
    )),
    ('docs/api/tracing.md', 'Tracing', 'traces, exact mixtures, interventions, the report', (
        ('Interpretability: traces and mixtures', (
            ('symjax.interpret.tracing', None),
            ('symjax.interpret.mixtures', None),
            ('symjax.interpret.interventions', None),
            ('symjax.interpret.core', ('takes_hooked_model', 'analysis_model', 'channel_lens', 'head_parameters',
                                       'readout')),
            ('symjax.interpret.report', ('build_report', 'head_parameter_figure')),
        )),
    )),
    ('docs/api/programs.md', 'Programs', 'decompiling a model into code', (
        ('Programs', (
            ('symjax.proj.decompile', ('decompile', 'build', 'write', 'load_program', 'evaluate', 'true_edges')),
            ('symjax.proj.program_code', ('decompile', 'build', 'code_of', 'plan_of', 'domains', 'simplify', 'prune',
                                          'describe', 'true_reads', 'true_edges')),
        )),
    )),
)

NOTE = ('<!-- Written by python -m benchmarks.results_pages from the code\'s signatures and docstrings '
        '(benchmarks/lib/api_page.py); edit those, not this page. -->\n')


def _resolve(dotted: str) -> Any:
  """The object a dotted name names: the longest importable module prefix, then attributes."""
  parts = dotted.split('.')
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module('.'.join(parts[:i]))
    except ImportError:
      continue
    for p in parts[i:]:
      obj = getattr(obj, p)
    return obj
  raise ImportError(dotted)


_ADDRESS = re.compile(r'<([\w.]+) ([\w.<>]+)(?: of [^>]*)? at 0x[0-9a-f]+>')


def _signature(obj) -> str:
  """``obj``'s parameters as the code writes them (a Flax module's without the ``parent`` and ``name`` every
  module has); object reprs that hold a memory address by their name, so that the page is the same at every
  run."""
  try:
    sig = inspect.signature(obj)
  except (TypeError, ValueError):
    return '(...)'
  if inspect.isclass(obj) and any(c.__module__.startswith('flax.linen') for c in obj.__mro__[1:]):
    sig = sig.replace(parameters=[p for n, p in sig.parameters.items() if n not in ('parent', 'name')],
                      return_annotation=inspect.Signature.empty)
  return _ADDRESS.sub(lambda m: m.group(2), str(sig))


def _doc(obj) -> str:
  doc = inspect.getdoc(obj)
  if not doc or (inspect.isclass(obj) and doc.startswith(f'{obj.__name__}(')):  # a dataclass's generated one
    return ''
  return doc.strip() + '\n'


def _kind(obj) -> str:
  if inspect.isclass(obj):
    return 'dataclass' if dataclasses.is_dataclass(obj) else 'class'
  return 'property' if isinstance(obj, property) else 'def'


def _public_members(owner) -> list[str]:
  """The public functions and classes a module defines (not those it imports), or a class's own public
  methods and properties, in the order of the source."""
  if inspect.ismodule(owner):
    names = [n for n, v in vars(owner).items() if not n.startswith('_') and (inspect.isfunction(v) or
             inspect.isclass(v)) and getattr(v, '__module__', None) == owner.__name__]
  else:
    names = [n for n, v in vars(owner).items() if not n.startswith('_') and
             (inspect.isfunction(v) or isinstance(v, (property, classmethod, staticmethod)))]
  def line(n):
    try:
      return inspect.getsourcelines(_unwrapped(getattr(owner, n) if not inspect.isclass(owner) else vars(owner)[n]))[1]
    except (TypeError, OSError):
      return 0
  return sorted(names, key=line)


def _unwrapped(v):
  if isinstance(v, property):
    return v.fget
  if isinstance(v, (classmethod, staticmethod)):
    return v.__func__
  return inspect.unwrap(v) if callable(v) else v


def _entry(name: str, obj, level: int) -> str:
  head = '#' * level
  kind = _kind(obj)
  if isinstance(obj, property):
    code = f'{name}  # property'
    doc = _doc(obj.fget)
  else:
    target = obj.__func__ if isinstance(obj, (classmethod, staticmethod)) else obj
    code = f'{kind} {name}{_signature(target)}' if kind != 'property' else name
    doc = _doc(target)
  return f'{head} `{name}`\n\n```python\n{code}\n```\n\n{doc}'


def _object(dotted: str, members: tuple[str, ...] | None) -> str:
  obj = _resolve(dotted)
  out = []
  if inspect.ismodule(obj):
    out.append(f'### `{dotted}`\n\n{_doc(obj)}')
    names = _public_members(obj) if members is None else list(members)
    for n in names:
      member = getattr(obj, n)
      out.append(_entry(n, member, 4))
      if inspect.isclass(member) and members is None:
        out += [_entry(f'{n}.{m}', vars(member)[m], 5) for m in _public_members(member)]
    return '\n'.join(out)
  short = dotted.rsplit('.', 1)[1]
  out.append(_entry(short, obj, 3).replace(f'### `{short}`', f'### `{dotted}`', 1))
  if inspect.isclass(obj):
    names = _public_members(obj) if members is None else list(members)
    out += [_entry(f'{short}.{m}', vars(obj).get(m, getattr(obj, m)), 4) for m in names]
  return '\n'.join(out)


def pages() -> dict[str, str]:
  """{path: text} of every API page; the first (``docs/api.md``) also lists the others."""
  out = {}
  for i, (path, title, what, sections) in enumerate(PAGES):
    parts = [f'# {title}\n\n{NOTE}']
    if i == 0:
      parts.append('The reference in pages, each generated from the code:\n\n' + ''.join(
          f'- [{t}]({os.path.relpath(p, "docs")}): {w}\n' for p, t, w, _ in PAGES[1:]))
    for heading, objects in sections:
      parts.append(f'## {heading}\n')
      parts += [_object(dotted, members) for dotted, members in objects]
    out[path] = re.sub(r'\n{3,}', '\n\n', '\n'.join(parts)).rstrip('\n') + '\n'
  return out
