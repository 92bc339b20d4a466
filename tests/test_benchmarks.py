"""Every benchmark script says, under --help, what it measures (its docstring) and where it writes."""

import glob
import os
import subprocess
import sys

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow

SCRIPTS = sorted(os.path.relpath(p, REPO)[:-3].replace(os.sep, '.')
                 for folder in ('speed', 'suites', 'analysis')
                 for p in glob.glob(os.path.join(REPO, 'benchmarks', folder, '*.py')) if not p.endswith('__init__.py'))


def test_the_scripts_are_found():
  assert 'benchmarks.speed.throughput' in SCRIPTS and len(SCRIPTS) >= 15


@pytest.mark.parametrize('module', SCRIPTS + ['benchmarks.results_pages'])
def test_help_says_what_is_measured_and_where_it_writes(module):
  proc = subprocess.run([sys.executable, '-m', module, '--help'], cwd=REPO, capture_output=True, text=True,
                        timeout=120)
  text = proc.stdout + proc.stderr
  assert proc.returncode in (0, 1) and 'Traceback' not in text, text[-2000:]  # absl's --help exits with 1
  assert f'python -m {module}' in text, text[:1500]  # the usage line, from the module's docstring
  # Where it writes: its --json flag and default, or the docstring's own words.
  assert any(word in text for word in ('--json', 'writes', 'docs/results/')), text[:1500]
