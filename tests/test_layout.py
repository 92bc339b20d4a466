"""The package's shape: no import cycle, ``import symjax`` without the trainer, every package shipped, the
recipes found by name, the docs' code and generated pages in step with the code and the results."""

import ast
import os
import re
import subprocess
import sys
import tomllib

import pytest
from helpers import REPO

PACKAGE = os.path.join(REPO, 'symjax')


def _module_name(path: str) -> str:
  rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, '.')
  return rel[:-len('.__init__')] if rel.endswith('.__init__') else rel


def _modules() -> dict[str, str]:
  out = {'symjax.configs': os.path.join(REPO, 'configs', '__init__.py'),  # configs/ ships as symjax.configs
         'symjax.configs.common': os.path.join(REPO, 'configs', 'common.py')}
  for root, _, names in os.walk(PACKAGE):
    for name in names:
      if name.endswith('.py'):
        out[_module_name(os.path.join(root, name))] = os.path.join(root, name)
  return out


def import_graph() -> dict[str, set[str]]:
  """Module -> the symjax modules it imports, at any depth of its code (lazy imports inside functions too).
  ``from symjax.x import y`` counts as an import of ``symjax.x.y`` when that is a module, else of
  ``symjax.x``; a package's ``__init__`` is a module like any other, the root ``symjax`` included."""
  modules = _modules()
  graph = {}
  for name, path in modules.items():
    edges = set()
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        targets = [f'{node.module}.{a.name}' if f'{node.module}.{a.name}' in modules else node.module
                   for a in node.names]
      else:
        continue
      edges |= {t for t in targets if t in modules and t != name}
    graph[name] = edges
  return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of ``graph`` as a path that ends where it starts, or None."""
  state: dict[str, int] = {}
  stack: list[str] = []

  def visit(node):
    state[node] = 1
    stack.append(node)
    for nxt in sorted(graph[node]):
      if state.get(nxt) == 1:
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state and (found := visit(nxt)):
        return found
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state and (found := visit(node)):
      return found
  return None


def test_the_cycle_finder_finds_a_cycle():
  assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': set()}) == ['a', 'b', 'c', 'a']
  assert find_cycle({'a': {'b'}, 'b': set()}) is None


def test_the_package_has_no_import_cycle():
  graph = import_graph()
  assert len(graph) > 40 and 'symjax.train.trainer' in graph['symjax.train.seeds']
  cycle = find_cycle(graph)
  assert cycle is None, ' -> '.join(cycle)


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
  """The import graph between the package's folders (``symjax.train``, ``symjax.run``, ``symjax.configs``...):
  a module directly under ``symjax/`` is a folder of its own, and a ``__main__`` module belongs to the
  command lines."""
  # A ``__main__`` module is a command line, whatever folder holds it.
  folder = lambda m: 'symjax.cli' if m.endswith('.__main__') else '.'.join(m.split('.')[:2])
  out: dict[str, set[str]] = {}
  for module, targets in graph.items():
    out.setdefault(folder(module), set()).update(folder(t) for t in targets if folder(t) != folder(module))
  return out


def test_no_folder_imports_one_that_imports_it_back():
  folders = folder_graph(import_graph())
  assert 'symjax.run' in folders and 'symjax.train' not in folders['symjax.run']  # the work directory stands alone
  assert 'symjax.configs' not in folders['symjax.train']  # the recipes build on the defaults, not back
  cycle = find_cycle(folders)
  assert cycle is None, ' -> '.join(cycle)
  assert find_cycle(folder_graph({'symjax.a.x': {'symjax.b.y'}, 'symjax.b.y': {'symjax.a.z'}, 'symjax.a.z': set()}))


# What tunes one machine's start-up (the allocator, the collector, threads that compile or cut batches ahead)
# stays out of the trainer: its speed at start comes from JAX's persistent compilation cache.
START_UP_MODULES = ('gc', 'ctypes', 'threading', 'concurrent.futures', 'symjax.train.early', 'symjax.train.exported')


def test_the_trainers_import_no_start_up_module():
  for module in ('symjax.train.trainer', 'symjax.train.seeds', 'symjax.cli.train', 'symjax.main'):
    path = _modules()[module]
    with open(path) as f:
      tree = ast.parse(f.read())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & set(START_UP_MODULES), (module, imported & set(START_UP_MODULES))
  from symjax.system import host
  public = {name for name in vars(host) if callable(getattr(host, name)) and not name.startswith('_')
            and getattr(getattr(host, name), '__module__', '') == host.__name__}
  assert public == {'prepare', 'retain_freed_memory', 'set_cpu_compiler_defaults', 'use_compilation_cache'}, public


def test_import_symjax_imports_no_jax_and_its_names_import_the_model_and_no_trainer():
  """``import symjax`` and ``symjax.system.host`` import neither JAX, Flax nor NumPy: ``--help`` and a
  config error answer at once, and the host's compiler flags act before JAX's backend starts."""
  script = ('import sys, symjax, symjax.system.host; print(" ".join(sorted(sys.modules))); symjax.Transformer; '
            'print(" ".join(sorted(sys.modules)))')
  before, after = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, check=True,
                                 cwd=REPO).stdout.splitlines()
  assert not {'jax', 'flax', 'numpy', 'symjax.model'} & set(before.split()), before
  loaded = {m for m in after.split() if m.startswith('symjax')}
  assert 'symjax.model.transformer' in loaded
  heavy = ('symjax.train', 'symjax.run', 'symjax.cli', 'symjax.interpret')
  assert not {m for m in loaded if m.startswith(heavy)}, loaded
  assert 'orbax.checkpoint' not in after.split() and 'optax' not in after.split()


def test_pyproject_ships_every_package_folder():
  with open(os.path.join(REPO, 'pyproject.toml'), 'rb') as f:
    listed = set(tomllib.load(f)['tool']['setuptools']['packages'])
  folders = {_module_name(os.path.join(root, '__init__.py')) for root, _, names in os.walk(PACKAGE)
             if '__init__.py' in names}
  assert folders | {'symjax.configs'} == listed


def test_recipes_resolve_by_name_and_by_path():
  from symjax import configs
  assert {'standard', 'token_factored', 'symbolic', 'rasp', 'fol', 'graph', 'align'} <= set(configs.names())
  by_name, by_path = configs.from_file('symbolic:task=text'), configs.from_file('configs/symbolic.py:task=text')
  assert by_name.to_dict() == by_path.to_dict() and by_name.task == 'text'
  with pytest.raises(FileNotFoundError, match=r"config 'symbolc' is neither a file nor a recipe; recipes: \["):
    configs.from_file('symbolc')


def test_help_lists_the_recipes_and_the_sizes():
  from symjax import configs
  out = subprocess.run([sys.executable, '-m', 'symjax.main', '--help'], capture_output=True, text=True,
                       cwd=REPO).stdout
  text = ' '.join(out.split())
  for size, shape in configs.SIZES.items():
    assert f"{size} ({shape['num_layers']} layers × {shape['num_heads']} heads × {shape['head_dim']})" in text
  assert 'token_factored' in text and 'rasp' in text


def test_results_pages_are_generated_from_the_results():
  from benchmarks import results_pages
  cwd = os.getcwd()
  os.chdir(REPO)
  try:
    assert results_pages.main(['--check']) == 0
  finally:
    os.chdir(cwd)


def test_result_pages_print_brackets_in_text_as_text():
  from benchmarks import results_pages
  text = results_pages.page('x', {'command': 'run [--batch=16] [--dir=D] | tail', 'values': [1, 2]})
  assert r'run \[--batch=16\] \[--dir=D\] \| tail' in text
  assert '[1, 2]' in text
  # Keys too: a field name, a column of a table of records, and a heading.
  text = results_pages.page('x', {'a [b] [c]': 1, 'runs': {'one': {'[x, 1] | y': 2.0}, 'two': {'[x, 1] | y': 3.0}},
                                  'nested [d] [e]': {'inner': {'deeper': [{'k': 1}]}}})
  assert r'| a \[b\] \[c\] | 1 |' in text
  assert r'| key | \[x, 1\] \| y |' in text
  assert r'## nested \[d\] \[e\]' in text


def test_every_result_file_records_command_commit_device_and_date():
  import glob
  import json
  for path in glob.glob(os.path.join(REPO, 'benchmarks', 'results', '*.json')):
    with open(path) as f:
      record = json.load(f)
    missing = [k for k in ('command', 'commit', 'device', 'date') if k not in record]
    assert not missing, f'{path}: {missing}'


def test_readme_is_short_and_names_every_folder_of_the_package():
  with open(os.path.join(REPO, 'README.md'), 'rb') as f:
    readme = f.read()
  assert len(readme) <= 15_000, len(readme)
  text = readme.decode()
  for root, dirs, names in os.walk(PACKAGE):
    if '__init__.py' in names and root != PACKAGE:
      assert f'`symjax/{os.path.relpath(root, PACKAGE)}/`' in text, root


def test_code_comments_carry_no_pointer_into_the_readme():
  """Measured results live in benchmarks/results and the docs, where they cannot go stale unseen."""
  for root, _, names in os.walk(PACKAGE):
    for name in names:
      if name.endswith('.py'):
        with open(os.path.join(root, name)) as f:
          for i, line in enumerate(f, 1):
            assert not re.search(r'README\s*,\s*"', line), f'{root}/{name}:{i}: {line.strip()}'


# The layers of docs/code.md, lowest first: a module may import its own layer and those below it.
LAYERS = (('symjax.system',), ('symjax.ops',), ('symjax.model',), ('symjax.tasks',), ('symjax.run',),
          ('symjax.configs', 'symjax.train.config', 'symjax.train.optim'), ('symjax.train',),
          ('symjax.interpret', 'symjax.proj'), ('symjax.cli', 'symjax.main', 'symjax'))


def layer_of(module: str) -> int:
  best = max((len(prefix), i) for i, prefixes in enumerate(LAYERS) for prefix in prefixes
             if module == prefix or module.startswith(prefix + '.'))
  return best[1]


def test_every_import_goes_down_the_documented_layers():
  assert layer_of('symjax.run.workdir') == 4 and layer_of('symjax.train.config') == 5
  assert layer_of('symjax.train.trainer') == 6
  upward = [f'{a} -> {b}' for a, targets in import_graph().items() for b in targets if layer_of(b) > layer_of(a)]
  assert not upward, upward
