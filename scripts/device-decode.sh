#!/usr/bin/env bash
# On the GPU machine, after scripts/device-build.sh: the decode tests (GPU greedy against the CPU
# reference), `generate` on both devices, and `bench decode` on the 7B/8B presets (every format,
# batches 1, 8, 32). APART=1 adds batch 1 with q, k, v and gate, up apart; NOPDL=1 batch 1 with
# programmatic dependent launch off; NOGRAPH=1 batch 1 with plain launches. Logs into $OUT (or runs/device).
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
A=$PTQKIT_ASSETS
.device/bin/test_cuda "decode*" 2>&1 | tee "$out/test_decode.log" | tail -4
for d in cpu cuda; do
  .device/bin/ptqkit generate --model "$A/models/distilled-13m" --prompt "Once upon a time" --max-tokens 64 --device $d --json "$out/generate-$d.json" \
    2>&1 | tee "$out/generate-$d.log"
done
.device/bin/ptqkit generate --model "$A/models/tiny-phi3" --prompt-ids 1,2,3,4 --max-tokens 16 --device cuda --ignore-eos 2>&1 | tail -2 | tee "$out/generate-phi3.log"
.device/bin/ptqkit bench decode --preset "${PRESET:-llama2-7b}" --json "$out/bench-decode-${PRESET:-llama2-7b}.json" 2>&1 | tee "$out/bench-decode-${PRESET:-llama2-7b}.log"
if [ -n "${NOGRAPH:-}" ]; then
  .device/bin/ptqkit bench decode --preset "${PRESET:-llama2-7b}" --no-graph --batch 1 --json "$out/bench-decode-nograph.json" 2>&1 | tee "$out/bench-decode-nograph.log"
fi
P=${PRESET:-llama2-7b}
if [ -n "${APART:-}" ]; then
  .device/bin/ptqkit bench decode --preset "$P" --apart --batch 1 --json "$out/bench-decode-apart.json" 2>&1 | tee "$out/bench-decode-apart.log"
fi
if [ -n "${NOPDL:-}" ]; then
  PTQKIT_PDL=0 .device/bin/ptqkit bench decode --preset "$P" --batch 1 --json "$out/bench-decode-nopdl.json" 2>&1 | tee "$out/bench-decode-nopdl.log"
fi
