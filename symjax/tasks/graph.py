"""Shortest-path distance on small random graphs: a task for relational attention.

Each example is an undirected Erdős–Rényi graph G(n, p) on ``num_nodes`` nodes (p = ``mean_degree`` /
(n − 1)) with one source node. The input has one token per node — ``src`` for the source, ``node`` for the
others — and the graph comes as ``edges`` ``[n, n]``: the token ``edge`` where two nodes are adjacent,
``self`` on the diagonal (a node may read itself), −1 elsewhere. The tag of node v is its shortest-path
distance from the source, ``d0`` .. ``d{max_distance − 1}``, or ``far`` when it is at least
``max_distance`` hops away or unreachable. Every node is scored (no PAD), attention is bidirectional, and
the answer is exact (breadth-first search).

A model that reads the edges can compute distances hop by hop, one layer per hop; a model that does not
sees only which node is the source, and can do no better than the distance distribution.

Splits: ``num_graphs`` graphs, 10% test, 10% of the rest validation (16,200 / 1,800 / 2,000 by default).
"""

from __future__ import annotations

import numpy as np

from symjax.system.errors import InputError
from symjax.tasks import base

NO_EDGE = -1


def distance_tokens(max_distance: int) -> list[str]:
  return [f'd{k}' for k in range(max_distance)] + ['far']


def vocab(max_distance: int) -> base.Vocab:
  return base.Vocab([base.PAD, 'src', 'node', 'edge', 'self', *distance_tokens(max_distance)])


def random_graphs(rng: np.random.Generator, num_graphs: int, num_nodes: int, mean_degree: float
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Symmetric adjacency ``[num_graphs, n, n]`` (no self-loops) and one source node per graph."""
  p = mean_degree / (num_nodes - 1)
  upper = np.triu(rng.random((num_graphs, num_nodes, num_nodes)) < p, 1)
  return upper | np.swapaxes(upper, 1, 2), rng.integers(0, num_nodes, num_graphs)


def bfs_distances(adjacency: np.ndarray, sources: np.ndarray) -> np.ndarray:
  """Hop distance of every node from its graph's source, ``[num_graphs, n]``; −1 where unreachable.
  Breadth-first, all graphs at once: the frontier of step k is the unvisited neighbours of step k − 1's."""
  g, n = adjacency.shape[:2]
  distance = np.full((g, n), -1, np.int64)
  frontier = np.zeros((g, n), bool)
  frontier[np.arange(g), sources] = True
  for hop in range(n):
    distance[frontier] = hop
    frontier = np.einsum('gij,gj->gi', adjacency.astype(np.int64), frontier.astype(np.int64)) > 0
    frontier &= distance < 0
    if not frontier.any():
      break
  return distance


class GraphDistanceTask(base.FixedSetTask):
  """Shortest-path distance from a source node; batches carry ``edges`` ``[batch, n, n]``."""

  has_edges = True

  def __init__(self, data_seed: int = 0, num_nodes: int = 12, mean_degree: float = 2.0, max_distance: int = 4,
               num_graphs: int = 20_000):
    if num_nodes < 2:
      raise InputError(f'graph num_nodes must be >= 2, got {num_nodes}')
    if not 0 < mean_degree <= num_nodes - 1:
      raise InputError(f'graph mean_degree must be in (0, num_nodes - 1 = {num_nodes - 1}], got {mean_degree}')
    if max_distance < 1:
      raise InputError(f'graph max_distance must be >= 1, got {max_distance}')
    self.name = 'graph_distance'
    self.causal = False
    self.seq_len = num_nodes
    self.vocab = vocab(max_distance)
    self.pad_id = self.vocab.id(base.PAD)
    rng = base.rng_for(data_seed, 'graph_distance', num_nodes)
    adjacency, sources = random_graphs(rng, num_graphs, num_nodes, mean_degree)
    distance = bfs_distances(adjacency, sources)
    inputs = np.full((num_graphs, num_nodes), self.vocab.id('node'), np.int32)
    inputs[np.arange(num_graphs), sources] = self.vocab.id('src')
    far = (distance < 0) | (distance >= max_distance)
    targets = np.where(far, self.vocab.id('far'), self.vocab.id('d0') + distance).astype(np.int32)
    edges = np.where(adjacency, self.vocab.id('edge'), NO_EDGE).astype(np.int32)
    edges[:, np.arange(num_nodes), np.arange(num_nodes)] = self.vocab.id('self')
    self.data = base.split_distinct(inputs, targets, rng, extras={'edges': edges},
                                    extra_fill={'edges': NO_EDGE})
    self.eval_splits = ()
