#!/bin/bash
# Interpretability-guided alignment on tasks with known source positions, for the three kinds:
#   backbones: 3 seeds per kind at the task's config (induction: configs/<kind>.py; reverse: configs/rasp.py),
#   then per backbone the module without alignment (align=false: CE only), with the paper's unweighted
#   objective (CE + MSE + MSE) and with the CE weighted 0.1; same steps and learning rate for all, the module
#   seed equal to the backbone's.
#   bash benchmarks/suites/align_suite.sh [ROOT=runs/align_suite] [TASKS="induction reverse"]
# Finished runs are skipped on a rerun. Then: python -m benchmarks.analysis.collect_align ROOT
set -e
cd "$(dirname "$0")/.."
root=$(realpath -m "${1:-runs/align_suite}")
quiet=--config.progress_bar=false
# The backbones keep the tied readout the docs' results table was measured with (configs/rasp.py has since given
# the symbolic model a readout of its own: config_lib.UNTIED_READOUT).
tied=--config.model.tie_embeddings=true
for task in ${2:-induction reverse}; do
  for kind in standard token_factored symbolic; do
    if [ $task = induction ]; then config=configs/$kind.py; else config=configs/rasp.py:task=$task,model=$kind; fi
    python -m symjax.cli.sweep --config=$config --seeds=3 $quiet $tied --workdir="$root/$task/$kind/backbone"
    for seed in 0 1 2; do
      for mode in false true weighted; do
        case $mode in
          false) args=(--config=configs/align.py:align=false) ;;
          true) args=(--config=configs/align.py) ;;
          weighted) args=(--config=configs/align.py --config.ce_weight=0.1) ;;
        esac
        out="$root/$task/$kind/align_${mode}/seed_$seed"
        [ -f "$out/alignment.json" ] || python -m symjax.cli.align --backbone="$root/$task/$kind/backbone/base/seed_$seed" \
          "${args[@]}" --config.seed=$seed --workdir="$out"
      done
    done
  done
done
