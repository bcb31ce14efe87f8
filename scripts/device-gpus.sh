#!/usr/bin/env bash
# On the GPU machine, after scripts/device-build.sh: quantize --gpus N. The GPU tests of it, the
# distilled-13m CI recipe with --gpus 1 (NCCL, one rank) against the one-GPU run (same bytes) and
# with --gpus N twice (same bytes), and bench gptq with and without the data-parallel path (GPUS=N:
# that many GPUs; default 1). Logs into $OUT (or runs/device).
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
A=$PTQKIT_ASSETS
ldd .device/bin/ptqkit | grep -i nccl | tee "$out/nccl.txt"
PTQKIT_BIN=$PWD/.device/bin/ptqkit timeout 240 .device/bin/test_cuda "gpu: quantize --gpus*" 2>&1 | tail -12   # --gpus 2 runs where two GPUs are visible
q() {   # name [args]
  local name=$1; shift
  /usr/bin/time -f "$name: %e s wall" timeout 90 .device/bin/ptqkit -q quantize configs/ci-distilled-13m.yaml --model "$A/models/distilled-13m" --output "/tmp/g-$name" --force \
    --set calibration.dataset="$A/text/tinystories/calib.txt" --set device=cuda --set export.format=gptq "$@" 2>&1 | tail -3
  (cd "/tmp/g-$name" && sha256sum model.safetensors) | sed "s|^|$name |"
}
q one
q nccl1 --gpus 1
grep -o '"forward": "[^"]*"' /tmp/g-nccl1/report.json
G=${GPUS:-1}
if [ "$G" -ge 2 ]; then   # N ranks twice: the same bytes (and against one GPU: the test above compares the losses)
  q "ranks$G-a" --gpus "$G"
  q "ranks$G-b" --gpus "$G"
  grep -o '"forward": "[^"]*"' "/tmp/g-ranks$G-a/report.json"
  # SmoothQuant W8A8 over N ranks (every rank's statistics combined) against one GPU: the same bytes
  # (32 windows of 512 tokens split at the Hessian's fp32 groups, as the GPU test's).
  for g in 0 "$G"; do
    timeout 90 .device/bin/ptqkit -q quantize configs/smoothquant-w8a8-gptq.yaml --model "$A/models/distilled-13m" --output "/tmp/g-sq-$g" --force \
      --set calibration.dataset=random --set calibration.samples=32 --set calibration.seq_len=512 --set "export.format=[compressed-tensors]" --gpus "$g" 2>&1 | tail -2
    (cd "/tmp/g-sq-$g" && sha256sum model.safetensors) | sed "s|^|sq-gpus$g |"
  done
fi
# The N-GPU run first (a short lease gets it), with NCCL's own log, each rank's trace of its
# collectives (PTQKIT_DIST_TRACE), rank 0's progress as JSON lines and a time limit: on 2026-11-28
# `--gpus 2` did not finish in 110 s and printed nothing (docs/lab/2026-11-25-gpus-h200.md). If
# it stalls, every ptqkit process's threads are backtraced (cuda-gdb attaches; there is no gdb).
log=$out/bench-gptq-gpus$G.log
PTQKIT_DIST_TRACE=1 NCCL_DEBUG=${NCCL_DEBUG:-INFO} .device/bin/ptqkit --log-json "$out/bench-gptq-gpus$G.jsonl" bench gptq \
  --preset "${PRESET:-llama2-7b}" --layers 2 --samples 128 --gpus "$G" > "$log" 2>&1 &
pid=$!
for ((s = 0; s < ${GPUS_TIMEOUT:-300}; s += 2)); do kill -0 $pid 2>/dev/null || break; sleep 2; done
if kill -0 $pid 2>/dev/null; then
  echo "--gpus $G: still running after ${GPUS_TIMEOUT:-300} s; backtraces in $out/stacks.txt"
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv
  for p in $(pgrep -x "ptqkit|exe"); do
    echo "=== pid $p: $(tr '\0' ' ' < /proc/$p/cmdline)"
    timeout 60 cuda-gdb -p "$p" -batch -ex "info threads" -ex "thread apply all bt 14" 2>&1 | grep -v "^\[New Thread\|^warning" | head -300
  done > "$out/stacks.txt" 2>&1
  grep -E "^=== |^#[0-9]+ .*(ptq|nccl|Comm)" "$out/stacks.txt" | head -60
  pkill -KILL -x "ptqkit|exe"
fi
wait $pid; rc=$?
grep -E "per layer|hessian|forward|total|error" "$log" | head -8
echo "--gpus $G: exit $rc"
grep -E "^ptqkit: rank" "$log" | tail -n 30
grep -v "NCCL INFO\|^ptqkit: rank" "$log" | tail -n 20
grep "NCCL INFO" "$log" | grep -iE "init COMPLETE|channel|via|transport|NET/|Bootstrap|comm 0x" | head -30
tail -n 5 "$out/bench-gptq-gpus$G.jsonl" 2>/dev/null
.device/bin/ptqkit bench gptq --preset "${PRESET:-llama2-7b}" --layers 2 --samples 128 2>&1 | grep -E "per layer|hessian|forward  |total" | head -6
