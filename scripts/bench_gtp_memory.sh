#!/usr/bin/env bash
# Parameter, gradient and optimizer bytes per rank of a 4-layer C=512 GPT (V=50304, T=1024) at
# GTP = 1, 2, 4 (CPU, ranks as threads over Gloo). Prints one JSON object. Sharded weights scale
# as 1/G (plus zero padding of dim 0 to a multiple of G); norms, biases and positions stay whole.
# Optional arguments: L C V.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //tests/parallel:bench_gtp_memory >/dev/null 2>&1 || bazel build //tests/parallel:bench_gtp_memory
exec bazel-bin/tests/parallel/bench_gtp_memory "$@"
