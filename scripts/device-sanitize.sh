#!/usr/bin/env bash
# On the GPU machine, after scripts/device-build.sh: compute-sanitizer over the GPU kernel and
# decode test cases, one case a process, each case's summary into $OUT/sanitize.txt (or
# runs/device). Exit 1 if any case reported an error, failed or ran past its limit.
#   TOOL=memcheck (default) | racecheck | synccheck | initcheck   the sanitizer's tool
#   LIMIT=300                                                     seconds a case (timeout)
#   arguments                                                     Catch2 case names or patterns
#                                                                 instead of the list below
# Under memcheck the cases below took 1-41 s each on the H200 with 0 errors (lab runs 501-503,
# docs/lab/2026-11-24-decode-h200.md); racecheck did not finish the wgmma cases in 60 s (run 502).
# A case cut by the timeout shows Catch2's SIGTERM failure at its TEST_CASE line, not a failure of
# the case.
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
tool=${TOOL:-memcheck}
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
  cases=(
    "gpu: the wgmma A16 kernel: every split*"
    "gpu: the wgmma A16 loop's K slices summed over a cluster*"
    "gpu: the wgmma A16 kernel's streamed form at 1..32 rows*"
    "gpu: the wgmma A16 kernel's two-CTA variant*"
    "gpu: silu of gate times up folded into the wgmma kernel's streamed form*"
    "gpu: the rotary and KV append folded into the wgmma kernel's streamed*"
    "gpu: a norm split between two Linears at 17 to 32 rows*"
    "gpu: W4A16 and W8A16 kernels equal the reference GPTQ GEMM*"
    "gpu: the NF4 kernel equals the reference NF4 GEMM*"
    "decode cuda*"
  )
fi
bad=0
for c in "${cases[@]}"; do
  t0=$(date +%s)
  timeout "${LIMIT:-300}" "$CS" --tool "$tool" --print-limit 10 .device/bin/test_cuda "$c" > "$out/sanitize.log" 2>&1
  rc=$?
  echo "== $tool: rc $rc in $(( $(date +%s) - t0 )) s: $c" | tee -a "$out/sanitize.txt"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|All tests passed|test cases" "$out/sanitize.log" | tee -a "$out/sanitize.txt"
  grep -E "^========= +(Invalid|Race|Barrier|Uninitialized|Program hit)" "$out/sanitize.log" | sort | uniq -c | head -5 | tee -a "$out/sanitize.txt"
  if [ $rc -ne 0 ] || ! grep -qE "SUMMARY: 0 (errors|hazards)" "$out/sanitize.log"; then bad=1; fi
done
rm -f "$out/sanitize.log"
exit $bad
