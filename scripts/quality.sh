#!/usr/bin/env bash
# GPTQ against RTN at the same settings on the shared tiny models (issue: CPU GPTQ pipeline).
# Prints one line per (model, setting, method): the perplexity on tinystories/eval.txt.
# Calibration: 128 windows of the model's L from tinystories/calib.txt, seed 0.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/ptqkit
A=${PTQKIT_ASSETS:-../shared/assets}
out=${OUT_DIR:-runs/quality}
mkdir -p "$out"
for model in stories260k llama2xs; do
  L=$(grep -o '"max_position_embeddings": *[0-9]*' "$A/models/$model/config.json" | grep -o '[0-9]*$')
  for setting in "w4g32:bits=4 group_size=32" "w4pc:bits=4 group_size=-1" "w3g32:bits=3 group_size=32"; do
    name=${setting%%:*}
    sets=""
    for kv in ${setting#*:}; do sets="$sets --set quantization.$kv"; done
    for method in rtn gptq; do
      dir="$out/$model-$name-$method"
      "$bin" -q quantize configs/ci-stories260k.yaml --model "$A/models/$model" --output "$dir" --force \
        --set calibration.dataset="$A/text/tinystories/calib.txt" --set calibration.seq_len="$L" \
        --set quantization.sym=false --set quantization.act_order=false --set quantization.static_groups=false \
        --set quantization.method=$method $sets > /dev/null
      ppl=$("$bin" -q eval --model "$dir" --data "$A/text/tinystories/eval.txt" --json "$dir/eval.json" | grep -o 'perplexity [0-9.]*' | head -1)
      echo "$model $name $method $ppl"
    done
  done
done
