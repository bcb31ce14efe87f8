#!/usr/bin/env bash
# The main job on the default input: builds the ptqkit binary (only it), quantizes the embedded
# stories260k (examples/, MIT) with the W4A16 scheme into compressed-tensors (what vLLM loads),
# calibrated on examples/tinystories-calib.txt, then evaluates float against quantized on
# examples/tinystories-eval.txt (perplexity ± its standard error, KL divergence, top-1 agreement)
# and says where report.html is; then quantizes the same scheme by round-to-nearest and prints both
# runs side by side (`ptqkit compare`: size, time, output error, perplexity, KL). Outputs in runs/.
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
# The same scheme by round-to-nearest, beside it (NF4 is round-to-nearest already).
if [ "$scheme" != NF4 ]; then
  # (its warnings are the first run's: kept in a log, shown if it fails; act-order orders GPTQ's
  # columns, which round-to-nearest has none of, so its checkpoint's config does not claim it)
  "$bin" -q quantize --model "$model" --scheme "$scheme" --dataset "$calib" --set quantization.method=rtn --set quantization.act_order=false \
    -o "$out-RTN" --force >/dev/null 2>"$out-RTN.log" ||
    { cat "$out-RTN.log" >&2; exit 1; }
  "$bin" -q eval --model "$out-RTN" --reference "$model" --data "$data" --json "$out-RTN/eval.json" >/dev/null
  echo
  echo "$scheme by GPTQ and by round-to-nearest (ptqkit compare):"
  "$bin" compare "$out" "$out-RTN" --eval "$out/eval.json" "$out-RTN/eval.json" --modules 5
fi
