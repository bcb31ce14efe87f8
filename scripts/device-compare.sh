#!/usr/bin/env bash
# On the GPU machine: this tree's ptqkit (.device/bin) against a build of an earlier tree
# (.device/base/ptqkit, gathered by `BASE_PTQKIT=... scripts/device-build.sh`), alternating in one
# session so that both see the same GPU state. Logs into $OUT (or runs/device).
#   scripts/device-compare.sh gptq [ROUNDS]      bench gptq: one layer, and the pipeline with --layers 4
#   scripts/device-compare.sh kernels [ROUNDS]   bench kernels (W4A16, W8A16, NF4, W8A8), default M list
#   scripts/device-compare.sh decode [ROUNDS]    bench decode (PRESET, FORMATS, BATCH as device-exp.sh)
set -uo pipefail
what=${1:-gptq}; rounds=${2:-2}
source "$(dirname "$0")/device-env.sh"
[ -x .device/base/ptqkit ] || { echo "no .device/base/ptqkit: build with BASE_PTQKIT set"; exit 2; }
for i in $(seq "$rounds"); do
  for b in base new; do
    bin=.device/bin/ptqkit; [ $b = base ] && bin=.device/base/ptqkit
    if [ "$what" = gptq ]; then
      for p in ${BENCH_PRESETS:-llama2-7b}; do
        $bin bench gptq --preset "$p" 2>&1 | tee "$out/gptq-layer-$p-$b-$i.log"
        $bin bench gptq --preset "$p" --layers "${BENCH_LAYERS:-4}" 2>&1 | tee "$out/gptq-pipeline-$p-$b-$i.log"
      done
    elif [ "$what" = decode ]; then
      $bin bench decode --preset "${PRESET:-llama2-7b}" --formats ${FORMATS:-f16,w8a16,w4a16,nf4,w8a8} --batch ${BATCH:-1,8,32} \
        > "$out/decode-$b-$i.log" 2>&1
      grep -v "a16 mma plan\|format  batch" "$out/decode-$b-$i.log" | tail -n 16 | sed "s/^/$b $i: /"
    else
      $bin bench kernels ${BENCH_KERNEL_ARGS:-} 2>&1 | tee "$out/kernels-$b-$i.log"
    fi
  done
done
