"""A work directory owned by one run at a time: an advisory lock on ``DIR/.lock`` held for the run's life.

Two runs writing one folder overwrite each other's checkpoints and final metrics, and Orbax's temporary
folders of one trip up the other. The lock (``fcntl.flock``) is the kernel's: it goes with the process that
holds it, however that process ends, so a lock is never left held by a run that died. The file also says
who holds it (process id, host, start time), for the refusal to name; a file naming a process that no longer
holds it is taken over with a one-line note.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys
from typing import Iterator

from symjax.system.errors import InputError

LOCK_FILE = '.lock'


class WorkdirBusy(InputError):
  """Another run holds the work directory."""


def _holder(text: str) -> dict:
  try:
    holder = json.loads(text)
  except ValueError:
    return {}
  return holder if isinstance(holder, dict) else {}


def _describe(holder: dict) -> str:
  if not holder:
    return 'another process'
  return (f"process {holder.get('pid', '?')} on {holder.get('host', '?')}, started "
          f"{holder.get('started', '?')}")


@contextlib.contextmanager
def owned(workdir: str, lead: bool = True) -> Iterator[None]:
  """Holds ``workdir`` for the block; a ``WorkdirBusy`` (one line naming the holder) at once when another run
  holds it. ``lead``: whether this process takes the lock (in a run of several processes, process 0 alone)."""
  if not lead:
    yield
    return
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK_FILE)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      with open(path) as f:
        holder = _holder(f.read())
      raise WorkdirBusy(f'{workdir!r} is in use by another run ({_describe(holder)}): wait for it to end, or give '
                        f'this run another --workdir') from None
    previous = _holder(os.pread(fd, 4096, 0).decode(errors='replace'))
    if previous:  # written by a run that ended without clearing it (killed, or out of power)
      print(f'note: taking over {path} from {_describe(previous)}, which no longer holds it', file=sys.stderr)
    mine = {'pid': os.getpid(), 'host': socket.gethostname(),
            'started': datetime.datetime.now().astimezone().isoformat(timespec='seconds')}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(mine).encode(), 0)
    try:
      yield
    finally:
      os.ftruncate(fd, 0)  # a run that ends leaves nothing to take over
  finally:
    os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def owned_all(workdirs, lead: bool = True) -> Iterator[None]:
  """``owned`` of every folder (the seeds of one run), taken in turn and released together."""
  with contextlib.ExitStack() as stack:
    for w in workdirs:
      stack.enter_context(owned(w, lead))
    yield
