#!/usr/bin/env bash
# Prints the path of the bench_gpu binary for scripts/bench_gpu.sh and scripts/profile_gpu.sh: a
# prebuilt one next to this script or in .gpubin/ (GPU machines have no Bazel:
# scripts/gpu_tests.sh copies it there), else one built with Bazel.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
for cand in "$here/bench_gpu" "$here/../.gpubin/bench_gpu"; do
  if [[ -x "$cand" ]]; then
    echo "$cand"
    exit 0
  fi
done
cd "$here/.."
bazel build //tests/trainer:bench_gpu >/dev/null 2>&1 || bazel build //tests/trainer:bench_gpu >&2
echo "$PWD/bazel-bin/tests/trainer/bench_gpu"
