"""Shortest-path distance on random graphs (``symjax.tasks.graph``), for relational attention.

  python -m symjax.main --config=configs/graph.py:model=symbolic,relational=true

model: standard | token_factored | symbolic; relational=true: attention reads the graph (nodes attend to
their neighbours, edge embeddings in queries, keys and values); false: the same model without edges, which
sees only which node is the source. size: tiny | small | medium; runlocal=true: the seconds-long version.
12 nodes of mean degree 2, distances d0..d3 or far. 4 layers (one hop each) of 4 heads × 16, 3000 steps of
batch 64. Measured results, 3 seeds per kind: README.md, "Relational attention".
"""

from symjax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, model='symbolic', relational=True, size='small', runlocal=False)
  config = config_lib.default_config(kind=a.model, size='tiny' if a.runlocal else a.size)
  config.task = 'graph_distance'
  config.model.num_layers = 4
  config.model.relational = a.relational
  config.eval_every_steps = 1000
  return config_lib.runlocal(config) if a.runlocal else config
