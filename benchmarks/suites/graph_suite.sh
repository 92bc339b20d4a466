#!/bin/bash
# Relational attention on graph_distance: 3 kinds × {edges, no edges}, 3 seeds each, the same budget for
# every run (600 steps of batch 64 at the config's learning rate 3e-3; no tuning), test read once at the end.
#   bash benchmarks/suites/graph_suite.sh [ROOT=runs/graph_suite]
# Then: python -m benchmarks.analysis.collect_graph ROOT
set -e
cd "$(dirname "$0")/.."
root=${1:-runs/graph_suite}
for kind in symbolic token_factored standard; do
  for rel in true false; do
    python -m symjax.cli.sweep --config=configs/graph.py:model=$kind,relational=$rel --seeds=3 \
      --config.total_steps=600 --config.eval_every_steps=200 --workdir=$root/${kind}_relational_${rel}
  done
done
