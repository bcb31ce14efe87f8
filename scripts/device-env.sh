# Sourced by the scripts that run on the GPU machine (device-run.sh, device-check.sh,
# device-compare.sh): the repository root, the log folder $out ($OUT there, else runs/device), the
# gathered libraries and assets (.device/, from scripts/device-build.sh), and the GPU's name.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-runs/device}
mkdir -p "$out"
for z in .device/bin/*.gz .device/base/*.gz; do   # scripts/device-build.sh packs the binaries (the carry limit)
  [ -e "$z" ] && gzip -dc "$z" > "${z%.gz}" && chmod +x "${z%.gz}"
done
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PTQKIT_ASSETS=$PWD/.device/assets
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$out/gpu.txt"
# NCCL (quantize --gpus N): the image's own library, wherever it is installed.
for d in /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib /usr/local/cuda/lib64 $(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null); do
  if [ -e "$d/libnccl.so.2" ]; then export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d; break; fi
done
export NCCL_NVLS_ENABLE=0   # NVLink multicast stays off on these machines
