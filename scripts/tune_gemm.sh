#!/usr/bin/env bash
# Times cuBLASLt's heuristic candidates for every GEMM problem of a bench_gpu step (tune mode,
# GTRON_GEMM_TUNE=1; Note [pinned GEMM algorithms] in model/cuda/gemm_table.h) and prints:
#   1. one JSON line {"tune_summary": ...}: over the distinct problems, the summed median µs of
#      heuristic result 0, of the fastest candidate and of the chosen one (the fastest when at
#      least 3% faster than result 0), and per run the GEMM ms per step with result 0 vs the
#      chosen ones (each problem weighted by its calls per step);
#      ("result0_not_default" counts problems where result 0 of 16 is not the algorithm a plain
#      run takes, i.e. us0 is not today's time: it should be 0);
#   2. one JSON line per distinct problem (shape, flags, µs of every candidate, calls per step);
#   3. the entries to paste into model/cuda/gemm_tuned.inc (problems whose choice is not 0).
# Runs GPT-2 124M (B=16, T=1024, bf16) at MTP D=0 and D=1, eager (graphs none), one warmup and
# one timed step; `--with-350m` adds GPT-2 350M (L=24, C=1024, NH=16, B=8); `--with-llama` adds
# the llama family's two bench shapes (Llama-3.2-1B: L=16, C=2048, 32 heads, 8 k/v heads of 64,
# SwiGLU 8192; Qwen3-0.6B: L=28, C=1024, 16 heads, 8 k/v heads of 128, SwiGLU 3072, q/k norms;
# both B=8, D=0) and `--only-llama` runs those alone. `--sustain MS` runs each candidate back to
# back for MS milliseconds before timing it (GTRON_GEMM_TUNE_SUSTAIN_MS: the ranking at the clock
# of a power-capped step; Note [GEMM choice under the power cap] in model/cuda/gemm_tune.cu).
# `--table-out FILE` also writes one entry per problem (result 0 included) to FILE, for GTRON_GEMM_TABLE_FILE=FILE (try
# the table without rebuilding). Other flags pass through to bench_gpu. The binary: scripts/bench_gpu_bin.sh (prebuilt next to this script or in
# .gpubin/, else Bazel). GPU machine only.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$("$here/bench_gpu_bin.sh")"
with_350m=0
llama=0  # 1: --with-llama, 2: --only-llama
extra=()
sustain=0
table_out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --with-350m) with_350m=1 ;;
    --with-llama) llama=1 ;;
    --only-llama) llama=2 ;;
    --sustain | --table-out)
      if [[ $# -lt 2 ]]; then
        echo "tune_gemm.sh: $1 needs a value" >&2
        exit 2
      fi
      if [[ $1 == --sustain ]]; then sustain=$2; else table_out=$2; fi
      shift ;;
    *) extra+=("$1") ;;
  esac
  shift
done
steps=(--warmup 1 --steps 1 --graphs none)  # every step eager: the calls per step are counted
runs=("124M_D0|--L 12 --C 768 --NH 12 --B 16 --D 0" "124M_D1|--L 12 --C 768 --NH 12 --B 16 --D 1")
if [[ $with_350m -eq 1 ]]; then runs+=("350M_D0|--L 24 --C 1024 --NH 16 --B 8 --D 0"); fi
llama_runs=("llama1B_D0|--arch llama --L 16 --C 2048 --NH 32 --NKV 8 --HS 64 --F 8192 --B 8 --D 0"
  "qwen3_D0|--arch llama --L 28 --C 1024 --NH 16 --NKV 8 --HS 128 --F 3072 --qk-norm 1 --B 8 --D 0")
if [[ $llama -eq 2 ]]; then runs=(); fi
if [[ $llama -ge 1 ]]; then runs+=("${llama_runs[@]}"); fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for r in "${runs[@]}"; do
  name="${r%%|*}"
  read -r -a shape <<<"${r#*|}"
  # bench_gpu takes the last occurrence of a flag: the steps stay as set here.
  if ! GTRON_GEMM_TUNE=1 GTRON_GEMM_TUNE_SUSTAIN_MS=$sustain "$bin" --V 50257 --T 1024 "${shape[@]}" "${extra[@]}" "${steps[@]}" \
    >"$tmp/$name.out" 2>"$tmp/$name.err"; then
    echo "tune_gemm.sh: bench_gpu failed for $name:" >&2
    tail -20 "$tmp/$name.err" >&2
    exit 1
  fi
done
python3 - "$tmp" 2 "$table_out" "${runs[@]%%|*}" <<'EOF'
import json, sys

tmp, steps_per_run, table_out, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
problems = {}  # key tuple -> the first run's gemm-tune record
calls = {}  # run -> key tuple -> calls per step
conflicts = 0
for name in names:
    calls[name] = {}
    for line in open(f"{tmp}/{name}.err"):
        if line.startswith("gemm-tune "):
            rec = json.loads(line[len("gemm-tune "):])
            key = tuple(rec["key"])
            if key in problems:
                conflicts += problems[key]["chosen"] != rec["chosen"]
            else:
                rec["first_run"] = name
                problems[key] = rec
        elif line.startswith("gemm-tune-calls "):
            rec = json.loads(line[len("gemm-tune-calls "):])
            calls[name][tuple(rec["key"])] = rec["calls"] / steps_per_run

per_run = {}
for name in names:
    first = sum(n * problems[k]["us0"] for k, n in calls[name].items() if k in problems)
    chosen = sum(n * problems[k]["chosen_us"] for k, n in calls[name].items() if k in problems)
    best = sum(n * problems[k]["best_us"] for k, n in calls[name].items() if k in problems)
    per_run[name] = {"gemm_ms_per_step_result0": round(first / 1e3, 3),
                     "gemm_ms_per_step_chosen": round(chosen / 1e3, 3),
                     "gemm_ms_per_step_best": round(best / 1e3, 3),
                     "problems": len(calls[name])}
recs = list(problems.values())
picked = [r for r in recs if r["chosen"] != 0]
print(json.dumps({"tune_summary": {
    "distinct_problems": len(recs),
    "us0_total": round(sum(r["us0"] for r in recs), 2),
    "best_us_total": round(sum(r["best_us"] for r in recs), 2),
    "chosen_us_total": round(sum(r["chosen_us"] for r in recs), 2),
    "problems_not_result0": len(picked),
    "choice_differed_between_runs": conflicts,
    "result0_not_default": sum(not r["result0_is_default"] for r in recs),
    "per_run": per_run}}))
for key, r in problems.items():
    out = {k: r[k] for k in ("m", "n", "k", "batch", "trans_a", "trans_b", "ab", "c", "epilogue",
                             "bias", "beta0", "candidates", "us0", "best_us", "best", "chosen",
                             "chosen_us", "result0_is_default", "us", "first_run")}
    out["calls_per_step"] = {n: calls[n].get(key, 0) for n in names}
    print(json.dumps(out))
print(f"// {len(picked)} entries for model/cuda/gemm_tuned.inc:")
for r in picked:
    flags = " ".join(f for f, on in (("trans_a", r["trans_a"]), ("trans_b", r["trans_b"]),
                                     ("bias", r["bias"]), ("beta1", not r["beta0"])) if on)
    print(f'// {r["m"]}x{r["n"]}x{r["k"]} batch {r["batch"]} {r["ab"]}->{r["c"]} {r["epilogue"]} '
          f'{flags}: {r["us0"]:.1f} -> {r["chosen_us"]:.1f} us')
    print(r["entry"])
if table_out:
    with open(table_out, "w") as f:
        # Every problem, result 0 included: the file overrides the committed table for each.
        f.write("".join(r["entry"] + "\n" for r in recs))
EOF
