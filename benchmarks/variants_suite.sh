#!/usr/bin/env bash
# The Symbolic Transformer's variants and ablations with the suite's tuning budget (peak learning rate in
# {3e-3, 1e-2}, seeds 0-2 trained together, chosen on validation loss, test read once):
#   symbolic_hybrid  all layers but the first symbolic (RASP 1:2, FOL 1, text 1:3 and 2:3 — text's grid also
#                    chooses between those two, so its tuning budget is twice the others')
#   symbolic_ffn     model.symbolic_sites=ffn (values unprojected), RASP
#   symbolic_tau     model.tau_init=0.25, the three RASP tasks where the paper's model is weakest
#   symbolic_emb     model.embed_init_std=1.0, the same three
#
#   [PYTHON=python3] bash benchmarks/variants_suite.sh ROOT [JOBS] [CORPUS]
#   python benchmarks/collect_sweeps.py ROOT --kinds=symbolic_hybrid,symbolic_ffn,symbolic_tau,symbolic_emb
set -uo pipefail
root=${1:?usage: variants_suite.sh ROOT [JOBS] [CORPUS]}
jobs=${2:-4}
corpus=${3:-../shared/data/tinyshakespeare.txt}
common="--seeds=3 --grid learning_rate=3e-3,1e-2 --config.progress_bar=false"
{
  echo "text symbolic_hybrid --config=configs/symbolic.py:task=text,size=medium --config.text_path=$corpus --grid model.symbolic_layers=1:3,2:3"
  echo "fol symbolic_hybrid --config=configs/fol.py:model=symbolic --grid model.symbolic_layers=1"
  for task in reverse sort hist double_hist most_freq dyck1 dyck2; do
    echo "$task symbolic_hybrid --config=configs/rasp.py:task=$task,model=symbolic --grid model.symbolic_layers=1:2"
    echo "$task symbolic_ffn --config=configs/rasp.py:task=$task,model=symbolic --grid model.symbolic_sites=ffn"
  done
  for task in reverse double_hist most_freq; do
    echo "$task symbolic_tau --config=configs/rasp.py:task=$task,model=symbolic --grid model.tau_init=0.25"
    echo "$task symbolic_emb --config=configs/rasp.py:task=$task,model=symbolic --grid model.embed_init_std=1.0"
  done
} | xargs -P "$jobs" -L 1 bash -c 'mkdir -p "$0/$1/$2" && ${PYTHON:-python} -m symjax.sweep '"$common"' "${@:3}" \
      --workdir="$0/$1/$2" > "$0/$1/$2/log.txt" 2>&1; echo "$1/$2 exit $?"' "$root"
