"""The small files of work directories and reports: written whole or not at all, read with errors that name
the file.

A work directory's JSON files (``config.json``, ``run.json``, ``vocab.json``, ``final_metrics.json``, ...) are
written by symjax in one piece (a temporary file, then a rename), so a file that does not parse was edited
or damaged outside symjax; the error says which file, so that the user can restore it rather than read a
bare ``JSONDecodeError``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Iterator

from symjax.system.errors import InputError


def write_atomically(path: str, text: str | bytes) -> None:
  """Other processes (and a crash mid-write) see the old file or the new one, never half of one; a write
  that fails leaves the old file and no temporary file. Text is written as UTF-8. Each process writes its own
  temporary file, so two writing the same path at once cannot mix their bytes."""
  tmp = f'{path}.{os.getpid()}.tmp'
  try:
    with open(tmp, 'wb') as f:
      f.write(text.encode('utf-8') if isinstance(text, str) else text)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def make_writable_folder(folder: str) -> None:
  """Creates ``folder`` if needed and writes (and removes) a probe file in it; OSError if either fails.

  Every process of a multi-process run may probe the same shared folder at once, so each probe has a name
  of its own: with one fixed name, one process removed the probe another was about to remove."""
  os.makedirs(folder, exist_ok=True)
  with tempfile.NamedTemporaryFile(dir=folder, prefix='.symjax_write_test_'):
    pass


@contextlib.contextmanager
def refused_leaves_no_folder(folder: str) -> Iterator[None]:
  """If the block raises, the folders on the way to ``folder`` that did not exist before it and are still
  empty are removed again, so that a refused start leaves nothing behind."""
  created, path = [], os.path.abspath(folder)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    created.append(path)
    path = os.path.dirname(path)
  try:
    yield
  except BaseException:
    for path in created:  # the deepest first; one that holds anything stays, and so do those above it
      try:
        os.rmdir(path)
      except OSError:
        break
    raise


def read_json(path: str, hint: str = '') -> dict[str, Any]:
  """The JSON object in ``path``; ValueError naming the file if it does not parse or is not an object.
  ``hint``: what the user can do about it, appended to the message."""
  try:
    with open(path, encoding='utf-8') as f:
      value = json.load(f)
  except ValueError as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
    problem = f'is not valid JSON ({e})'
  else:
    if isinstance(value, dict):
      return value
    problem = f'holds a JSON {type(value).__name__}, not an object'
  raise InputError(f'{path!r} {problem}; symjax writes it in one piece, so it was changed or damaged after '
                   f'it was written' + (f'; {hint}' if hint else ''))
