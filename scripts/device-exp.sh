#!/usr/bin/env bash
# On the GPU machine, after scripts/device-build.sh: one experiment's run — the decode table
# (llama2-7b), the A/Bs named by the environment, then the whole GPU test binary. Logs into $OUT.
#   INT8AB=1   W8A8 batch 1 and 8 with the int8 inputs quantized by their own kernel (PTQKIT_DECODE_INT8_FUSE=0)
#   W8SWEEP=1  bench kernels W8A16 at M = 1 and 8 with the plain and overlapped loops forced
#   F16AB=1    f16 with cuBLAS for every Linear (PTQKIT_F16_MMA_MAX=0) and with the A16 kernel up to 8 and 32 rows
#   W8A8ROW=1  W8A8 batch 1 and bench kernels at 1, 2 rows with the tiled GEMV (PTQKIT_W8A8_ROW=0) against the whole-x one
#   SWEEP2=1   W8A8 batch 1 with 1 and 4 weight rows a warp in the whole-x GEMV; W8A16 M = 1 over forced K slices
#   AB=VAR     the table with VAR=1 and VAR=0 (or each of ABVALS), twice each (ABFORMATS, ABBATCH: default all formats, batch 1); plans logged
#              (AB=PTQKIT_DECODE_NORM_FOLD: NF4's folded norm, lab run 67)
#   WG=1       bench kernels, the wgmma A16 kernel forced at 32, 64, 128 rows (lab run 84: its two k-step loops)
#   PATH32=1   bench kernels at 32 rows on the decode's shapes (stacked qkv, gate/up; o; down): every A16 path, K slices 1-16
#   PATHS2=1   bench kernels at 17, 32, 64 rows on the Llama and the decode's stacked shapes: mma (planned, 2 row tiles), wgmma, shared_x
#   ABVALS     the values AB takes, in order (default "1 0")
#   KAB=VAR    bench kernels with VAR at each of KABVALS (default "1 0"), twice, arguments KABARGS
#   PROF32=1   where a batch-32 step goes: PTQKIT_DECODE_PROFILE=1 (plain launches, 64 steps) on every format (PROFBATCH: 32)
#   TESTS=SPEC test_cuda's cases SPEC (Catch2 names, commas) with the environment TESTENV ("VAR=v VAR2=w"), before the rest
#   NOTABLE=1  skip the decode table
#   NOTEST=1   skip test_cuda
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
SHAPES9="4096x4096 11008x4096 4096x11008 14336x4096 4096x14336 12288x4096 22016x4096 6144x4096 28672x4096"   # the Llama layers, the decode's stacked ones, llama3-8b's
P=${PRESET:-llama2-7b}
if [ -n "${TESTS:-}" ]; then
  env ${TESTENV:-} timeout 400 .device/bin/test_cuda "$TESTS" 2>&1 | tee "$out/test_cuda-subset.log" | tail -4 | sed "s/^/[${TESTENV:-} $TESTS] /"
fi
[ -z "${NOTABLE:-}" ] && .device/bin/ptqkit bench decode --preset "$P" --formats ${FORMATS:-f16,w8a16,w4a16,nf4,w8a8} --batch ${BATCH:-1,8,32} --json "$out/bench-decode-$P.json" 2>&1 | tee "$out/bench-decode-$P.log"
if [ -n "${AB:-}" ]; then   # AB=VAR: VAR at each of ABVALS, twice, on ABFORMATS at ABBATCH
  for i in 1 2; do
    for v in ${ABVALS:-1 0}; do
      env "$AB=$v" PTQKIT_A16_PLAN_LOG=1 .device/bin/ptqkit bench decode --preset "$P" --formats ${ABFORMATS:-f16,w8a16,w4a16,nf4,w8a8} --batch ${ABBATCH:-1} \
        > "$out/bench-decode-$AB-$v-$i.log" 2>&1
      grep -v "a16 mma plan\|format  batch" "$out/bench-decode-$AB-$v-$i.log" | tail -n 15 | sed "s/^/$AB=$v run $i: /"
    done
  done
fi
if [ -n "${KAB:-}" ]; then   # KAB=VAR: bench kernels at each of KABVALS, twice
  for i in 1 2; do
    for v in ${KABVALS:-1 0}; do
      env "$KAB=$v" .device/bin/ptqkit bench kernels ${KABARGS:-} > "$out/bench-kernels-$KAB-$v-$i.log" 2>&1
      grep -E "^(W|NF)" "$out/bench-kernels-$KAB-$v-$i.log" | sed "s/^/$KAB=$v run $i: /"
    done
  done
fi
if [ -n "${PROF32:-}" ]; then
  PTQKIT_DECODE_PROFILE=1 .device/bin/ptqkit bench decode --preset "$P" --formats ${FORMATS:-f16,w8a16,w4a16,nf4,w8a8} --batch ${PROFBATCH:-32} --decode 64 \
    > "$out/bench-decode-profile.log" 2>&1
  grep -E "profile|^ *(f16|w8a16|w4a16|nf4|w8a8) " "$out/bench-decode-profile.log"
fi
if [ -n "${INT8AB:-}" ]; then
  PTQKIT_DECODE_INT8_FUSE=0 .device/bin/ptqkit bench decode --preset "$P" --formats w8a8 --batch 1,8 2>&1 | tee "$out/bench-decode-int8-unfused.log"
fi
if [ -n "${F16AB:-}" ]; then
  PTQKIT_F16_MMA_MAX=0 .device/bin/ptqkit bench decode --preset "$P" --formats f16 --batch 1,8 2>&1 | tee "$out/bench-decode-f16-cublas.log"
  PTQKIT_F16_MMA_MAX=8 .device/bin/ptqkit bench decode --preset "$P" --formats f16 --batch 1,8 2>&1 | tee "$out/bench-decode-f16-mma8.log"
  PTQKIT_F16_MMA_MAX=32 PTQKIT_A16_PLAN_LOG=1 .device/bin/ptqkit bench decode --preset "$P" --formats f16 --batch 32 2>&1 | tee "$out/bench-decode-f16-mma32.log"
fi
if [ -n "${W8A8ROW:-}" ]; then
  PTQKIT_W8A8_ROW=0 .device/bin/ptqkit bench decode --preset "$P" --formats w8a8 --batch 1 2>&1 | tee "$out/bench-decode-w8a8-tiled.log"
  .device/bin/ptqkit bench kernels --kernels w8a8 --m 1 2 --runs 50 2>&1 | grep -v "^W8A8 .* 8192 " | tee "$out/bench-kernels-w8a8.log"
  PTQKIT_W8A8_ROW=0 .device/bin/ptqkit bench kernels --kernels w8a8 --m 1 2 --runs 50 2>&1 | grep -v "^W8A8 .* 8192 " | tee "$out/bench-kernels-w8a8-tiled.log"
fi
if [ -n "${SWEEP2:-}" ]; then
  for r in 1 4; do PTQKIT_W8A8_ROW_ROWS=$r .device/bin/ptqkit bench decode --preset "$P" --formats w8a8 --batch 1 2>&1 | tail -n 1 | sed "s/^/rows $r: /" | tee -a "$out/bench-decode-w8a8-rows.log"; done
  PTQKIT_A16_SWEEP="1:1:0:2,1:2:0:2,1:4:0:2,1:8:0:2,1:16:0:2" .device/bin/ptqkit bench kernels --kernels w8a16 --m 1 --runs 50 --shapes 4096x4096 12288x4096 22016x4096 4096x11008 2>&1 | tee "$out/bench-kernels-w8-slices.log"
fi
if [ -n "${W8SWEEP:-}" ]; then
  PTQKIT_A16_PLAN_LOG=1 PTQKIT_A16_SWEEP="1:0:0:1,1:0:0:2,2:0:0:1,2:0:0:2" .device/bin/ptqkit bench kernels --kernels w8a16 --m 1 8 --runs 50 2>&1 | tee "$out/bench-kernels-w8.log"
fi
if [ -n "${WG:-}" ]; then   # WGM: the rows (default 32,64,128); WGSHAPES: the shapes (default the nine of PATHS2)
  PTQKIT_A16_PATHS=wgmma .device/bin/ptqkit bench kernels --kernels w4a16,w8a16,nf4 --m ${WGM:-32,64,128} --runs 50 \
    --shapes ${WGSHAPES:-$SHAPES9} > "$out/bench-kernels-wg.log" 2>&1
fi
if [ -n "${PATH32:-}" ]; then
  PTQKIT_A16_PATHS=mma,shared_x,wgmma PTQKIT_A16_SWEEP="0:1,0:2,0:4,0:8,0:16,2:0,1:0" .device/bin/ptqkit bench kernels --kernels w4a16,w8a16,nf4 --m 32 --runs 30 \
    --shapes 12288x4096 22016x4096 4096x4096 4096x11008 > "$out/bench-kernels-path32.log" 2>&1
fi
if [ -n "${PATHS2:-}" ]; then
  PTQKIT_A16_PATHS=mma,shared_x,wgmma PTQKIT_A16_SWEEP="2:0" .device/bin/ptqkit bench kernels --kernels w4a16,w8a16,nf4 --m 17,32,64 --runs 30 \
    --shapes $SHAPES9 > "$out/bench-kernels-paths2.log" 2>&1
fi
if [ -z "${NOTEST:-}" ]; then
  timeout 400 .device/bin/test_cuda 2>&1 | tee "$out/test_cuda.log" | tail -4
fi
