"""Sample from a trained language model.

  python -m symjax.cli.sample --workdir=runs/... --prompt="ROMEO:" --num_tokens=200 --mode=top_p --top_p=0.9

Modes ``greedy``, ``temperature``, ``top_k``, ``top_p``; ``--checkpoint`` is ``best``, ``latest`` or a step.
"""

from absl import flags

from symjax.cli import usage
from symjax.run.sample import MODES, sample_text
from symjax.system.errors import InputError


def define_flags() -> None:
  """The CLI's flags, defined only when this module runs as a program (importing it defines none)."""
  flags.DEFINE_string('workdir', None, 'Work directory of a trained run.')
  flags.DEFINE_string('prompt', '\n', 'Text to continue.')
  flags.DEFINE_integer('num_tokens', 200, 'Tokens to generate.')
  flags.DEFINE_enum('mode', 'top_p', MODES, 'Decoding mode.')
  flags.DEFINE_float('temperature', 1.0, 'Softmax temperature (not for greedy).')
  flags.DEFINE_integer('top_k', 40, 'mode=top_k: sample among the k most likely tokens.')
  flags.DEFINE_float('top_p', 0.9, 'mode=top_p: sample from the smallest set with this mass.')
  flags.DEFINE_integer('seed', 0, 'Random seed.')
  flags.DEFINE_string('checkpoint', 'best', "Which checkpoint to load: 'best', 'latest' or a step number.")


def main():
  from symjax.run.workdir import checkpoint_choice, load
  f = flags.FLAGS
  loaded = load(f.workdir, checkpoint_choice(f.checkpoint, '--checkpoint'))
  print(sample_text(loaded, f.prompt, f.num_tokens, mode=f.mode, temperature=f.temperature,
                    top_k=f.top_k, top_p=f.top_p, seed=f.seed))


def run():
  define_flags()
  usage.run(main, required=['workdir'],
            errors=(InputError, FileNotFoundError, RuntimeError))


if __name__ == '__main__':
  run()
