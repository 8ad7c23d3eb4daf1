#!/usr/bin/env bash
# GPU training-step benchmark: GPT-2 124M (L=12, C=768, NH=12, V=50257 padded to 50304, T=1024),
# B=16, random tokens, bf16 mixed precision, 50 timed steps after 5 warmup steps (forward,
# backward, device grad norm + clip, AdamW, bf16 refresh). Prints one JSON line
# {tokens_per_s, ms_per_step, mfu, peak_mem_gib, allocator_misses_steady_state, ...} for MTP D=0,
# then one for D=1, each with graphs.scope none, layers and full (issue: graphs; the field "graphs"
# says which). Extra flags pass through to every run (e.g. --precision fp32, --steps 20);
# GTRON_BENCH_GRAPHS="none" limits the scopes. Last, a launch-bound small model (L=4, C=256, NH=4,
# V=256, T=256, B=8, 200 steps) with each scope: where graphs pay off most.
#
# `--compare` instead runs gtron (graphs full) and scripts/bench_torch.py (torch.compile)
# alternately, two rounds, for D = 0 and D = 1, then PyTorch eager once per D, and prints every
# JSON line plus {"ratio_vs_torch_compile": gtron / torch.compile tokens/s, "D", "round"} lines.
# Remaining flags pass through to both (same spelling: --B, --T, --L, --C, --NH, --V, --steps, and
# the family's: --arch gpt2|llama, --NKV, --HS, --F, --qk-norm 0|1, --tied 0|1, --rope-theta; see
# tests/trainer/bench_gpu.cc and scripts/bench_torch.py); GTRON_COMPARE_ROUNDS (2) and
# GTRON_COMPARE_D ("0 1") narrow it, GTRON_COMPARE_EAGER=0 leaves out the eager runs, e.g. for
# GPT-2 350M:
#   GTRON_COMPARE_ROUNDS=1 GTRON_COMPARE_D=0 scripts/bench_gpu.sh --compare --L 24 --C 1024 --NH 16
# and for the llama family's two reference shapes, a Llama-3.2-1B (tied, vocab 50304) and a
# Qwen3-0.6B (head size 128, q/k norms, tied, vocab 50304):
#   GTRON_COMPARE_EAGER=0 scripts/bench_gpu.sh --compare --arch llama --L 16 --C 2048 --NH 32 \
#     --NKV 8 --HS 64 --F 8192 --B 8
#   GTRON_COMPARE_EAGER=0 scripts/bench_gpu.sh --compare --arch llama --L 28 --C 1024 --NH 16 \
#     --NKV 8 --HS 128 --F 3072 --qk-norm 1 --rope-theta 1000000 --B 8
# A failing bench_torch.py (a bad flag, a PyTorch without enable_gqa) stops the script with the
# tail of its stderr, which a good run's line leaves out (torch.compile's warnings).
#
# The binary: scripts/bench_gpu_bin.sh (prebuilt next to this script or in .gpubin/, else Bazel).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$("$here/bench_gpu_bin.sh")"
common=(--L 12 --C 768 --NH 12 --V 50257 --T 1024 --B 16 --steps 50 --warmup 5)
if [[ "${1:-}" == "--compare" ]]; then
  shift
  torch_py="$here/bench_torch.py"
  [[ -f "$torch_py" ]] || torch_py="$here/../scripts/bench_torch.py"
  torch_err="$(mktemp)"
  trap 'rm -f "$torch_err"' EXIT
  torch_run() {  # bench_torch.py's JSON line; on failure the tail of its stderr, then exit 1
    local line
    if ! line=$(python3 "$torch_py" "$@" 2>"$torch_err" | tail -1); then
      echo "bench_gpu.sh: bench_torch.py $* failed:" >&2
      tail -20 "$torch_err" >&2
      exit 1
    fi
    echo "$line"
  }
  for round in $(seq 1 "${GTRON_COMPARE_ROUNDS:-2}"); do
    for d in ${GTRON_COMPARE_D:-0 1}; do
      g_line=$("$bin" "${common[@]}" --D "$d" --graphs full "$@")
      echo "$g_line"
      t_line=$(torch_run --mode compile --D "$d" "${common[@]}" "$@")
      echo "$t_line"
      python3 -c 'import json,sys; g,t=json.loads(sys.argv[1]),json.loads(sys.argv[2]); print(json.dumps({"ratio_vs_torch_compile": round(g["tokens_per_s"]/t["tokens_per_s"],4), "arch": g.get("arch", "gpt2"), "D": int(sys.argv[3]), "round": int(sys.argv[4]), "gtron_peak_gib": g["peak_mem_gib"], "torch_compile_peak_gib": t["peak_mem_gib"]}))' "$g_line" "$t_line" "$d" "$round"
    done
  done
  if [[ "${GTRON_COMPARE_EAGER:-1}" != "0" ]]; then
    for d in ${GTRON_COMPARE_D:-0 1}; do
      torch_run --mode eager --D "$d" "${common[@]}" "$@"
    done
  fi
  exit 0
fi
for d in 0 1; do
  for g in ${GTRON_BENCH_GRAPHS:-none layers full}; do
    "$bin" "${common[@]}" --D "$d" --graphs "$g" "$@"
  done
done
for g in ${GTRON_BENCH_GRAPHS:-none layers full}; do
  "$bin" --L 4 --C 256 --NH 4 --V 256 --T 256 --B 8 --steps 200 --warmup 5 --graphs "$g" "$@"
done
