#!/usr/bin/env bash
# CPU baseline: forward + backward of GPT L=4, C=256, NH=4, T=256, B=8, V=256 (10 timed steps after
# 2 warmups). Prints one JSON line {tokens_per_s, ms_per_step, ...}. Extra flags pass through
# (e.g. --D 1 for one MTP depth, --steps 20).
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //tests/model:bench_cpu >/dev/null 2>&1 || bazel build //tests/model:bench_cpu
exec bazel-bin/tests/model/bench_cpu --L 4 --C 256 --NH 4 --T 256 --B 8 --V 256 "$@"
