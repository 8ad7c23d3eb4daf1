#!/usr/bin/env bash
# Parameter, gradient and optimizer bytes per rank of a 4-layer C=512 GPT (NH=8, V=50304, T=1024)
# for every layout TP x GTP with TP·G = 1, 2, 4 (CPU, ranks as threads over Gloo). Prints one JSON
# object. The sharded weights (every matrix but the positions) scale as 1/(TP·G), plus zero padding
# of dim 0 to a multiple of G; norms, positions and row-parallel biases stay whole.
# Optional arguments: L C V MAX (TP·G = 1, 2, 4, ... up to MAX; default 4). GPT-2 124M shape up to
# TP·G = 8: scripts/bench_gtp_memory.sh 12 768 50304 8 (about 9 GB of host memory).
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //tests/parallel:bench_gtp_memory >/dev/null 2>&1 || bazel build //tests/parallel:bench_gtp_memory
exec bazel-bin/tests/parallel/bench_gtp_memory "$@"
