#!/usr/bin/env bash
# SHA-256 of every file the CI recipes write, in every format, so that a change that must not move
# a byte (a restructuring) is checked by CI against hashes recorded from the tree before it.
#
#   scripts/output-hashes.sh BIN record FILE   run the recipes with BIN, write the hashes to FILE
#   scripts/output-hashes.sh BIN check FILE    run them, compare with FILE (exit 1 on a difference)
#
# Runs (stories260k and distilled-13m, CPU, each recipe's own calibration):
#   gptq    the CI recipe, exported as fake, gptq, gptq_v2 and compressed-tensors (stories260k:
#           fake and compressed-tensors; its ffn of 172 fits neither gptq's int32 packing nor
#           Q4_0 blocks, and its down_proj (172 wide, groups of 32) stays float: compressed-
#           tensors would misread its groups), with its statistics saved (--save-stats: the
#           Hessians, fp64, exactly)
#   stats   the same recipe at 3 bits from those statistics (--load-stats)
#   seq     the CI recipe with true_sequential: false (float-pass Hessians)
#   gguf    (distilled-13m) GPTQ 4-bit g32 symmetric (Q4_0), exported as gguf
#   nf4     NF4 (data-free), exported as nf4 and fake
#   w8a8    SmoothQuant (alpha auto) + GPTQ W8A8, exported as compressed-tensors and fake
# Hashed raw: every model file. Normalized first: recipe.yaml (the model, output and dataset
# paths dropped) and report.json (timings, memory, paths, the device and the build (its git commit)
# dropped: jq).
# Floating-point results depend on the instruction set the build was compiled for (-march), so
# FILE records the binary's ISA line (its --version: the compiler's own macros, with cpuinfo's
# names); a check by a binary built for another ISA is skipped with a message.
set -euo pipefail
bin=$(realpath "$1"); mode=$2; file=$(realpath -m "$3")
cd "$(dirname "$0")/.."
A=${PTQKIT_ASSETS:-../shared/assets}
[ -f "$A/golden/golden.json" ] || { echo "PTQKIT_SKIP: shared assets not found at $A"; exit 0; }
command -v jq >/dev/null || { echo "PTQKIT_SKIP: jq missing (scripts/setup.sh installs it)"; exit 0; }
isa="isa: $("$bin" --version | sed -n 's/^build: .*(\(.*\))$/\1/p')"
if [ "$mode" = check ] && ! grep -qxF "$isa" "$file"; then
  echo "PTQKIT_SKIP: $file was recorded by a build for another instruction set ($(grep '^isa:' "$file")); this build: $isa"; exit 0
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
calib="$A/text/tinystories/calib.txt"
q() {   # name model recipe [quantize args...]
  local name=$1 model=$2 recipe=$3; shift 3
  "$bin" -q quantize "$recipe" --model "$A/models/$model" --output "$work/$name" --set calibration.dataset="$calib" "$@" >/dev/null
}
for m in stories260k distilled-13m; do
  r=configs/ci-$m.yaml
  if [ $m = distilled-13m ]; then
    q "$m-gptq" $m $r --set 'export.format=[fake,gptq,gptq_v2,compressed-tensors]' --save-stats "$work/$m-stats.d"
    q "$m-gguf" $m $r --set quantization.group_size=32 --set quantization.sym=true --set export.format=gguf
  else   # ffn 172: no multiple of 8 (gptq's int32 packing) nor of 32 (Q4_0 blocks)
    q "$m-gptq" $m $r --set 'export.format=[fake,compressed-tensors]' --save-stats "$work/$m-stats.d"
  fi
  q "$m-stats" $m $r --set quantization.bits=3 --load-stats "$work/$m-stats.d"
  q "$m-seq" $m $r --set quantization.true_sequential=false
  q "$m-nf4" $m configs/nf4.yaml
  q "$m-w8a8" $m configs/smoothquant-w8a8-gptq.yaml --set calibration.samples=16 --set calibration.seq_len=256
done
out=$work/hashes
(
  echo "$isa"
  cd "$work"
  find . -type f ! -name hashes | LC_ALL=C sort | while read -r f; do
    case "$f" in
      */recipe.yaml) h=$(grep -v -E '^(model|output):|^  dataset:' "$f" | sha256sum) ;;
      */report.json) h=$(jq -S 'del(.build, .device, .forward, .layers, .phases_seconds, .solve_phases_seconds, .upload_phases_seconds,
                                 .background_seconds, .total_seconds, .peak_rss_mb, .peak_gpu_mb, .statistics,
                                 .recipe.model, .recipe.output, .recipe.calibration.dataset, .model.path, .calibration.dataset)
                                 | .modules |= map(del(.seconds))' "$f" | sha256sum) ;;
      */report.html) continue ;;   # rendered from report.json (timings included)
      *) h=$(sha256sum < "$f") ;;
    esac
    echo "${h%% *}  ${f#./}"
  done
) > "$out"
if [ "$mode" = record ]; then
  cp "$out" "$file"; echo "recorded $(($(wc -l < "$file") - 1)) hashes in $file"
else
  if diff <(grep -v '^isa:' "$file") <(grep -v '^isa:' "$out"); then echo "$(($(wc -l < "$out") - 1)) files: every hash matches $file"
  else echo "FAILED: outputs differ from $file (lines above: < recorded, > now)"; exit 1; fi
fi
