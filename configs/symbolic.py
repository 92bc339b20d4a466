"""Symbolic Transformer ("Symbolic Transformers", Kerce & Fox 2025, §5, Algorithm 1): the Token-Factored
model with channel-wise LayerNorm and the vocabulary projection on the values and after each channel's FFN,
so that every update of every channel is a convex mixture of that channel's token embeddings.

  python -m symjax.main --config=symbolic                          # or configs/symbolic.py from a clone
  python -m symjax.main --config=symbolic:task=text,size=medium --config.text_path=input.txt

Arguments after ':': task=induction|text, size=tiny|small|medium|paper, runlocal=true (20 steps, tiny),
program=true (program training: one-hot mixtures and attention, so the run decompiles exactly with
``python -m symjax.decompile``).
This is the paper's model. Opt-in variants (each documented in ``symjax/model/config.py``):
--config.model.symbolic_sites=values|ffn and --config.model.projection_gain=true trade readability for
accuracy; --config.model.vocab_ffn=dense and --config.model.qk_positions=true keep every stream a token
mixture; --config.model.ffn_mixture=nonnegative weighs the FFN's embeddings by non-negative weights of free
mass. Run time and results: the docs' "Results" pages.
"""

from symjax.configs import common

KIND = 'symbolic'


def get_config(arg=None):
  config, a = common.base(KIND, arg, program=False)
  # The projections score z_h·E^(h) / τ_h: with GPT's 0.02 every mixture α starts uniform and learning
  # stalls, so the embeddings start larger.
  config.model.embed_init_std = 0.25
  # On text, a readout table of its own: it changes no stream, every update is still a mixture of the input
  # embedding table's rows.
  common.task(config, a.task, text_learning_rate=1e-2, text_tied=False)
  # Program training ("Learning Transformer Programs" §3): the forward pass takes every mixture and every
  # attention pattern as its argmax, gradients pass straight through, and the model is its program.
  config.model.hard = a.program
  if a.program and a.task == 'induction':
    # One-hot forward passes learn slower than the soft model: a longer schedule, stopped once validation
    # is exact (chosen on validation: benchmarks/results/program_budget.json).
    config.total_steps = 20000
    config.eval_every_steps = 2000
    config.stop_at_accuracy = 1.0
  return common.finish(config, a)
