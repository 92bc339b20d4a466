"""The flags every benchmark script shares, defined once: where the results go, how many timed repeats and
steps, which model kinds. Each script passes its own default and, where it differs, its own help."""

from __future__ import annotations

from absl import flags

KINDS = ('standard', 'token_factored', 'symbolic')


def json_output(default: str | None, help: str = 'Where to write the results.') -> flags.FlagHolder:
  return flags.DEFINE_string('json', default, help)


def repeats(default: int, help: str = 'Timed repeats (the median is reported).') -> flags.FlagHolder:
  return flags.DEFINE_integer('repeats', default, help, lower_bound=1)


def steps(default: int, help: str = 'Training steps per run.') -> flags.FlagHolder:
  return flags.DEFINE_integer('steps', default, help, lower_bound=0)


def kinds(default=KINDS, help: str = 'Model kinds.') -> flags.FlagHolder:
  return flags.DEFINE_list('kinds', list(default), help)
