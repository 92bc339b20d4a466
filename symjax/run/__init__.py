"""The work directory: its files and their checks, Orbax checkpoints with fallback to the previous one, the
metric writer, ``load`` (the model, parameters, config and tokenizer of a run) and sampling from a run."""
