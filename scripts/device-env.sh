# Sourced by the scripts that run on the GPU machine (device-run.sh, device-check.sh,
# device-compare.sh): the repository root, the log folder $out ($OUT there, else runs/device), the
# gathered libraries and assets (.device/, from scripts/device-build.sh), and the GPU's name.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-runs/device}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PTQKIT_ASSETS=$PWD/.device/assets
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$out/gpu.txt"
