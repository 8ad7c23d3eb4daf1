#!/usr/bin/env bash
# Per-kernel GPU time of gtron's training step: Nsight Compute (`ncu --clock-control none`, the
# card's clocks left alone) over bench_gpu's steps with graphs off (every kernel launched eagerly),
# then a table per kernel name: ms per step, share of the step, launches per step. The first
# step (warmup: cuBLASLt's heuristics, allocator growth) is skipped by kernel count.
#
#   scripts/profile_gpu.sh [--D 1] [--L 12 ...]      extra flags pass through to bench_gpu
#
# Environment: GTRON_PROFILE_STEPS (profiled steps, default 2), GTRON_PROFILE_OUT (the raw CSV,
# default /tmp/gtron_profile.csv), GTRON_PROFILE_CACHE (ncu's --cache-control: `all`, the default,
# flushes the caches before every kernel, so bandwidth-bound kernels read cold; `none` leaves them
# as the previous kernel left them, closer to a real step). Prints the table, then one JSON line
# with the totals.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$("$here/bench_gpu_bin.sh")"
steps="${GTRON_PROFILE_STEPS:-2}"
csv="${GTRON_PROFILE_OUT:-/tmp/gtron_profile.csv}"
cache="${GTRON_PROFILE_CACHE:-all}"
args=(--L 12 --C 768 --NH 12 --V 50257 --T 1024 --B 16 --graphs none "$@")
# Kernels of one step: count them in a run of one warmup step and one timed step, under ncu's
# cheapest metric, then profile warmup + `steps` steps and keep the last `steps` steps' kernels.
ncu --clock-control none --cache-control "$cache" --metrics gpu__time_duration.sum --csv --print-units base \
  "$bin" "${args[@]}" --warmup 1 --steps "$steps" >"$csv" 2>/dev/null
python3 "$here/profile_table.py" "$csv" --steps "$steps"
