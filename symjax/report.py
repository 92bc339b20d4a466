"""Write an HTML report of a trained model reading one input.

  python -m symjax.report --workdir=runs/symbolic --input="<s> a 1 b 2 c 3 d 0 a"

The implementation is ``symjax.cli.interpret``; the report itself is ``symjax.interpret.report``.
"""

from symjax.cli import interpret as cli

if __name__ == '__main__':
  cli.run()
