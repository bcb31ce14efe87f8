#!/usr/bin/env bash
# On the GPU machine, after scripts/device-build.sh: quantize --gpus N. The GPU tests of it, the
# distilled-13m CI recipe with --gpus 1 (NCCL, one rank) against the one-GPU run (same bytes),
# what NCCL says to two ranks on one GPU, and bench gptq with and without the data-parallel path
# (GPUS=N: that many GPUs; default 1). Logs into $OUT (or runs/device).
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
A=$PTQKIT_ASSETS
ldd .device/bin/ptqkit | grep -i nccl | tee "$out/nccl.txt"
.device/bin/test_cuda "gpu: quantize --gpus*" 2>&1 | tail -3
q() {   # name [args]
  local name=$1; shift
  /usr/bin/time -f "$name: %e s wall" .device/bin/ptqkit -q quantize configs/ci-distilled-13m.yaml --model "$A/models/distilled-13m" --output "/tmp/g-$name" --force \
    --set calibration.dataset="$A/text/tinystories/calib.txt" --set device=cuda --set export.format=gptq "$@" 2>&1 | tail -3
  (cd "/tmp/g-$name" && sha256sum model.safetensors) | sed "s|^|$name |"
}
q one
q nccl1 --gpus 1
grep -o '"forward": "[^"]*"' /tmp/g-nccl1/report.json
CUDA_VISIBLE_DEVICES=0,0 q twoonone --gpus 2
G=${GPUS:-1}
# The N-GPU run first (a short lease gets it), with NCCL's own log and a time limit: on 2026-11-28
# `--gpus 2` did not finish in 110 s and printed nothing (docs/lab/2026-11-25-gpus-h200.md).
NCCL_DEBUG=${NCCL_DEBUG:-INFO} timeout "${GPUS_TIMEOUT:-300}" .device/bin/ptqkit bench gptq --preset "${PRESET:-llama2-7b}" --layers 2 --samples 128 --gpus "$G" \
  > "$out/bench-gptq-gpus$G.log" 2>&1
rc=$?
grep -E "per layer|hessian|forward|total|error" "$out/bench-gptq-gpus$G.log" | head -8
if [ $rc -ne 0 ]; then   # timed out or failed: where it stood
  echo "--gpus $G: exit $rc"; grep -v "NCCL INFO" "$out/bench-gptq-gpus$G.log" | tail -n 20; grep "NCCL INFO" "$out/bench-gptq-gpus$G.log" | tail -n 20
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv
fi
.device/bin/ptqkit bench gptq --preset "${PRESET:-llama2-7b}" --layers 2 --samples 128 2>&1 | grep -E "per layer|hessian|forward  |total" | head -6
