#!/usr/bin/env bash
# Every kind on every benchmark task with the same tuning budget: peak learning rate in {3e-3, 1e-2} ×
# readout tied to the embedding table or not, 3 seeds per point (trained together in one process, symjax.train.seeds), chosen
# on validation loss; test read once, for the chosen point. One `python -m symjax.cli.sweep` per (task, kind), JOBS of them at a time.
#
#   [PYTHON=python3] [RASP_STEPS=N] bash benchmarks/suites/sweep_suite.sh ROOT [JOBS] [CORPUS]
#
# RASP_STEPS sets the RASP tasks' training steps for every kind (configs/rasp.py: 3000; docs, "RASP
# suite": the symbolic model is still learning there, and was measured again at 12000).
#
# ROOT/<task>/<kind>/sweep.{md,json} hold the tables; benchmarks/analysis/collect_sweeps.py gathers them.
set -uo pipefail
root=${1:?usage: sweep_suite.sh ROOT [JOBS] [CORPUS]}
jobs=${2:-4}
corpus=${3:-../shared/data/tinyshakespeare.txt}
common="--seeds=3 --grid learning_rate=3e-3,1e-2 --grid model.tie_embeddings=true,false --config.progress_bar=false"
{
  for kind in symbolic token_factored standard; do
    echo "text $kind --config=configs/$kind.py:task=text,size=medium --config.text_path=$corpus"
  done
  for kind in symbolic token_factored standard; do
    echo "fol $kind --config=configs/fol.py:model=$kind"
  done
  for kind in symbolic token_factored standard; do
    for task in reverse sort hist double_hist most_freq dyck1 dyck2; do
      echo "$task $kind --config=configs/rasp.py:task=$task,model=$kind${RASP_STEPS:+ --config.total_steps=$RASP_STEPS}"
    done
  done
} | xargs -P "$jobs" -L 1 bash -c 'mkdir -p "$0/$1/$2" && ${PYTHON:-python} -m symjax.cli.sweep "${@:3}" '"$common"' \
      --workdir="$0/$1/$2" > "$0/$1/$2/log.txt" 2>&1; echo "$1/$2 exit $?"' "$root"
