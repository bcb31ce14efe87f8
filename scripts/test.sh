#!/usr/bin/env bash
# Builds ptqkit and runs every test through CTest. Tests that need ../shared/assets or a GPU
# report "skipped" when those are absent. Extra arguments go to ctest (e.g. -L gpu, -R gptq).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# Passive OpenMP waiting: two test processes share the cores without spinning against each other.
export OMP_WAIT_POLICY=passive
ctest --test-dir build --output-on-failure --parallel 2 "$@"
