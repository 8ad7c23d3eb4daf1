#!/usr/bin/env bash
# Installs everything gtron needs on a fresh Debian 12 machine of this image (idempotent: quiet when
# all is present; loud and non-zero on failure). Run as root (CI and the dev machines are root).
set -euo pipefail

PACKAGES=(
  bazel-bootstrap      # Bazel 4.2.3
  bazel-rules-java     # local rules_java for Bazel 4 offline
  bazel-platforms      # local platforms for Bazel 4 offline
  libeigen3-dev
  libcli11-dev
  nlohmann-json3-dev
  libgtest-dev
  libgloo-dev
  libpcre2-dev         # the tokenizer's pre-tokenization regex (Unicode properties, JIT)
  libicu-dev           # NFC normalization for tokenizer.json files that ask for it (Qwen2's)
  zlib1g-dev           # prepare/tokenizer train: .jsonl.gz input
  libzstd-dev          # prepare/tokenizer train: .jsonl.zst input
  fortunes             # English text for the fortunes example (configs/fortunes.json)
  python3-matplotlib   # scripts/plot_metrics.py (Debian python: /usr/bin/python3)
  python3-numpy
  xz-utils             # tar -J: the GPU packs (gpu_tests.sh, bench_ab_pack.sh) and bench_ab_test
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: need root to apt-get install: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/tmp/gtron-apt-update.log 2>&1 || {
    cat /tmp/gtron-apt-update.log >&2
    echo "setup: apt-get update failed" >&2
    exit 1
  }
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/gtron-apt-install.log 2>&1 || {
    tail -50 /tmp/gtron-apt-install.log >&2
    echo "setup: apt-get install failed for: ${missing[*]}" >&2
    exit 1
  }
fi

# The CUDA 13 toolkit is part of the machine image (it is not an apt package here).
if [[ ! -x /usr/local/cuda/bin/nvcc || ! -f /usr/local/cuda/include/nccl.h ]]; then
  echo "setup: CUDA 13 toolkit with NCCL expected at /usr/local/cuda (nvcc, nccl.h) but not found" >&2
  exit 1
fi
for d in /usr/share/bazel/rules/java /usr/share/bazel/tools/platforms; do
  [[ -d $d ]] || { echo "setup: expected $d from the Debian bazel packages" >&2; exit 1; }
done
