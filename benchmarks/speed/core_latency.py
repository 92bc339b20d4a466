"""Where the machine has put its cores: the round-trip latency between two CPUs, sampled while a benchmark runs.

  python -m benchmarks.speed.core_latency [--seconds=60] [--interval_ms=1000]

On a virtual machine the hypervisor may move a virtual CPU to a core far from the other's (another core
complex, without the shared cache). A compiled step that splits its work over both cores then runs slower for as
long as that lasts, whatever the program does. ``core_latency.c`` (built here with the system's C compiler,
``$CC`` or ``cc``) measures one cache line's round trip between the first two CPUs this process may use; the side
by side benchmark (``benchmarks/speed/vs_pytorch.py``) runs it beside every command and records, for each 50-step
block, the slowest round trip measured during it. Standalone, it prints the samples for ``--seconds`` and writes no
file.
"""

from __future__ import annotations

import bisect
import os
import shutil
import statistics
import subprocess
import sys
import time

# How the benchmarks that run the probe beside them read it: a sample every INTERVAL_MS (a 50-step block lasts
# 1-3 s, so several fall in each), and a block or round whose slowest round trip is above FAR_FACTOR × the
# fastest sample of the benchmark ran with the cores far apart.
INTERVAL_MS = 500
FAR_FACTOR = 2.0

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'core_latency.c')


def build(folder: str) -> tuple[str | None, str]:
  """Compiles the probe into ``folder``: (its path, '') or (None, why not)."""
  compiler = os.environ.get('CC') or shutil.which('cc') or shutil.which('gcc')
  if not compiler:
    return None, 'no C compiler (set CC, or install gcc)'
  binary = os.path.join(folder, 'core_latency')
  done = subprocess.run([compiler, '-O2', '-pthread', '-o', binary, SOURCE], capture_output=True, text=True)
  if done.returncode != 0:
    return None, f'{compiler} could not build {SOURCE}: {done.stderr.strip().splitlines()[-1:]}'
  return binary, ''


def cpu_pair() -> tuple[int, int] | None:
  """The first two CPUs this process may run on, or None on a one-CPU machine."""
  cpus = sorted(os.sched_getaffinity(0))
  return (cpus[0], cpus[1]) if len(cpus) > 1 else None


class Monitor:
  """Runs the probe in the background (a context manager); ``samples`` are (unix seconds, ns) pairs.

  ``binary`` None (no compiler, or one CPU) gives a monitor that samples nothing."""

  def __init__(self, binary: str | None, log_path: str, interval_ms: int = 1000):
    self.binary, self.log_path, self.interval_ms = binary, log_path, interval_ms
    self.pair = cpu_pair()
    self._proc = None

  def __enter__(self) -> 'Monitor':
    if self.binary and self.pair:
      with open(self.log_path, 'w') as log:
        self._proc = subprocess.Popen([self.binary, *map(str, self.pair), str(self.interval_ms)], stdout=log,
                                      stderr=subprocess.STDOUT)
    return self

  def __exit__(self, *exc) -> None:
    if self._proc is not None:
      self._proc.terminate()
      self._proc.wait()
      if self._proc.returncode not in (0, -15):
        with open(self.log_path) as log:
          print(f'core_latency stopped early: {log.read().strip()}', file=sys.stderr)

  def samples(self) -> list[tuple[float, float]]:
    if not os.path.isfile(self.log_path):
      return []
    out = []
    with open(self.log_path) as log:
      for line in log:
        parts = line.split()
        if len(parts) == 2:
          try:
            out.append((float(parts[0]), float(parts[1])))
          except ValueError:
            continue
    return out


def slowest_between(samples: list[tuple[float, float]], spans: list[tuple[float, float]]) -> list[float | None]:
  """For each (start, end) span in unix seconds, the slowest of the samples taken within it (None: none).

  The slowest, not the median: a block during which the cores were far apart for part of the time is slow for
  that part, and must not be counted as one with the cores near."""
  times = [t for t, _ in samples]
  out = []
  for start, end in spans:
    inside = [ns for _, ns in samples[bisect.bisect_left(times, start):bisect.bisect_right(times, end)]]
    out.append(max(inside) if inside else None)
  return out


def median_with_cores_near(rounds: list[dict], samples: list[tuple[float, float]], limit: float | None) -> dict:
  """The median ms per step of timed ``rounds`` (each ``{'ms', 'span_unix': (start, end)}``; the span is taken
  out). With ``limit`` (ns), over the rounds whose slowest sample was at most ``limit``, the cores near, each
  round's slowest recorded in it as ``core_round_trip_ns``; all rounds when none was near. ``limit`` None:
  every round (one CPU: no pair to place)."""
  spans = [tuple(r.pop('span_unix')) for r in rounds]
  if limit is None:
    return {'step_ms': statistics.median(r['ms'] for r in rounds)}
  for r, ns in zip(rounds, slowest_between(samples, spans)):
    r['core_round_trip_ns'] = ns
  near = [r['ms'] for r in rounds if r['core_round_trip_ns'] is not None and r['core_round_trip_ns'] <= limit]
  return {'step_ms': statistics.median(near or [r['ms'] for r in rounds]), 'rounds_cores_near': len(near)}


def main() -> int:
  import argparse
  import tempfile
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--seconds', type=float, default=60.0, help='how long to sample')
  parser.add_argument('--interval_ms', type=int, default=1000, help='time between two samples')
  args = parser.parse_args()
  if cpu_pair() is None:
    print('one CPU: no pair to measure', file=sys.stderr)
    return 1
  with tempfile.TemporaryDirectory(prefix='core_latency_') as tmp:
    binary, why = build(tmp)
    if binary is None:
      print(why, file=sys.stderr)
      return 1
    with Monitor(binary, os.path.join(tmp, 'log'), args.interval_ms) as monitor:
      time.sleep(args.seconds)
    rows = monitor.samples()
  print(f'CPUs {monitor.pair[0]} and {monitor.pair[1]}: round trip, ns')
  for t, ns in rows:
    print(f'{time.strftime("%H:%M:%S", time.gmtime(t))} {ns:.0f}')
  if rows:
    values = [ns for _, ns in rows]
    print(f'min {min(values):.0f}, median {statistics.median(values):.0f}, max {max(values):.0f} ns')
  return 0


if __name__ == '__main__':
  sys.exit(main())
