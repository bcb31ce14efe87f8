#!/usr/bin/env bash
# The main job on the default input: builds the ptqkit binary (only it), quantizes the embedded
# stories260k (examples/, MIT) with the W4A16 scheme into compressed-tensors (what vLLM loads),
# calibrated on examples/tinystories-calib.txt, then evaluates float against quantized on
# examples/tinystories-eval.txt (perplexity ± its standard error, KL divergence, top-1 agreement)
# and says where report.html is. Outputs in runs/.
#   scripts/run.sh [MODEL_DIR [SCHEME [CALIBRATION_TEXT [EVAL_TEXT]]]]   another model or scheme
#   scripts/run.sh --synthetic                                          a synthesized model instead
set -euo pipefail
cd "$(dirname "$0")/.."
PTQKIT_TARGETS=ptqkit bash scripts/build.sh
bin=build/bin/ptqkit
mkdir -p runs
model=${1:-examples/stories260k}
scheme=${2:-W4A16}
calib=${3:-examples/tinystories-calib.txt}
data=${4:-examples/tinystories-eval.txt}
if [ "$model" = "--synthetic" ]; then
  model=runs/synth-tiny
  [ -d "$model" ] || "$bin" synth --preset tiny --seed 0 --output "$model"
  calib=random
fi
out=runs/$(basename "$model")-$scheme
"$bin" quantize --model "$model" --scheme "$scheme" --dataset "$calib" -o "$out" --force
echo
echo "$scheme (first line) against the float model (vs reference) on $data:"
"$bin" eval --model "$out" --reference "$model" --data "$data" --json "$out/eval.json"
echo "quantized model: $out (report: $out/report.html; recipe: $out/recipe.yaml; evaluation: $out/eval.json)"
