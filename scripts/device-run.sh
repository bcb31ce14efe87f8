#!/usr/bin/env bash
# On the GPU machine: the GPU tests, then the GPTQ benchmarks; logs into $OUT (or runs/device).
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
.device/bin/test_cuda 2>&1 | tee "$out/test_cuda.log"
for p in ${BENCH_PRESETS:-llama2-7b llama3-8b}; do
  .device/bin/ptqkit bench gptq --preset "$p" 2>&1 | tee "$out/bench-gptq-$p.log"
done
# The whole pipeline on synthetic checkpoints (load, forward, Hessians, solve, pack, write).
for p in ${BENCH_PIPELINE:-llama2-7b}; do
  .device/bin/ptqkit bench gptq --preset "$p" --layers "${BENCH_LAYERS:-4}" 2>&1 | tee "$out/bench-pipeline-$p.log"
done
