"""The error types the command-line tools report in one line.

``InputError`` is what symjax raises when the person running it gave something it cannot use: a config
value, a missing, empty or damaged file, a name it does not know, a sequence too long. Its message says in
one line what is wrong and what is allowed, and the command-line tools print it as that one line. Every
other exception is a fault of the code or the machine and keeps its traceback, except ``TrainingDiverged``
and ``PeerLost``.
"""


class InputError(ValueError):
  """Bad input from the user; a ValueError, so that callers catching ValueError keep working."""


class TrainingDiverged(RuntimeError):
  """The loss or the parameters became non-finite; the last good checkpoint is kept."""


class PeerLost(RuntimeError):
  """Another process of a multi-process run stopped; the last checkpoint is kept, and rerunning every process
  with the same command resumes from it."""
