#!/usr/bin/env bash
# Builds a portable (x86-64-v3, sm_90) ptqkit and its GPU test here, and gathers what the GPU
# machine lacks into .device/ (ignored by git): the binaries, the non-system shared libraries,
# and the shared assets the GPU tests read. The GPU machine then runs scripts/device-run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DPTQKIT_NATIVE=OFF -DPTQKIT_MARCH=x86-64-v3 \
      -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build build-device --parallel "$(nproc)" --target ptqkit test_cuda
rm -rf .device && mkdir -p .device/bin .device/lib .device/assets/models .device/assets/text/tinystories .device/assets/golden
cp build-device/bin/ptqkit build-device/bin/test_cuda .device/bin/
strip --strip-debug .device/bin/ptqkit .device/bin/test_cuda   # debug info off (function names kept for backtraces), and compressed: .device travels within the 64 MiB carry limit
gzip -6 .device/bin/ptqkit .device/bin/test_cuda  # (scripts/device-env.sh unpacks them on the GPU machine)
# A base build to compare against on the GPU (scripts/device-compare.sh): BASE_PTQKIT=path/to/ptqkit,
# built the same way (-DPTQKIT_NATIVE=OFF -DPTQKIT_MARCH=x86-64-v3 -DCMAKE_CUDA_ARCHITECTURES=90).
if [ -n "${BASE_PTQKIT:-}" ]; then mkdir -p .device/base && strip -o .device/base/ptqkit "$BASE_PTQKIT" && gzip -6 .device/base/ptqkit; fi
for l in libyaml-cpp.so.0.7 libsentencepiece.so.0 libcrypto.so.3 libgomp.so.1; do cp -L "/lib/x86_64-linux-gnu/$l" .device/lib/; done
A=${PTQKIT_ASSETS:-../shared/assets}
cp -r "$A/models/distilled-13m" "$A/models/stories260k" "$A/models/llama2xs" .device/assets/models/
for m in distilled-13m stories260k llama2xs; do cp "$A/golden/golden-$m.safetensors" .device/assets/golden/; done
for f in qwen3 qwen3-moe mixtral phi3; do   # the tiny checkpoints of the other families (2 MB together)
  cp -r "$A/models/tiny-$f" .device/assets/models/
  cp "$A/golden/golden-tiny-$f.safetensors" .device/assets/golden/
done
cp "$A/text/tinystories/calib.txt" "$A/text/tinystories/eval.txt" .device/assets/text/tinystories/
cp "$A/golden/golden.json" .device/assets/golden/
du -sh .device
