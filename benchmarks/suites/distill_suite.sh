#!/bin/bash
# Stream-specific distillation against training from scratch, at the same budget (the recipe's steps and
# the kind's own learning rate; the distillation weights at their defaults, untuned), 3 seeds each:
#   reverse (RASP, 3000 steps) and the text recipe (tiny Shakespeare, 2000 steps),
#   students token_factored and symbolic, teacher one standard model (seed 0) of the same recipe.
#   bash benchmarks/suites/distill_suite.sh [ROOT=runs/distill_suite] [TEXT=../shared/data/tinyshakespeare.txt]
# Finished runs are skipped on a rerun. Then: python -m benchmarks.analysis.collect_distill ROOT
# The students keep the settings the docs' results table was measured with, from before the configs gave the
# symbolic model (and token_factored on text) a readout of its own: the tied readout, and token_factored's
# text learning rate 1e-2 (config_lib.UNTIED_READOUT, TEXT_LEARNING_RATES).
set -e
cd "$(dirname "$0")/.."
root=$(realpath -m "${1:-runs/distill_suite}")
text=$(realpath "${2:-../shared/data/tinyshakespeare.txt}")
quiet=--config.progress_bar=false
tied=--config.model.tie_embeddings=true
teacher() {  # teacher NAME CONFIG [FLAGS...]
  local dir=$root/$1/teacher; shift
  [ -f "$dir/final_metrics.json" ] || python -m symjax.main --config="$@" $quiet --workdir="$dir"
}
teacher reverse configs/rasp.py:task=reverse,model=standard
teacher text configs/standard.py:task=text,size=medium --config.text_path="$text"
for kind in symbolic token_factored; do
  for mode in scratch distill; do
    extra=(); [ $mode = distill ] && extra=(--config.distill.teacher="$root/reverse/teacher")
    python -m symjax.cli.sweep --config=configs/rasp.py:task=reverse,model=$kind --seeds=3 $quiet $tied "${extra[@]}" \
      --workdir="$root/reverse/${kind}_$mode"
  done
done
for kind in symbolic token_factored; do
  for mode in scratch distill; do
    extra=(); [ $mode = distill ] && extra=(--config.distill.teacher="$root/text/teacher")
    [ $kind = token_factored ] && extra+=(--config.learning_rate=1e-2)
    python -m symjax.cli.sweep --config=configs/$kind.py:task=text,size=medium --config.text_path="$text" --seeds=3 \
      $quiet $tied "${extra[@]}" --workdir="$root/text/${kind}_$mode"
  done
done
