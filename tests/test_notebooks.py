"""Both Colab notebooks, executed top to bottom at a tiny scale (the 'parameters' cell is followed by one
that overrides it, as papermill does)."""

import ast
import os
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # end to end: every test here trains or runs a command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The config files' own seconds-long version (runlocal) for every training run; the rest scaled down here.
TINY = {
    'quickstart': "RUNLOCAL = True\n",
    'interpretability': "RUNLOCAL = True\nTEST_SEQUENCES = 64\nIG_STEPS = 8\n",
    'language_model': "RUNLOCAL = True\n",
}


def execute(name, tmp_path):
  nb = nbformat.read(os.path.join(REPO, 'colabs', f'{name}.ipynb'), as_version=4)
  index = next(i for i, c in enumerate(nb.cells) if 'parameters' in c.metadata.get('tags', []))
  nb.cells.insert(index + 1, nbformat.v4.new_code_cell(f"WORKDIR = {str(tmp_path / 'work')!r}\n" + TINY[name]))
  NotebookClient(nb, timeout=600, kernel_name='python3', resources={'metadata': {'path': str(tmp_path)}}).execute()
  return nb


def text_of(nb) -> str:
  out = []
  for cell in nb.cells:
    for o in cell.get('outputs', []):
      out.append(o.get('text', '') or ''.join(o.get('data', {}).get('text/plain', '')))
  return '\n'.join(out)


def test_quickstart_notebook_trains_watches_and_samples(tmp_path):
  nb = execute('quickstart', tmp_path)
  text = text_of(nb)
  assert 'test:' in text and '--- greedy' in text and '--- top_p' in text
  assert any('image/png' in o.get('data', {}) for c in nb.cells for o in c.get('outputs', []))
  assert os.path.isfile(tmp_path / 'work' / 'text' / 'run.json')


def test_interpretability_notebook_finds_heads_intervenes_and_writes_the_report(tmp_path):
  nb = execute('interpretability', tmp_path)
  text = text_of(nb)
  assert 'induction head L' in text and 'previous-token head L' in text
  assert 'exact mixture trace, largest relative error' in text
  assert 'all induction heads' in text and 'integrated_gradients' in text
  assert 'X_e after block 1, last position:' in text and 'with each head patched from the clean prompt' in text
  assert 'JAX ' in text and 'on cpu' in text  # the first cell names the backend and devices
  figures = [c for c in nb.cells if any('image/png' in o.get('data', {}) for o in c.get('outputs', []))]
  assert any('attention_figure' in c.source for c in figures)
  assert os.path.isfile(tmp_path / 'work' / 'interpret' / 'report.html')


def test_language_model_notebook_caches_ablates_patches_and_samples(tmp_path):
  nb = execute('language_model', tmp_path)
  text = text_of(nb)
  assert 'validation loss' in text and 'next token:' in text and 'X_e after block 1, head 0:' in text
  assert 'zeroing block 1 head 0: validation loss' in text and '--- greedy' in text
  assert any('image/png' in o.get('data', {}) for c in nb.cells for o in c.get('outputs', []))  # the heatmap
  assert os.path.isfile(tmp_path / 'work' / 'lm' / 'run.json')


NOTEBOOKS = ('quickstart', 'interpretability', 'language_model')


def install_cell(name: str) -> str:
  nb = nbformat.read(os.path.join(REPO, 'colabs', f'{name}.ipynb'), as_version=4)
  return nb.cells[1].source


def install_functions(name: str) -> dict:
  """The first cell's definitions (constants and functions), without running its install step."""
  tree = ast.parse(install_cell(name))
  keep = [n for n in tree.body if isinstance(n, (ast.Import, ast.FunctionDef))
          or (isinstance(n, ast.Assign) and n.targets[0].id == 'JAX_FLOOR')]
  namespace = {}
  exec(compile(ast.Module(keep, []), 'install_cell', 'exec'), namespace)
  return namespace


def test_notebooks_install_this_project_and_never_another():
  cells = [install_cell(name) for name in NOTEBOOKS]
  assert cells[0] == cells[1]
  for name in NOTEBOOKS:
    text = open(os.path.join(REPO, 'colabs', f'{name}.ipynb')).read()
    assert 'github.com/symjax' not in text
  with open(os.path.join(REPO, 'pyproject.toml')) as f:
    floor = next(line for line in f if line.strip().startswith('"jax>='))
  fns = install_functions('quickstart')
  assert '.'.join(map(str, fns['JAX_FLOOR'])) in floor


def test_install_keeps_the_runtimes_accelerator_jax_and_otherwise_asks_for_the_extra():
  command = install_functions('quickstart')['install_command']
  src = 'git+https://example.org/me/symjax.git'
  # Colab GPU with a CUDA build of a recent JAX: pinned, so pip cannot swap it for a CPU build.
  gpu = {'jax': '0.10.2', 'jaxlib': '0.10.2', 'jax-cuda12-plugin': '0.10.2', 'jax-cuda12-pjrt': '0.10.2'}
  assert command(src, 'gpu', gpu) == ['pip', 'install', '-q', src, 'jax==0.10.2', 'jaxlib==0.10.2',
                                      'jax-cuda12-plugin==0.10.2', 'jax-cuda12-pjrt==0.10.2']
  # A GPU runtime whose JAX is CPU-only, or too old: the project's CUDA extra.
  assert command(src, 'gpu', {'jax': '0.10.2', 'jaxlib': '0.10.2'}) == ['pip', 'install', '-q', f'symjax[cuda] @ {src}']
  assert command(src, 'tpu', {'jax': '0.4.30', 'libtpu': '0.0.1'}) == ['pip', 'install', '-q', f'symjax[tpu] @ {src}']
  assert command(src, 'tpu', {'jax': '0.9.0', 'jaxlib': '0.9.0', 'libtpu': '0.0.30'})[-3:] == [
      'jax==0.9.0', 'jaxlib==0.9.0', 'libtpu==0.0.30']
  assert command(src, 'cpu', {}) == ['pip', 'install', '-q', src]
  assert command(REPO, 'gpu', {}) == ['pip', 'install', '-q', REPO + '[cuda]']


def test_install_cell_without_a_source_says_what_to_set(monkeypatch):
  import importlib.util
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'symjax' else real(name, *a))
  monkeypatch.delenv('SYMJAX_SOURCE', raising=False)
  with pytest.raises(RuntimeError, match='set SYMJAX_SOURCE above'):
    exec(install_cell('quickstart'), {})
  ran = []
  monkeypatch.setenv('SYMJAX_SOURCE', 'git+https://example.org/me/symjax.git')
  monkeypatch.setattr(subprocess, 'run', lambda cmd, check: ran.append(cmd))
  exec(install_cell('quickstart'), {})
  assert ran and ran[0][1:4] == ['-m', 'pip', 'install'] and 'git+https://example.org/me/symjax.git' in ran[0]


def test_importing_the_report_module_leaves_the_matplotlib_backend_alone():
  code = ('import matplotlib; before = matplotlib.get_backend(); import symjax.interpret.report; '
          'assert matplotlib.get_backend() == before == "svg", (before, matplotlib.get_backend())')
  subprocess.run([sys.executable, '-c', code], check=True, env={**os.environ, 'MPLBACKEND': 'svg'})
