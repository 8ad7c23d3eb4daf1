#!/usr/bin/env bash
# Issue 50, acceptance 3, in one GPU command: gtron's mixture of experts against a PyTorch
# torch.compile MoE whose experts run through torch._grouped_mm (scripts/bench_torch.py with
# scripts/bench_torch_moe.py), on one GPU, at a Qwen3-MoE shape that fits one 80 GB card:
#   L=12, C=2048, NH=16, NKV=4, HS=128 (q/k norms, RoPE base 1e6), 64 experts, top 8, expert
#   width 768, no shared expert, softmax router with the top-8 gates renormalized; vocab 50304,
#   tied (Qwen's 151936 untied head would add 0.52B parameters, about 9 GiB of weights, grads,
#   AdamW moments and shadows, which the card does not have beside this model's 3.9B); T=1024,
#   B=4 (GTRON_MOE_B); the dense MLP width F=6144 (Qwen3-30B-A3B's) serves the MTP depth only.
# In order: the card (nvidia-smi), bench_torch.py --check (the grouped_mm layer against a loop
# over the experts, fp32 and bf16, compiled against eager; its "align_ok" and "compile_ok" pick
# the PyTorch side's --moe-align and --moe-compile-experts), then GTRON_MOE_ROUNDS (2) rounds of,
# for D in GTRON_MOE_D ("0 1"): gtron (bench_gpu, graphs GTRON_MOE_GRAPHS, default full; none
# while the full graph of this shape does not instantiate) and torch.compile, alternating,
# each JSON line printed, then {"ratio_vs_torch_compile", ...}; last, one summary line per D with
# the acceptance: tokens/s ratio >= 1.30 in every round and gtron's peak <= PyTorch's.
# 20 timed steps after 5 warm-up steps each (a first --steps N changes both). Extra flags pass to
# both runs (bench_gpu's spelling, e.g. --B 2; the last occurrence of a flag wins in both). A run
# that fails prints {"system", "error", ...} and the tail of its standard error; the others still
# run; the exit status is then 1. A torch.compile run that fails with the experts in the graph is
# retried once with --moe-compile-experts 0 (the experts outside it), and the later runs keep it.
#
#   scripts/bench_moe.sh --pack     here: bench_gpu into .gpubin/moe/ (stripped, with the shared
#                                   libraries a GPU machine may lack); carry .gpubin/moe there
#   scripts/bench_moe.sh [FLAGS]    on the GPU machine, from anywhere in the repository
#
# The binary: $GTRON_BIN/bench_gpu, else .gpubin/moe/, else .gpubin/, else Bazel's; its lib/
# folder goes on the binary's LD_LIBRARY_PATH only (PyTorch keeps the machine's libraries).
# GTRON_TORCH_PY and GTRON_PYTHON replace bench_torch.py and python3 (tests);
# GTRON_MOE_CHECK=0 leaves out the check (a later command on a machine that passed it);
# GTRON_MOE_PACKED (1) is gtron's --packed-masters (train.packed_masters: the bf16 weight copies
# inside the fp32 masters' bytes, 16 bytes a parameter as PyTorch's AdamW holds).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"

if [[ "${1:-}" == "--pack" ]]; then
  [[ $# -eq 1 ]] || { echo "usage: scripts/bench_moe.sh --pack" >&2; exit 2; }
  cd "$root" || exit 1
  set -e
  bazel build //tests/trainer:bench_gpu
  mkdir -p .gpubin/moe
  cp bazel-bin/tests/trainer/bench_gpu .gpubin/moe/
  chmod u+w .gpubin/moe/bench_gpu
  strip --strip-unneeded .gpubin/moe/bench_gpu
  bash scripts/gpu_libs.sh .gpubin/moe/lib .gpubin/moe/bench_gpu
  du -sh .gpubin/moe
  exit 0
fi

bin=""
if [[ -n "${GTRON_BIN:-}" ]]; then  # that folder only
  [[ -x "$GTRON_BIN/bench_gpu" ]] || {
    echo "bench_moe.sh: no executable bench_gpu in GTRON_BIN=$GTRON_BIN" >&2
    exit 2
  }
  bin="$GTRON_BIN/bench_gpu"
fi
for cand in "$root/.gpubin/moe/bench_gpu" "$root/.gpubin/bench_gpu"; do
  if [[ -z "$bin" && -x "$cand" ]]; then
    bin="$cand"
  fi
done
if [[ -z "$bin" ]]; then
  (cd "$root" && { bazel build //tests/trainer:bench_gpu >/dev/null 2>&1 ||
    bazel build //tests/trainer:bench_gpu >&2; }) || exit 1
  bin="$root/bazel-bin/tests/trainer/bench_gpu"
fi
bin_libs="${LD_LIBRARY_PATH:-}"
if [[ -d "$(dirname "$bin")/lib" ]]; then
  bin_libs="$(dirname "$bin")/lib${bin_libs:+:$bin_libs}"
fi
torch_py="${GTRON_TORCH_PY:-$here/bench_torch.py}"
py="${GTRON_PYTHON:-python3}"

steps=20
if [[ "${1:-}" == "--steps" ]]; then
  steps="${2:?--steps needs a count}"
  shift 2
fi
shape=(--arch llama --L 12 --C 2048 --NH 16 --NKV 4 --HS 128 --F 6144 --qk-norm 1
  --rope-theta 1000000 --tied 1 --V 50304 --T 1024 --B "${GTRON_MOE_B:-4}"
  --moe-experts 64 --moe-top-k 8 --moe-width 768 --moe-router softmax --moe-norm-topk 1
  --steps "$steps" --warmup 5)
err="$(mktemp)"
trap 'rm -f "$err"' EXIT
failed=0

card="$(nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader 2>/dev/null |
  head -1)"
echo "card: ${card:-unknown (no nvidia-smi)}"

# json_field LINE EXPR: EXPR of the parsed JSON line j, printed (python3's json; "" on bad input).
json_field() {
  python3 -c 'import json, sys
try:
    j = json.loads(sys.argv[1])
    print(eval(sys.argv[2]))
except Exception:
    print("")' "$1" "$2"
}

# run NAME D ROUND TIMEOUT CMD...: CMD's last stdout line, echoed; on failure an error line and the
# tail of CMD's stderr, and the function returns 1. A line without "moe_experts" is a failure
# too: a bench_gpu built before its MoE flags ignores them and runs the dense model.
run() {
  local name=$1 d=$2 round=$3 limit=$4 line rc why
  shift 4
  line=$(timeout "$limit" "$@" 2>"$err" | tail -1)  # pipefail: the command's status
  rc=$?
  why="exit $rc"
  if [[ $rc -eq 0 && "$(json_field "$line" 'j["tokens_per_s"] > 0')" != "True" ]]; then
    why="exit 0 without a JSON line"
  elif [[ $rc -eq 0 && "$(json_field "$line" 'j["moe_experts"]')" != "64" ]]; then
    why="not a MoE run (a bench_gpu older than its --moe-* flags?)"
  elif [[ $rc -eq 0 ]]; then
    echo "$line"
    return 0
  fi
  echo "{\"system\": \"$name\", \"error\": \"$why\", \"D\": $d, \"round\": $round}"
  echo "bench_moe.sh: $name (D=$d, round $round) failed, $why:" >&2
  tail -20 "$err" >&2
  return 1
}

torch_flags=(--moe-align 1 --moe-compile-experts 1)
if [[ "${GTRON_MOE_CHECK:-1}" != "0" ]]; then
  echo "== check: the grouped_mm MoE against a loop over the experts"
  check_line=$(timeout 300 "$py" "$torch_py" --check 2>"$err" | tail -1)
  echo "$check_line"
  align="$(json_field "$check_line" '(j["align_ok"] or [1])[0]')"
  compiled="$(json_field "$check_line" 'j["compile_ok"] is not False')"
  if [[ "$(json_field "$check_line" 'j["ok"]')" != "True" ]]; then
    echo "bench_moe.sh: the check failed; its standard error ends:" >&2
    tail -20 "$err" >&2
    failed=1
  fi
  [[ "$compiled" == "False" ]] && compiled=0 || compiled=1
  torch_flags=(--moe-align "${align:-1}" --moe-compile-experts "$compiled")
fi

lines=()
for round in $(seq 1 "${GTRON_MOE_ROUNDS:-2}"); do
  for d in ${GTRON_MOE_D:-0 1}; do
    echo "== round $round, D=$d: gtron (graphs ${GTRON_MOE_GRAPHS:-full}), then torch.compile"
    g_line=$(run gtron "$d" "$round" 300 env LD_LIBRARY_PATH="$bin_libs" "$bin" "${shape[@]}" \
      --D "$d" --graphs "${GTRON_MOE_GRAPHS:-full}" --packed-masters "${GTRON_MOE_PACKED:-1}" \
      "$@") || failed=1
    echo "$g_line"
    t_line=$(run torch "$d" "$round" 420 "$py" "$torch_py" --mode compile --D "$d" \
      "${shape[@]}" "${torch_flags[@]}" "$@")
    t_rc=$?
    if [[ $t_rc -ne 0 && "${torch_flags[3]}" == "1" ]]; then
      echo "$t_line"
      echo "== retry: the experts outside the compiled graph (--moe-compile-experts 0)"
      torch_flags[3]=0
      t_line=$(run torch "$d" "$round" 420 "$py" "$torch_py" --mode compile --D "$d" \
        "${shape[@]}" "${torch_flags[@]}" "$@")
      t_rc=$?
    fi
    [[ $t_rc -eq 0 ]] || failed=1
    echo "$t_line"
    ratio=$(python3 -c 'import json, sys
g, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if "error" in g or "error" in t:
    raise SystemExit
r = g["tokens_per_s"] / t["tokens_per_s"]
print(json.dumps({"ratio_vs_torch_compile": round(r, 4), "D": int(sys.argv[3]),
                  "round": int(sys.argv[4]), "gtron_peak_gib": g["peak_mem_gib"],
                  "torch_compile_peak_gib": t["peak_mem_gib"], "moe_impl": t.get("moe_impl")}))' \
      "$g_line" "$t_line" "$d" "$round")
    if [[ -n "$ratio" ]]; then
      echo "$ratio"
      lines+=("$ratio")
    fi
  done
done

# One summary line per D over the rounds: the acceptance of issue 50 item 3.
python3 -c 'import json, sys
card, rows = sys.argv[1], [json.loads(l) for l in sys.argv[2:]]
for d in sorted({r["D"] for r in rows}):
    rs = [r for r in rows if r["D"] == d]
    ratios = [r["ratio_vs_torch_compile"] for r in rs]
    peak_ok = all(r["gtron_peak_gib"] <= r["torch_compile_peak_gib"] for r in rs)
    print(json.dumps({"summary": "moe", "card": card, "D": d, "rounds": len(rs),
                      "ratios": ratios, "min_ratio": min(ratios),
                      "gtron_peak_gib": max(r["gtron_peak_gib"] for r in rs),
                      "torch_compile_peak_gib": min(r["torch_compile_peak_gib"] for r in rs),
                      "speed_ok": min(ratios) >= 1.30, "peak_ok": peak_ok}))' \
  "${card:-unknown}" "${lines[@]}"
exit "$failed"
