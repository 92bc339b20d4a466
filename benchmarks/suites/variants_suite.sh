#!/usr/bin/env bash
# The Symbolic Transformer's variants and ablations with the suite's tuning budget (peak learning rate in
# {3e-3, 1e-2}, seeds 0-2 trained together, chosen on validation loss, test read once):
#   symbolic_hybrid  all layers but the first symbolic (RASP 1:2, FOL 1, text 1:3 and 2:3 — text's grid also
#                    chooses between those two, so its tuning budget is twice the others')
#   symbolic_ffn     model.symbolic_sites=ffn (values unprojected), RASP
#   symbolic_tau     model.tau_init=0.25, the three RASP tasks where the paper's model is weakest
#   symbolic_emb     model.embed_init_std=1.0, the same three
#   <kind>_untied    model.tie_embeddings=false (a readout table of its own), every kind on every task
#   symbolic_untied_wide  the same at token_factored's parameter count on text (ff_dim_per_head=512)
#   symbolic_dense   model.vocab_ffn=dense (each channel's FFN reads the whole state), text; and
#   symbolic_dense_untied  with model.tie_embeddings=false too (token_factored_untied's parameter count on
#                    text), every task
#
#   [PYTHON=python3] [ONLY=REGEX] bash benchmarks/suites/variants_suite.sh ROOT [JOBS] [CORPUS]
#   python -m benchmarks.analysis.collect_sweeps ROOT --kinds=symbolic_hybrid,symbolic_ffn,symbolic_tau,symbolic_emb
#
# ONLY keeps the sweeps whose "<task> <variant>" matches the extended regular expression, e.g.
# ONLY='untied' or ONLY='^(text|fol) '.
set -uo pipefail
root=${1:?usage: variants_suite.sh ROOT [JOBS] [CORPUS]}
jobs=${2:-4}
corpus=${3:-../shared/data/tinyshakespeare.txt}
common="--seeds=3 --grid learning_rate=3e-3,1e-2 --config.progress_bar=false"
tied="--config.model.tie_embeddings=true"  # the variants measured when every kind's readout was tied
{
  echo "text symbolic_hybrid --config=configs/symbolic.py:task=text,size=medium --config.text_path=$corpus --grid model.symbolic_layers=1:3,2:3 $tied"
  echo "fol symbolic_hybrid --config=configs/fol.py:model=symbolic --grid model.symbolic_layers=1 $tied"
  for task in reverse sort hist double_hist most_freq dyck1 dyck2; do
    echo "$task symbolic_hybrid --config=configs/rasp.py:task=$task,model=symbolic --grid model.symbolic_layers=1:2 $tied"
    echo "$task symbolic_ffn --config=configs/rasp.py:task=$task,model=symbolic --grid model.symbolic_sites=ffn $tied"
  done
  for task in reverse double_hist most_freq; do
    echo "$task symbolic_tau --config=configs/rasp.py:task=$task,model=symbolic --grid model.tau_init=0.25 $tied"
    echo "$task symbolic_emb --config=configs/rasp.py:task=$task,model=symbolic --grid model.embed_init_std=1.0 $tied"
  done
  untied="--grid model.tie_embeddings=false"
  for kind in symbolic token_factored standard; do
    echo "text ${kind}_untied --config=configs/$kind.py:task=text,size=medium --config.text_path=$corpus $untied"
    echo "fol ${kind}_untied --config=configs/fol.py:model=$kind $untied"
  done
  echo "text symbolic_untied_wide --config=configs/symbolic.py:task=text,size=medium --config.text_path=$corpus $untied --grid model.ff_dim_per_head=512"
  echo "text symbolic_dense --config=configs/symbolic.py:task=text,size=medium --config.text_path=$corpus --grid model.vocab_ffn=dense $tied"
  dense="--grid model.vocab_ffn=dense"
  echo "text symbolic_dense_untied --config=configs/symbolic.py:task=text,size=medium --config.text_path=$corpus $dense $untied"
  echo "fol symbolic_dense_untied --config=configs/fol.py:model=symbolic $dense $untied"
  for task in reverse sort hist double_hist most_freq dyck1 dyck2; do
    echo "$task symbolic_dense_untied --config=configs/rasp.py:task=$task,model=symbolic $dense $untied"
  done
  for kind in symbolic token_factored standard; do
    for task in reverse sort hist double_hist most_freq dyck1 dyck2; do
      echo "$task ${kind}_untied --config=configs/rasp.py:task=$task,model=$kind $untied"
    done
  done
} | grep -E "${ONLY:-.}" | xargs -P "$jobs" -L 1 bash -c 'mkdir -p "$0/$1/$2" && ${PYTHON:-python} -m symjax.cli.sweep "${@:3}" '"$common"' \
      --workdir="$0/$1/$2" > "$0/$1/$2/log.txt" 2>&1; echo "$1/$2 exit $?"' "$root"
