#!/usr/bin/env bash
# Installs what ptqkit needs to build and test, with apt-get, only when something is missing.
# A no-op (no apt-get call at all) when every package is already installed.
set -euo pipefail
pkgs=(g++ cmake ninja-build pkg-config libomp-dev libeigen3-dev libcli11-dev catch2
      libyaml-cpp-dev nlohmann-json3-dev libsentencepiece-dev libssl-dev
      jq                  # normalizes report.json before hashing (scripts/output-hashes.sh)
      chromium            # renders report.html in a test (tests/test_report.cpp)
      clang libclang-rt-14-dev)   # libFuzzer + ASan/UBSan targets (fuzz/)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# llama.cpp for the client tests (tests/test_client.cpp): node-llama-cpp's prebuilt CPU library
# from the npm registry, into .client/ (ignored by git), never built from source. Needs node
# (Debian's nodejs) and npm. Where either is absent or the registry cannot be reached, those tests
# report "skipped" saying why; nothing else depends on them.
client=$(cd "$(dirname "$0")/.." && pwd)/.client
if [ ! -f "$client/node_modules/@node-llama-cpp/linux-x64/package.json" ] && command -v npm >/dev/null && command -v node >/dev/null; then
  echo "setup: installing node-llama-cpp 3.22.1 (llama.cpp, prebuilt) into $client" >&2
  mkdir -p "$client"
  (cd "$client" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true timeout 600 npm install --silent --no-audit --no-fund --omit=optional \
     node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1 >/dev/null 2>&1) ||
    echo "setup: node-llama-cpp could not be installed; the client tests will be skipped" >&2
fi
