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
  """Each name of ``symjax.interpret.__all__`` is on the API page: its module documented whole, or the name
  itself."""
  from symjax import interpret
  with open(os.path.join(REPO, 'docs/api.md')) as f:
    blocks = re.findall(r'^::: (\S+)\n((?:    .*\n)*)', f.read(), re.M)
  documented = set()
  for target, options in blocks:
    members = re.search(r'members: \[(.*)\]', options)
    documented.add(target)
    if members:
      documented |= {f'{target}.{m.strip()}' for m in members.group(1).split(',')}
    elif 'members: false' not in options:
      documented.add(f'{target}.*')
  missing = [name for name in interpret.__all__
             if not {f'{getattr(interpret, name).__module__}.{name}', f'{getattr(interpret, name).__module__}.*'}
             & documented]
  assert not missing, missing
