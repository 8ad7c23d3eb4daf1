#!/usr/bin/env bash
# Parameter, gradient and optimizer bytes per rank of a 4-layer C=512 GPT (V=50304, T=1024) at
# GTP = 1, 2, 4 (CPU, ranks as threads over Gloo). Prints one JSON object. Sharded weights scale
# as 1/G (plus zero padding of dim 0 to a multiple of G); norms, biases and positions stay whole.
# Optional arguments: L C V GMAX (GTP sizes 1, 2, 4, ... up to GMAX; default 4). GPT-2 124M shape
# up to G=8: scripts/bench_gtp_memory.sh 12 768 50304 8 (about 9 GB of host memory).
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //tests/parallel:bench_gtp_memory >/dev/null 2>&1 || bazel build //tests/parallel:bench_gtp_memory
exec bazel-bin/tests/parallel/bench_gtp_memory "$@"
