"""Command-line entry points, each ``python -m symjax.cli.NAME`` (training is ``python -m symjax.main``):
``train``, ``sample``, ``tokenize``, ``sweep``, ``align``, ``interpret``."""
