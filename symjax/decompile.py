"""Decompile a trained Symbolic Transformer into a program one can run.

  python -m symjax.decompile --workdir=W --output=program.py

The implementation is ``symjax.cli.decompile``; the decompiler itself is ``symjax.proj.decompile``.
"""

from symjax.cli import decompile as cli

if __name__ == '__main__':
  cli.run()
