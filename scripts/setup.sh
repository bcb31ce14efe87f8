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
