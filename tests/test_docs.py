"""The code in the README and the docs runs as written (on a tiny trained run where it reads one)."""

import glob
import os
import re

import pytest
from helpers import REPO, tiny_config

pytestmark = pytest.mark.slow

FENCE = re.compile(r'```python\n(.*?)```', re.S)
# Source a page shows in full (benchmarks/results_pages.py's INLINED), not an example to run.
SOURCE = re.compile(r'<!-- source:(\S+?) start -->.*?<!-- source:\1 end -->', re.S)


def examples() -> list[tuple[str, int, str]]:
  out = []
  for path in ['README.md', *sorted(glob.glob('docs/**/*.md', recursive=True))]:
    if path == 'docs/api.md' or path.startswith('docs/api/'):  # the code's signatures, generated: not examples
      continue
    with open(os.path.join(REPO, path)) as f:
      text = SOURCE.sub('', f.read())
    for i, match in enumerate(FENCE.finditer(text)):
      code = match.group(1)
      if '--8<--' not in code:  # an included source file, not an example
        out.append((path, i, code))
  return out


@pytest.fixture(scope='module')
def trained_run(tmp_path_factory):
  from symjax.train import trainer
  workdir = str(tmp_path_factory.mktemp('docs') / 'run')
  trainer.train_and_evaluate(tiny_config(total_steps=20), workdir)
  return workdir


def test_the_docs_have_examples_to_run():
  found = {path for path, _, _ in examples()}
  assert {'README.md', 'docs/reading.md', 'docs/architecture.md'} <= found


@pytest.mark.parametrize('path, index, code', examples(), ids=lambda v: str(v)[:40] if isinstance(v, str) else None)
def test_example_runs(path, index, code, trained_run, capsys):
  code = code.replace("'runs/<dir>'", repr(trained_run)).replace("'runs/symbolic'", repr(trained_run))
  exec(compile(code, f'{path} example {index}', 'exec'), {'__name__': '__docs__'})


def test_the_api_page_lists_every_public_interpretability_name():
  """Each name of ``symjax.interpret.__all__`` has an entry on the API page: under its module's heading, or a
  heading of its own; and the page is what the code's docstrings give (``benchmarks/lib/api_page.py``)."""
  from benchmarks.lib import api_page
  from symjax import interpret
  pages = api_page.pages()
  text = ''
  for path, page in pages.items():
    with open(os.path.join(REPO, path)) as f:
      assert f.read() == page, path
    assert len(page.encode()) < 30_000, (path, len(page.encode()))  # a page stays short enough to read
    text += page
  sections = {m.group(1): m.end() for m in re.finditer(r'^### `([\w.]+)`', text, re.M)}
  missing = []
  for name in interpret.__all__:
    obj = getattr(interpret, name)
    module, own = obj.__module__, getattr(obj, '__name__', name)
    if f'{module}.{own}' in sections:
      continue
    start = sections.get(module)
    section = text[start:text.find('\n### ', start)] if start is not None else ''
    if not re.search(rf'^#### `{own}`', section, re.M):
      missing.append(name)
  assert not missing, missing
