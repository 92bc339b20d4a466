"""Shortest-path distance on random graphs (``symjax.tasks.graph``), for relational attention.

  python -m symjax.main --config=graph:model=symbolic,relational=true   # or configs/graph.py:... from a clone

Arguments after ':': model=standard|token_factored|symbolic; relational=true: attention reads the graph
(nodes attend to their neighbours, edge embeddings in queries, keys and values); false: the same model
without edges, which sees only which node is the source. size=tiny|small|medium, runlocal=true (20 steps,
tiny). 12 nodes of mean degree 2, distances d0..d3 or far.
"""

import symjax.configs as configs
from symjax.train import config as config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, model='symbolic', relational=True, size='small', runlocal=False)
  config = config_lib.default_config(kind=a.model, shape=configs.shape('tiny' if a.runlocal else a.size))
  config.task = 'graph_distance'
  config.model.num_layers = 4          # one hop per layer: distances up to 3, and "far" beyond
  config.model.relational = a.relational
  config.model.embed_init_std = 0.25   # one scale for every kind (the symbolic projections need it)
  config.batch_size = 64
  config.total_steps = 3000
  config.learning_rate = 3e-3
  config.eval_every_steps = 1000
  return config_lib.runlocal(config) if a.runlocal else config
