"""Projects built on the core: ``align``, interpretability-guided alignment."""
