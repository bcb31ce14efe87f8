#!/usr/bin/env bash
# On the GPU machine, after scripts/device-build.sh: compute-sanitizer over the GPU kernel and
# decode test cases, one case a process, each case's summary into $OUT/sanitize.txt (or
# runs/device). Exit 1 if any case reported an error, failed or ran past its limit.
#   TOOL=memcheck (default) | racecheck | synccheck | initcheck   the sanitizer's tool
#   LIMIT=300                                                     seconds a case (timeout)
#   JOBS=1                                                        cases run at once, each its own
#                                                                 process (the GPU has room)
#   arguments                                                     Catch2 case names or patterns
#                                                                 instead of the lists below
# Under memcheck the first list took 1-41 s a case on the H200 with 0 errors (lab runs 501-503,
# docs/lab/2026-11-24-decode-h200.md). racecheck and synccheck track every shared-memory access and
# did not finish the wgmma cases of that list in 60 s (run 502), so they take the second list: the
# hidden "[sanitize]" case (one small call of each A16 kernel form) and the cases whose shapes are
# small enough, 30-288 s each under racecheck, 0 hazards (run 514, JOBS=12, LIMIT=480).
# A case cut by the timeout shows Catch2's SIGTERM failure at its TEST_CASE line, not a failure of
# the case.
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
tool=${TOOL:-memcheck}
cases=("$@")
if [ ${#cases[@]} -eq 0 ] && [ "$tool" != memcheck ]; then
  cases=(
    "[sanitize]"
    "gpu: a norm split between two Linears at one row*"
    "gpu: an RMSNorm folded into the NF4 kernel at one row*"
    "gpu: silu of gate times up folded into a stacked A16 or f16 Linear*"
    "gpu: silu of gate times up folded into the wgmma kernel's streamed form*"
    "gpu: the rotary and KV append folded into the wgmma kernel's streamed*"
    "gpu: a norm split between two Linears at 17 to 32 rows*"
    "gpu: A16 calls chained without a host sync*"
    "gpu: the W8A8 decode GEMV*"
    "gpu: the W8A8 decode product on wgmma*"
    "decode cuda: a synthetic model decodes through every format's kernels*"
  )
elif [ ${#cases[@]} -eq 0 ]; then
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
jobs=${JOBS:-1}
run_case() {   # $1 the case, $2 its log
  local t0 rc; t0=$(date +%s)
  timeout "${LIMIT:-300}" "$CS" --tool "$tool" --print-limit 10 .device/bin/test_cuda "$1" > "$2" 2>&1
  rc=$?
  {
    echo "== $tool: rc $rc in $(( $(date +%s) - t0 )) s: $1"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|All tests passed|test cases" "$2"
    grep -E "^========= +(Invalid|Race|Barrier|Uninitialized|Program hit|Error)" "$2" | sort | uniq -c | head -5
  } > "$2.summary"
  [ $rc -eq 0 ] && grep -qE "SUMMARY: 0 (errors|hazards)" "$2" || touch "$2.bad"
}
logs=$(mktemp -d)
for i in "${!cases[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 1; done
  run_case "${cases[$i]}" "$logs/$i.log" &
done
wait
for i in "${!cases[@]}"; do cat "$logs/$i.log.summary"; done | tee -a "$out/sanitize.txt"
bad=0; ls "$logs"/*.bad >/dev/null 2>&1 && bad=1
rm -rf "$logs"
exit $bad
