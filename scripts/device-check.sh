#!/usr/bin/env bash
# On the GPU machine, after scripts/device-build.sh: the GPU tests, then the CI recipe for
# distilled-13m quantized on the GPU (device: cuda) by this tree and, when gathered, by a base build
# (.device/base/ptqkit), with the SHA-256 of what each wrote (a restructuring must not move a byte
# there either), then `eval --device cuda` of the packed result. Logs into $OUT (or runs/device).
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
A=$PTQKIT_ASSETS
.device/bin/test_cuda 2>&1 | tee "$out/test_cuda.log" | tail -4
# Runs: the GPU forward and stacked solve (gptq, compressed-tensors); RTN (solved apart); the
# statistics saved, then reloaded at 3 bits (host Hessians uploaded to the GPU solve).
for b in base bin; do
  bin=.device/$b/ptqkit; [ -x "$bin" ] || continue
  q() {   # name [--set ...]
    local name=$1; shift
    "$bin" -q quantize configs/ci-distilled-13m.yaml --model "$A/models/distilled-13m" --output "/tmp/q-$b-$name" --force \
      --set calibration.dataset="$A/text/tinystories/calib.txt" --set device=cuda "$@" > "$out/quantize-$b-$name.log" 2>&1
    (cd "/tmp/q-$b-$name" && sha256sum model.safetensors config.json) | sed "s|^|$b $name |" | tee -a "$out/gpu-hashes.txt"
  }
  q gptq --set export.format=gptq
  q compressed-tensors --set export.format=compressed-tensors
  q rtn --set quantization.method=rtn
  rm -rf "/tmp/stats-$b"
  q saved --save-stats "/tmp/stats-$b"
  (cd "/tmp/stats-$b" && sha256sum layer-*.safetensors) | sed "s|^|$b stats |" | tee -a "$out/gpu-hashes.txt"
  q loaded --set quantization.bits=3 --load-stats "/tmp/stats-$b"
done
.device/bin/ptqkit eval --model /tmp/q-bin-gptq --data "$A/text/tinystories/eval.txt" --device cuda --max-windows 64 2>&1 | tee "$out/eval-cuda.log"
.device/bin/ptqkit eval --model /tmp/q-bin-gptq --data "$A/text/tinystories/eval.txt" --max-windows 64 2>&1 | tee "$out/eval-cpu.log"
# llama.cpp's K-quant mix on a GPU run: the Q4_K / Q6_K / Q5_0 / Q8_0 grids are solved on the host
# beside the GPU forward and Hessians; the GGUF then evaluated on both devices.
.device/bin/ptqkit quantize configs/gguf-q4_k_m.yaml --model "$A/models/distilled-13m" --output /tmp/q-gguf-q4km --force \
  --set calibration.dataset="$A/text/tinystories/calib.txt" --set device=cuda 2>&1 | tail -6 | tee "$out/quantize-gguf-q4km.log"
for d in cuda cpu; do
  .device/bin/ptqkit eval --model /tmp/q-gguf-q4km/model.gguf --data "$A/text/tinystories/eval.txt" --device $d --seq-len 512 --protocol llama.cpp \
    2>&1 | tail -1 | tee "$out/eval-gguf-q4km-$d.log"
done
# SmoothQuant W8A8 on the GPU forward (statistics from its 16-bit activations, the α search on
# cuBLAS's int8 GEMM) and on the hybrid path (host forward, α search on the GPU: device cpu's α),
# each evaluated on the host's integer path.
for fwd in true false; do
  .device/bin/ptqkit quantize configs/smoothquant-w8a8-rtn.yaml --model "$A/models/distilled-13m" --output /tmp/q-sq-$fwd --force \
    --set calibration.dataset="$A/text/tinystories/calib.txt" --set device=cuda --set gpu_forward=$fwd 2>&1 | tail -3 | tee "$out/quantize-sq-$fwd.log"
  .device/bin/ptqkit eval --model /tmp/q-sq-$fwd/compressed-tensors --data "$A/text/tinystories/eval.txt" --max-windows 64 2>&1 | tail -1 | tee "$out/eval-sq-$fwd.log"
done
# transformers (where the image has torch and transformers) reads the fake export of every family,
# and agrees with ptqkit's forward on the model features no shared checkpoint has.
if python3 -c "import torch, transformers" 2>/dev/null; then
  python3 scripts/check_transformers.py .device/bin/ptqkit "$A" /tmp/check-transformers 2>&1 | grep -v "Loading weights\|Writing model" | tee "$out/check-transformers.log"
else
  echo "check_transformers: skipped (no torch and transformers in this image)" | tee "$out/check-transformers.log"
fi
