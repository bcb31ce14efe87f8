#!/usr/bin/env bash
# On the GPU machine, after scripts/device-build.sh: every GPU table of docs/benchmarks.md from the
# tree as it is, in two parts that each fit one device call:
#   PART=1  the whole test_cuda (~260 s), then `bench decode` at batch 1, 8, 32 for llama2-7b and
#           llama3-8b (~17 s each);
#   PART=2  `bench kernels` (the A16 kernels at M = 1..4096, the W8A8 GEMM and decode product), then
#           `bench decode` for the three presets at batch 1, 8, 32 and past 32 sequences (64, 128)
#           for the two Llama presets;
#   PART=3  `bench gptq` (one layer, and the whole pipeline on synthetic 4-layer checkpoints) and
#           `bench smoothquant` for the presets of the GPTQ and SmoothQuant tables.
# Each command is held to its own time limit, so one that hangs still leaves the others' logs.
# Logs and --json tables into $OUT (or runs/device).
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
P=.device/bin/ptqkit
run() {   # run NAME SECONDS COMMAND...: stdout and stderr into $out/NAME.log, its last lines shown
  local name=$1 secs=$2
  shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" >"$out/$name.log" 2>&1
  echo "== $name: exit $?, $((SECONDS - t0)) s"
  tail -n "${TAIL:-14}" "$out/$name.log"
}
decode() {   # decode PRESET BATCHES (the whole table shown)
  local name="decode-$1-${2//,/-}"
  TAIL=40 run "$name" 240 $P bench decode --preset "$1" --formats f16,w8a16,w4a16,nf4,w8a8 --batch "$2" --json "$out/$name.json"
}
date -u +"%F %T UTC"
case "${PART:-1}" in
  1)
    TAIL=4 run test_cuda 330 .device/bin/test_cuda
    decode llama2-7b 1,8,32
    decode llama3-8b 1,8,32
    ;;
  2)
    run kernels-a16 200 $P bench kernels --kernels w4a16 w8a16 nf4 --m 1,8,16,32,64,128,4096 --runs 50
    run kernels-w8a8 120 $P bench kernels --kernels w8a8 --m 1,2,4,8,12,16,24,32,48,64,96,128,4096,8192 --runs 50
    decode llama2-7b 1,8,32
    decode llama3-8b 1,8,32
    decode phi3-mini 1,8,32
    decode llama2-7b 64,128
    decode llama3-8b 64,128
    ;;
  3)
    for p in llama2-7b llama3-8b llama2-70b; do run "gptq-layer-$p" 150 $P bench gptq --preset "$p"; done
    for p in llama2-7b llama3-8b qwen3-8b; do run "gptq-pipeline-$p" 200 $P bench gptq --preset "$p" --layers 4; done
    for p in llama2-7b llama3-8b; do run "smoothquant-$p" 120 $P bench smoothquant --preset "$p"; done
    ;;
esac
date -u +"%F %T UTC"
