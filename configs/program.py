"""The Transformer Program kind (``model.kind='program'``, code a person reads) on the induction task of
"Learning Transformer Programs" (§4.1). Its RASP recipes are in ``rasp.py`` (``model=program``).

  python -m symjax.main --config=configs/program.py --workdir=runs/induction_program
  python -m symjax.decompile --workdir=runs/induction_program --output=induction.py

Arguments after ':': runlocal=true (20 steps, for tests and a first look).
"""

from symjax.configs import common

KIND = 'program'


def get_config(arg=None):
  config, a = common.base(KIND, arg)
  if a.task != 'induction':
    raise ValueError(f"configs/program.py trains the induction task; got task={a.task!r} (the RASP tasks: "
                     f"--config=rasp:task=T,model=program)")
  common.task(config, a.task, text_learning_rate=0.0, text_tied=True)
  # That paper's shape is 2 layers of 1 categorical head, no MLPs. With 1 head seeds 0 and 1 stalled at 66%
  # validation accuracy (straight-through training too); with 4 per layer seeds 0-2 reached 100% within 2,000
  # steps (benchmarks/results/transformer_program_shape.json).
  config.model.num_layers = 2
  config.model.num_heads = 4
  config.model.numerical_heads = 0
  config.model.mlps = 0
  config.model.qk_positions = False  # positions are a variable the heads select
  # Trained as that paper trains: the Gumbel-softmax relaxation, temperature annealed from 3 to 0.01.
  config.model.relaxed = True
  config.model.gumbel_scale, config.model.gumbel_scale_end = 3.0, 0.01
  config.learning_rate = 1e-2
  config.total_steps = 6000
  config.eval_every_steps = 1000
  config.stop_at_accuracy = 1.0
  return common.finish(config, a)
