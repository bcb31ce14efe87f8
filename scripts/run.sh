#!/usr/bin/env bash
# The main job on a default input: builds ptqkit, synthesizes a small Llama model (unless a model
# folder is given as $1), and evaluates it on the shared TinyStories text when present, else on
# a generated text. Outputs land in runs/.
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
"$bin" inspect "$model"
"$bin" eval --model "$model" --data "$data" --max-windows 32 --json runs/eval.json
echo "result: runs/eval.json"
