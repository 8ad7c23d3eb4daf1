#!/usr/bin/env bash
# GPU training-step benchmark: GPT-2 124M (L=12, C=768, NH=12, V=50257 padded to 50304, T=1024),
# B=16, random tokens, bf16 mixed precision, 50 timed steps after 5 warmup steps (forward,
# backward, device grad norm + clip, AdamW, bf16 refresh). Prints one JSON line
# {tokens_per_s, ms_per_step, mfu, peak_mem_gib, allocator_misses_steady_state, ...} for MTP D=0,
# then one for D=1. Extra flags pass through to both (e.g. --precision fp32, --steps 20).
#
# Uses a prebuilt binary when there is one next to this script or in .gpubin/ (GPU machines have
# no Bazel: scripts/gpu_tests.sh copies it there); otherwise builds it with Bazel.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin=""
for cand in "$here/bench_gpu" "$here/../.gpubin/bench_gpu"; do
  if [[ -x "$cand" ]]; then bin="$cand"; break; fi
done
if [[ -z "$bin" ]]; then
  cd "$here/.."
  bazel build //tests/trainer:bench_gpu >/dev/null 2>&1 || bazel build //tests/trainer:bench_gpu
  bin="$PWD/bazel-bin/tests/trainer/bench_gpu"
fi
common=(--L 12 --C 768 --NH 12 --V 50257 --T 1024 --B 16 --steps 50 --warmup 5)
"$bin" "${common[@]}" --D 0 "$@"
"$bin" "${common[@]}" --D 1 "$@"
