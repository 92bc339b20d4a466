"""Both Colab notebooks, executed top to bottom at a tiny scale (the 'parameters' cell is followed by one
that overrides it, as papermill does)."""

import os

import nbformat
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = {
    'quickstart': "MODEL_SIZE = 'tiny'\nTOTAL_STEPS = 40\nLM_STEPS = 20\n",
    'interpretability': "MODEL_SIZE = 'tiny'\nTOTAL_STEPS = 40\nTEST_SEQUENCES = 64\nIG_STEPS = 8\n",
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
  assert os.path.isfile(tmp_path / 'work' / 'interpret' / 'report.html')
