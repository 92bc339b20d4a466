"""How every benchmark script writes its JSON: the measured record plus where it came from.

``write(path, record)`` adds ``command`` (the command line, unless the record has one), ``commit`` (the
checked-out commit, with ``+changes`` when the tree differs from it), ``device`` (the CPU model from
``lscpu``, or JAX's first device on an accelerator), ``cpu``, ``cpu_id`` (family, model and stepping: a virtual
machine's model name, "AMD EPYC", does not tell one generation from another), ``cores`` and ``date`` (UTC), then
writes the file atomically. The docs'
results pages are generated from these files (``python -m benchmarks.results_pages``).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import shlex
import subprocess
import sys
from typing import Any

from symjax.system import files


def _git(*args: str) -> str:
  try:
    return subprocess.run(['git', *args], capture_output=True, text=True, check=True,
                          cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return ''


def commit() -> str:
  """The checked-out commit, ``+changes`` when the working tree differs from it outside ``benchmarks/results``
  (a suite rewrites its own result file there as it goes); 'unknown' outside git."""
  sha = _git('rev-parse', 'HEAD')
  if not sha:
    return 'unknown'
  changed = _git('status', '--porcelain', '--untracked-files=no', '--', ':(top)', ':(top,exclude)benchmarks/results')
  return sha + ('+changes' if changed else '')


@functools.lru_cache(maxsize=1)
def _lscpu() -> dict[str, str]:
  """``lscpu``'s fields, read once a process: provenance asks for the model name and the family apart."""
  try:
    out = subprocess.run(['lscpu'], capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return {}
  return {k.strip(): v.strip() for k, _, v in (line.partition(':') for line in out.splitlines()) if v}


def cpu_model() -> str:
  """``lscpu``'s model name (the CPU changes between machines: every timing records it)."""
  return _lscpu().get('Model name', 'unknown')


def cpu_id() -> str:
  """``lscpu``'s CPU family, model and stepping, e.g. 'family 25 model 17 stepping 1'; 'unknown' without."""
  info = _lscpu()
  if 'CPU family' not in info or 'Model' not in info:
    return 'unknown'
  return f"family {info['CPU family']} model {info['Model']} stepping {info.get('Stepping', '?')}"


def device() -> str:
  """The CPU model, and JAX's first device where it is not the CPU."""
  import jax
  kind = jax.devices()[0].device_kind
  cpu = cpu_model()
  return cpu if jax.default_backend() == 'cpu' else f'{kind} (host CPU: {cpu})'


def command() -> str:
  """The command line as it was typed: a script of this repository run with ``python -m`` is named by
  its module (``sys.argv[0]`` holds its file path then)."""
  argv = list(sys.argv)
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  script = os.path.abspath(argv[0]) if argv and argv[0].endswith('.py') else ''
  if script.startswith(root + os.sep):
    module = os.path.relpath(script, root)[:-len('.py')].replace(os.sep, '.')
    argv = ['-m', module, *argv[1:]]
  return 'python ' + ' '.join(shlex.quote(a) for a in argv)


def provenance() -> dict[str, Any]:
  return {'command': command(), 'commit': commit(),
          'device': device(), 'cpu': cpu_model(), 'cpu_id': cpu_id(), 'cores': os.cpu_count(),
          'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d')}


def write(path: str, record: dict[str, Any]) -> None:
  """Writes ``record`` with its provenance: its own ``command`` and ``device`` are kept where it has them;
  ``commit``, ``cpu``, ``cpu_id``, ``cores`` and ``date`` are always this run's."""
  here = provenance()
  out = {**here, **record, **{k: here[k] for k in ('commit', 'cpu', 'cpu_id', 'cores', 'date')}}
  files.write_atomically(path, json.dumps(out, indent=1))
  print(f'wrote {path}')
