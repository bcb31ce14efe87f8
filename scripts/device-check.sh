#!/usr/bin/env bash
# On the GPU machine, after scripts/device-build.sh: the GPU tests, then the CI recipe for
# distilled-13m quantized on the GPU (device: cuda) by this tree and, when gathered, by a base build
# (.device/base/ptqkit), with the SHA-256 of what each wrote (a restructuring must not move a byte
# there either), then `eval --device cuda` of the packed result. Logs into $OUT (or runs/device).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/device}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PTQKIT_ASSETS=$PWD/.device/assets
A=$PTQKIT_ASSETS
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$out/gpu.txt"
.device/bin/test_cuda 2>&1 | tee "$out/test_cuda.log" | tail -4
for b in base bin; do
  bin=.device/$b/ptqkit; [ -x "$bin" ] || continue
  for f in gptq compressed-tensors; do
    "$bin" -q quantize configs/ci-distilled-13m.yaml --model "$A/models/distilled-13m" --output "/tmp/q-$b-$f" --force \
      --set calibration.dataset="$A/text/tinystories/calib.txt" --set export.format=$f --set device=cuda > "$out/quantize-$b-$f.log" 2>&1
    (cd "/tmp/q-$b-$f" && sha256sum model.safetensors config.json) | sed "s|^|$b $f |" | tee -a "$out/gpu-hashes.txt"
  done
done
.device/bin/ptqkit eval --model /tmp/q-bin-gptq --data "$A/text/tinystories/eval.txt" --device cuda --max-windows 64 2>&1 | tee "$out/eval-cuda.log"
.device/bin/ptqkit eval --model /tmp/q-bin-gptq --data "$A/text/tinystories/eval.txt" --max-windows 64 2>&1 | tee "$out/eval-cpu.log"
