#!/usr/bin/env bash
# The regression gate as CI runs it: quantize with the CI recipes, evaluate, and fail (exit 10)
# when perplexity, KL divergence or top-1 agreement regress past the baselines in tests/baselines.
# Usage: scripts/gate.sh [PTQKIT_BINARY]. Prints PTQKIT_SKIP (CTest: skipped) without the assets.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/bin/ptqkit}
A=${PTQKIT_ASSETS:-../shared/assets}
[ -f "$A/golden/golden.json" ] || { echo "PTQKIT_SKIP: shared assets not found at $A"; exit 0; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
gate() {   # recipe baseline windows model max_kl min_top1
  "$bin" -q quantize "$1" --model "$A/models/$4" --output "$tmp/$4" --set calibration.dataset="$A/text/tinystories/calib.txt" > /dev/null
  "$bin" -q eval --model "$tmp/$4" --data "$A/text/tinystories/eval.txt" --max-windows "$3" --reference "$A/models/$4" \
    --baseline "$2" --max-ppl-delta 0.002 --relative --max-kl "$5" --min-top1 "$6"
}
gate configs/ci-stories260k.yaml tests/baselines/stories260k-gptq-w4g32.json 100 stories260k 0.055 0.88
gate configs/ci-distilled-13m.yaml tests/baselines/distilled-13m-gptq-w4g128.json 50 distilled-13m 0.0012 0.98
