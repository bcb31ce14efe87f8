#!/usr/bin/env bash
# The main job on a default input: builds ptqkit, synthesizes a small Llama model (unless a model
# folder is given as $1), quantizes it with GPTQ 4-bit (configs/quickstart.yaml), and evaluates
# the quantized model against the float one (perplexity, KL divergence, top-1 agreement).
# Text: the shared TinyStories evaluation text when present, else a generated one. Outputs in runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
bin=build/bin/ptqkit
assets=${PTQKIT_ASSETS:-../shared/assets}
mkdir -p runs
model=${1:-}
if [ -z "$model" ]; then
  model=runs/synth-tiny
  [ -d "$model" ] || "$bin" synth --preset tiny --seed 0 --output "$model"
fi
data="$assets/text/tinystories/eval.txt"
if [ ! -f "$data" ]; then
  data=runs/sample.txt
  for i in $(seq 400); do echo "Once upon a time, a small model learned to count to $i."; done > "$data"
fi
out=runs/$(basename "$model")-gptq-w4g32
"$bin" inspect "$model"
"$bin" quantize configs/quickstart.yaml --model "$model" --output "$out" --force
"$bin" eval --model "$out" --reference "$model" --data "$data" --max-windows 32 --json "$out/eval.json"
echo "quantized model: $out (report.html, report.json, recipe.yaml, eval.json)"
