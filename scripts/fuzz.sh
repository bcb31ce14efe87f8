#!/usr/bin/env bash
# Builds the libFuzzer targets with clang + ASan + UBSan into build-fuzz/ and runs each for
# SECONDS (default 10: the short CI run; docs/fuzzing.md gives the longer runs). Corpora start from
# fuzz/corpus/<target>/ and grow in build-fuzz/corpus/<target>/; a crash input is written to
# build-fuzz/crashes/ and the script exits non-zero. Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}; shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors config recipe tokenizer_json sentencepiece gguf packed pytorch_bin)
if ! command -v clang++ >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "PTQKIT_SKIP: clang or libFuzzer missing (scripts/setup.sh installs clang and libclang-rt-14-dev)"; exit 0
fi
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
if ! grep -qsE '^CMAKE_UNITY_BUILD:[A-Z]+=ON' build-fuzz/CMakeCache.txt; then
  # -O1 (what the sanitizers' own docs build with) and line tables only (CMakeLists.txt): reports
  # keep their file:line stacks, and the build, most of this script's time in CI, is ~18% shorter
  # than at -O2 -g. A unity build (up to 8 of a library's files one translation unit): 239 CPU-s
  # where one unit a file took 385 (docs/lab/2026-12-01-ci-time.md). Only crashes count here, so
  # the rounding a joined unit may move (docs/architecture.md) does not matter to this build.
  CC=clang CXX=clang++ cmake -S . -B build-fuzz "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -DNDEBUG" -DPTQKIT_FUZZ=ON -DPTQKIT_CUDA=OFF \
    -DBUILD_TESTING=OFF -DPTQKIT_NATIVE=OFF -DCMAKE_UNITY_BUILD:BOOL=ON >/dev/null
fi
cmake --build build-fuzz --parallel "$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}") >/dev/null
mkdir -p build-fuzz/crashes
status=0
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t"
  seeds=(); [ -d "fuzz/corpus/$t" ] && seeds=("fuzz/corpus/$t")
  # SentencePiece models are not ours to commit: seed from the shared assets when they are there.
  sp="${PTQKIT_ASSETS:-../shared/assets}/models/stories260k/tokenizer.model"
  [ "$t" = sentencepiece ] && [ -f "$sp" ] && cp "$sp" "build-fuzz/corpus/$t/stories260k.model"
  # torch.save files too: a real shard, the legacy layout and the two hostile pickles.
  bins="${PTQKIT_ASSETS:-../shared/assets}"
  if [ "$t" = pytorch_bin ] && [ -d "$bins/bad" ]; then
    cp "$bins"/bad/*.bin "build-fuzz/corpus/$t/" 2>/dev/null || true
    cp "$bins"/models/llama2xs-bin/pytorch_model-00002-of-00002.bin "build-fuzz/corpus/$t/" 2>/dev/null || true
  fi
  log="build-fuzz/fuzz_$t.log"
  if ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 "build-fuzz/bin/fuzz_$t" "build-fuzz/corpus/$t" "${seeds[@]}" \
       -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=131072 -artifact_prefix="build-fuzz/crashes/${t}-" >"$log" 2>&1; then
    echo "fuzz $t: $(grep -aEo '#[0-9]+' "$log" | tail -1 | tr -d '#') runs in ${secs}s, no crash"
  else
    echo "fuzz $t: FAILED (see $log; inputs in build-fuzz/crashes/)"; tail -30 "$log"; status=1
  fi
done
exit $status
