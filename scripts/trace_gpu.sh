#!/usr/bin/env bash
# The GPU timeline of gtron's training step, launch by launch: bench_gpu (graphs full by default,
# so it is the step as trained) runs under the CUPTI injection library of
# tests/trainer/kernel_trace.cc, which records every kernel, memset and copy with its start and
# end on the GPU, graph replays included; scripts/trace_table.py then prints the largest idle gaps
# (by the ops around them), every op's time per step, and one JSON line: ms per step, busy and
# idle time, kernel, memset and copy time and counts per step. Unlike scripts/profile_gpu.sh (ncu,
# one kernel at a time) it shows what lies between kernels.
#
#   scripts/trace_gpu.sh [--D 1] [--graphs layers] [bench_gpu flags]
#
# Environment: GTRON_TRACE_STEPS (steps summarized, the last ones; default 10), GTRON_TRACE_OUT
# (the raw trace, default /tmp/gtron_trace.tsv). The library is found next to bench_gpu (.gpubin/,
# where scripts/gpu_tests.sh puts it with the CUPTI it needs in .gpubin/lib) or built with Bazel.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$("$here/bench_gpu_bin.sh")"
lib="$(dirname "$bin")/libkernel_trace.so"
if [[ ! -f "$lib" ]]; then
  (cd "$here/.." && bazel build //tests/trainer:libkernel_trace.so >&2)
  lib="$here/../bazel-bin/tests/trainer/libkernel_trace.so"
fi
lib="$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")"
steps="${GTRON_TRACE_STEPS:-10}"
out="${GTRON_TRACE_OUT:-/tmp/gtron_trace.tsv}"
table="$here/trace_table.py"
args=(--L 12 --C 768 --NH 12 --V 50257 --T 1024 --B 16 --graphs full --warmup 5
  --steps $((steps + 5)) "$@")
CUDA_INJECTION64_PATH="$lib" GTRON_KTRACE_OUT="$out" "$bin" "${args[@]}" >&2
python3 "$table" "$out" --steps "$steps"
