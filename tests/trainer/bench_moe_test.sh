#!/usr/bin/env bash
# scripts/bench_moe.sh with a fake bench_gpu, a fake bench_torch.py and a fake nvidia-smi whose
# numbers are known: the check runs first and its "align_ok" / "compile_ok" choose the PyTorch
# flags; the runs alternate gtron, torch for D = 0 then 1, twice, with the Qwen3-MoE shape; the
# ratio lines and the per-D summary's acceptance; a torch.compile failure is retried once with the
# experts outside the graph; a failing run, or a line without the MoE (an old bench_gpu), gives an
# error line and exit 1. Then the real bench_gpu:
# the script's shape passes every MoE check (it stops only at the missing GPU, exit 1) and bad
# MoE flags exit 2 naming the problem.
set -euo pipefail
script="$1"
real_bench_gpu="$2"
dir="${TEST_TMPDIR:-/tmp}/bench_moe_test"
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/path"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
cat >"$dir/bin/bench_gpu" <<SH
#!/usr/bin/env bash
echo "gtron \$*" >>"$dir/calls.txt"
[[ -e "$dir/gtron_fails" ]] && { echo "out of memory" >&2; exit 3; }
[[ -e "$dir/gtron_dense" ]] && { echo '{"tokens_per_s": 9000.0, "peak_mem_gib": 1.0}'; exit 0; }
echo '{"tokens_per_s": 1300.0, "ms_per_step": 10.0, "peak_mem_gib": 60.5, "moe_experts": 64}'
SH
cat >"$dir/bench_torch.py" <<PY
import json, os, sys
args = sys.argv[1:]
with open("$dir/calls.txt", "a") as f:
    f.write("torch " + " ".join(args) + "\n")
if "--check" in args:
    print("compiling...", file=sys.stderr)
    print(json.dumps({"check": "moe_grouped_mm", "align_ok": [8], "compile_ok":
                      os.environ.get("FAKE_COMPILE_OK", "1") == "1", "ok": True}))
    sys.exit(0)
if os.path.exists("$dir/compile_fails") and "--moe-compile-experts" in args and \\
        args[args.index("--moe-compile-experts") + 1] == "1":
    print("torch._dynamo.exc.Unsupported: boom", file=sys.stderr)
    sys.exit(1)
print(json.dumps({"tokens_per_s": 1000.0, "ms_per_step": 13.0, "peak_mem_gib": 62.0,
                  "moe_experts": 64, "moe_impl": "grouped_mm"}))
PY
printf '#!/usr/bin/env bash\necho "NVIDIA H100 80GB HBM3, 81559 MiB, 700.00 W"\n' \
  >"$dir/path/nvidia-smi"
chmod +x "$dir/bin/bench_gpu" "$dir/path/nvidia-smi"
run_script() {  # the script against the fakes; stdout to $dir/out.txt, status returned
  PATH="$dir/path:$PATH" GTRON_BIN="$dir/bin" GTRON_TORCH_PY="$dir/bench_torch.py" \
    bash "$script" "$@" >"$dir/out.txt" 2>"$dir/err.txt"
}

: >"$dir/calls.txt"
run_script || fail "a good run exited $?: $(cat "$dir/err.txt")"
head -1 "$dir/out.txt" | grep -q "^card: NVIDIA H100 80GB HBM3" || fail "no card line"
python3 - "$dir/out.txt" "$dir/calls.txt" <<'PY'
import json, sys
out = [l for l in open(sys.argv[1]) if l.startswith("{")]
calls = [l.split() for l in open(sys.argv[2])]
assert json.loads(out[0])["check"] == "moe_grouped_mm", out[0]
assert calls[0] == ["torch", "--check"], calls[0]
order = [(c[0], c[c.index("--D") + 1]) for c in calls[1:]]
assert order == [("gtron", "0"), ("torch", "0"), ("gtron", "1"), ("torch", "1")] * 2, order
g, t = calls[1], calls[2]
for flag, value in [("--arch", "llama"), ("--L", "12"), ("--C", "2048"), ("--NH", "16"),
                    ("--NKV", "4"), ("--HS", "128"), ("--qk-norm", "1"), ("--V", "50304"),
                    ("--T", "1024"), ("--B", "4"), ("--moe-experts", "64"), ("--moe-top-k", "8"),
                    ("--moe-width", "768"), ("--steps", "20")]:
    for c in (g, t):
        assert c[c.index(flag) + 1] == value, (flag, c)
assert g[g.index("--graphs") + 1] == "full" and "--moe-align" not in g, g
assert t[t.index("--mode") + 1] == "compile", t
assert t[t.index("--moe-align") + 1] == "8", t  # the check's align_ok
assert t[t.index("--moe-compile-experts") + 1] == "1", t
ratios = [json.loads(l) for l in out if "ratio_vs_torch_compile" in l]
assert [(r["D"], r["round"]) for r in ratios] == [(0, 1), (1, 1), (0, 2), (1, 2)], ratios
assert all(r["ratio_vs_torch_compile"] == 1.3 and r["gtron_peak_gib"] == 60.5 for r in ratios)
summary = [json.loads(l) for l in out if '"summary"' in l]
assert [s["D"] for s in summary] == [0, 1], summary
s = summary[0]
assert s["ratios"] == [1.3, 1.3] and s["speed_ok"] and s["peak_ok"], s
assert s["card"].startswith("NVIDIA H100"), s
PY

# --steps first, extra flags last (they win), a check that finds compile broken.
: >"$dir/calls.txt"
FAKE_COMPILE_OK=0 GTRON_MOE_ROUNDS=1 GTRON_MOE_D=0 run_script --steps 7 --B 2 ||
  fail "exit $? with one round"
grep -q "^torch --mode compile --D 0 .*--steps 7 .*--moe-compile-experts 0 --B 2$" \
  "$dir/calls.txt" || fail "flags not passed on: $(cat "$dir/calls.txt")"
[[ $(grep -c '"summary"' "$dir/out.txt") -eq 1 ]] || fail "one D, one summary"

# torch.compile with the experts in the graph fails: retried once without, then kept so.
: >"$dir/calls.txt"
touch "$dir/compile_fails"
run_script || fail "a retried run exited $?: $(cat "$dir/err.txt")"
[[ $(grep -c -- "--moe-compile-experts 1" "$dir/calls.txt") -eq 1 ]] ||
  fail "not retried exactly once: $(cat "$dir/calls.txt")"
[[ $(grep -c -- "--moe-compile-experts 0" "$dir/calls.txt") -eq 4 ]] || fail "not kept after"
grep -q '"system": "torch", "error": "exit 1", "D": 0, "round": 1' "$dir/out.txt" ||
  fail "no error line for the failed compile"
grep -q "Unsupported: boom" "$dir/err.txt" || fail "the failure's stderr is not shown"
[[ $(grep -c "ratio_vs_torch_compile" "$dir/out.txt") -eq 4 ]] || fail "ratios lost"
rm "$dir/compile_fails"

# gtron fails (out of memory): error lines, no ratio, the summary of nothing, exit 1.
touch "$dir/gtron_fails"
rc=0
GTRON_MOE_ROUNDS=1 run_script || rc=$?
[[ $rc -eq 1 ]] || fail "a failing gtron run exited $rc, not 1"
grep -q '"system": "gtron", "error": "exit 3", "D": 1, "round": 1' "$dir/out.txt" ||
  fail "no gtron error line"
grep -q "out of memory" "$dir/err.txt" || fail "gtron's stderr is not shown"
! grep -q "ratio_vs_torch_compile\|summary" "$dir/out.txt" || fail "a ratio from a failed run"
rm "$dir/gtron_fails"
touch "$dir/gtron_dense"  # a bench_gpu that ignores the --moe-* flags
rc=0
GTRON_MOE_ROUNDS=1 GTRON_MOE_D=0 run_script || rc=$?
[[ $rc -eq 1 ]] || fail "a dense gtron line exited $rc, not 1"
grep -q '"system": "gtron", "error": "not a MoE run' "$dir/out.txt" || fail "dense line taken"
rm "$dir/gtron_dense"
rc=0
GTRON_BIN="$dir/nowhere" bash "$script" >/dev/null 2>&1 || rc=$?
[[ $rc -eq 2 ]] || fail "a GTRON_BIN without bench_gpu exited $rc, not 2"

# The real bench_gpu with the script's shape: every flag accepted, only the GPU missing.
mkdir -p "$dir/real"
ln -sf "$(cd "$(dirname "$real_bench_gpu")" && pwd)/$(basename "$real_bench_gpu")" \
  "$dir/real/bench_gpu"
rc=0
PATH="$dir/path:$PATH" GTRON_BIN="$dir/real" GTRON_TORCH_PY="$dir/bench_torch.py" \
  GTRON_MOE_ROUNDS=1 bash "$script" >"$dir/out.txt" 2>"$dir/err.txt" || rc=$?
[[ $rc -eq 1 ]] || fail "the real bench_gpu without a GPU: script exit $rc"
[[ $(grep -c '"system": "gtron", "error": "exit 1"' "$dir/out.txt") -eq 2 ]] ||
  fail "expected two 'no CUDA device' runs: $(cat "$dir/out.txt")"
grep -q "no CUDA device" "$dir/err.txt" || fail "not stopped at the device: $(cat "$dir/err.txt")"
! grep -q "config error" "$dir/err.txt" || fail "the shape is refused: $(cat "$dir/err.txt")"
expect_refusal() {  # expect_refusal TEXT FLAGS...: bench_gpu exits 2 and says TEXT
  local want="$1" rc=0
  shift
  "$real_bench_gpu" --arch llama "$@" >/dev/null 2>"$dir/refusal.txt" || rc=$?
  [[ $rc -eq 2 ]] || fail "bench_gpu $* exited $rc, not 2"
  grep -q -- "$want" "$dir/refusal.txt" || fail "bench_gpu $*: $(cat "$dir/refusal.txt")"
}
expect_refusal "model.moe.top_k = 9" --moe-experts 8 --moe-top-k 9
expect_refusal 'train.precision = "fp8" is not built' --moe-experts 8 --precision fp8
expect_refusal 'train.recompute = "full"' --moe-experts 8 --recompute full
expect_refusal "first_dense_layers = 2" --L 2 --moe-experts 8 --moe-first-dense 2
expect_refusal "needs --moe-experts" --moe-width 64
expect_refusal "softmax or sigmoid" --moe-experts 8 --moe-router relu
rc=0
"$real_bench_gpu" --moe-experts 8 >/dev/null 2>"$dir/refusal.txt" || rc=$?
if [[ $rc -ne 2 ]] || ! grep -q "llama family" "$dir/refusal.txt"; then
  fail "GPT-2 with experts: exit $rc"
fi
echo "bench_moe_test: ok"
