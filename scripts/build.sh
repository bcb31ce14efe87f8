#!/usr/bin/env bash
# Installs missing packages (scripts/setup.sh), configures and builds ptqkit into build/.
# Extra arguments go to CMake (e.g. -DPTQKIT_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
elif [ $# -gt 0 ]; then
  cmake -S . -B build "$@" >/dev/null
fi
# PTQKIT_TARGETS: build only these (scripts/run.sh needs the binary alone)
cmake --build build --parallel "$(nproc)" ${PTQKIT_TARGETS:+--target $PTQKIT_TARGETS}
