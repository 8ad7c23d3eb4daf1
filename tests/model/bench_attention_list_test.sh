#!/usr/bin/env bash
# The attention sweep without a GPU: bench_attention and scripts/bench_attention.py list the same
# cells for the same flags, refuse the same bad flags (exit 2), print their help, and stop with a
# clear message where there is no GPU (or no PyTorch); the table of made-up result lines; and
# scripts/bench_attention.sh end to end with a fake binary and a fake PyTorch run (flag split,
# exit status, table).
set -euo pipefail
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
py="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
sh="$(cd "$(dirname "$3")" && pwd)/$(basename "$3")"
dir="${TEST_TMPDIR:-/tmp}/bench_attention_list_test"
rm -rf "$dir"
mkdir -p "$dir"

die() {
  echo "FAIL: $*" >&2
  exit 1
}

# 1. The same cells, by default and with every shape flag moved.
same_cells() {
  "$bin" --list "$@" >"$dir/cc.txt"
  python3 "$py" --list "$@" >"$dir/py.txt"
  diff "$dir/cc.txt" "$dir/py.txt" || die "cell lists differ for: $*"
}
same_cells
[[ $(wc -l <"$dir/cc.txt") -eq 20 ]] || die "default sweep: $(wc -l <"$dir/cc.txt") cells, not 20"
grep -qx '{"hs": 64, "T": 512, "B": 32, "nh": 32, "nkv": 32}' "$dir/cc.txt" || die "first cell"
grep -qx '{"hs": 128, "T": 8192, "B": 2, "nh": 16, "nkv": 4}' "$dir/cc.txt" || die "last cell"
same_cells --hs 128 --modes gqa,mha --T 1024,4096 --tokens 8192 --width 1024 --group 2
[[ $(head -1 "$dir/cc.txt") == '{"hs": 128, "T": 1024, "B": 8, "nh": 8, "nkv": 4}' ]] ||
  die "moved flags: $(head -1 "$dir/cc.txt")"

# 2. Help.
"$bin" --help | grep -q "usage: bench_attention" || die "bench_attention --help"
python3 "$py" --help | grep -q -- "--backends" || die "bench_attention.py --help"

# 3. Bad flags: exit 2 and the same complaint from both.
bad_flag() {
  local want="$1"
  shift
  local rc=0
  "$bin" "$@" 2>"$dir/cc.err" >/dev/null || rc=$?
  [[ $rc -eq 2 ]] || die "bench_attention $* exited $rc, not 2"
  grep -q -- "$want" "$dir/cc.err" || die "bench_attention $*: $(cat "$dir/cc.err")"
  rc=0
  python3 "$py" "$@" 2>"$dir/py.err" >/dev/null || rc=$?
  [[ $rc -eq 2 ]] || die "bench_attention.py $* exited $rc, not 2"
  grep -q -- "$want" "$dir/py.err" || die "bench_attention.py $*: $(cat "$dir/py.err")"
}
bad_flag "expected 64 or 128" --hs 96 --list
bad_flag "does not divide --tokens" --T 1000 --list
bad_flag "does not divide the 16 query heads" --hs 128 --group 3 --list
bad_flag "is not a multiple of head size" --width 1000 --list
bad_flag "list of mha,gqa" --modes mqa --list
bad_flag "positive integers" --T 512,x --list
rc=0
"$bin" --variants fast 2>"$dir/cc.err" || rc=$?
[[ $rc -eq 2 ]] && grep -q "plain,rope,bias" "$dir/cc.err" || die "--variants fast: $rc"

# 4. No GPU: a clear message and exit 2 (CUDA_VISIBLE_DEVICES=-1 hides any GPU there may be).
rc=0
CUDA_VISIBLE_DEVICES=-1 "$bin" --T 512 --hs 64 --modes mha 2>"$dir/cc.err" || rc=$?
[[ $rc -eq 2 ]] || die "bench_attention without a GPU exited $rc, not 2"
grep -q "no CUDA device" "$dir/cc.err" || die "no-GPU message: $(cat "$dir/cc.err")"
rc=0
CUDA_VISIBLE_DEVICES=-1 python3 "$py" --T 512 --hs 64 --modes mha 2>"$dir/py.err" || rc=$?
[[ $rc -eq 2 ]] || die "bench_attention.py without a GPU exited $rc, not 2"
grep -q -e "no CUDA device" -e "needs PyTorch" "$dir/py.err" || die "$(cat "$dir/py.err")"

# 5. The table of made-up lines: one cell with all three kernels, one where fa2 refused and
# gtron's check failed, a rope variant; a log line and the header lines are skipped.
cat >"$dir/gtron.jsonl" <<'EOF'
{"bench": "bench_attention", "flops": "x", "card": "Fake H100"}
{"kernel": "gtron", "variant": "plain", "path": "wgmma", "hs": 128, "T": 2048, "B": 8, "nh": 16, "nkv": 16, "fwd_tflops": 300.0, "bwd_tflops": 200.0, "rel_err": 0.004, "check": "pass", "card": "Fake H100"}
{"kernel": "gtron", "variant": "rope", "path": "wgmma", "hs": 128, "T": 2048, "B": 8, "nh": 16, "nkv": 16, "fwd_tflops": 301.0, "bwd_tflops": 190.0, "rel_err": 0.004, "check": "pass", "card": "Fake H100"}
{"kernel": "gtron", "variant": "plain", "path": "wgmma", "hs": 64, "T": 512, "B": 32, "nh": 32, "nkv": 8, "fwd_tflops": 150.0, "bwd_tflops": 100.0, "rel_err": NaN, "check": "fail", "card": "Fake H100"}
EOF
cat >"$dir/torch.jsonl" <<'EOF'
a log line
{"kernel": "cudnn", "variant": "sdpa", "hs": 128, "T": 2048, "B": 8, "nh": 16, "nkv": 16, "fwd_tflops": 400.0, "bwd_tflops": 250.0, "rel_err": 0.003, "check": "pass", "card": "Fake H100"}
{"kernel": "fa2", "variant": "sdpa", "hs": 128, "T": 2048, "B": 8, "nh": 16, "nkv": 16, "fwd_tflops": 350.0, "bwd_tflops": 220.0, "rel_err": 0.003, "check": "pass", "card": "Fake H100"}
{"kernel": "cudnn", "variant": "sdpa", "hs": 64, "T": 512, "B": 32, "nh": 32, "nkv": 8, "fwd_tflops": 200.0, "bwd_tflops": 125.0, "rel_err": 0.003, "check": "pass", "card": "Fake H100"}
{"kernel": "fa2", "variant": "sdpa", "hs": 64, "T": 512, "B": 32, "nh": 32, "nkv": 8, "error": "RuntimeError: No available kernel", "card": "Fake H100"}
EOF
python3 "$py" --table "$dir/gtron.jsonl" "$dir/torch.jsonl" >"$dir/table.txt"
cat "$dir/table.txt"
grep -q "card: Fake H100" "$dir/table.txt" || die "table card"
row() { grep -E "^ *$1 +$2 " "$dir/table.txt" | head -1 | tr -s ' ' | sed 's/^ //'; }
[[ "$(row 128 2048)" == "128 2048 8 16 16 300 400 350 0.75 200 250 220 0.80 4.0e-03" ]] ||
  die "hs 128 row: $(row 128 2048)"
[[ "$(row 64 512)" == "64 512 32 32 8 150! 200 refused 0.75 100! 125 refused 0.80 nan" ]] ||
  die "hs 64 row: $(row 64 512)"
grep -q "300/200  *301/190" "$dir/table.txt" || die "variants table"
echo "{bad" >"$dir/bad.jsonl"
rc=0
python3 "$py" --table "$dir/bad.jsonl" 2>"$dir/py.err" >/dev/null || rc=$?
[[ $rc -eq 2 ]] && grep -q "not a JSON line" "$dir/py.err" || die "bad table input: $rc"

# 6. bench_attention.sh with a fake binary (next to the script, as on the GPU machine) and a fake
# python3 whose sweep prints canned lines: the flag split, the packed libraries for the binary
# alone, the files, the table, the exit status.
mkdir -p "$dir/sh/lib" "$dir/fakebin" "$dir/out"
cp "$sh" "$py" "$dir/sh/"
cat >"$dir/sh/bench_attention" <<EOF
#!/usr/bin/env bash
echo "\$*" >"$dir/bin_args.txt"
echo "\${LD_LIBRARY_PATH:-}" >"$dir/bin_libs.txt"
grep -v '"rope"' "$dir/gtron.jsonl" | grep -v '"nkv": 8'
exit \${FAKE_GTRON_RC:-0}
EOF
chmod +x "$dir/sh/bench_attention"
real_python="$(command -v python3)"
cat >"$dir/fakebin/python3" <<EOF
#!/usr/bin/env bash
if [[ " \$* " == *" --table "* ]]; then exec "$real_python" "\$@"; fi
echo "\$*" >"$dir/py_args.txt"
echo "\${LD_LIBRARY_PATH:-}" >"$dir/py_libs.txt"
grep '"hs": 128' "$dir/torch.jsonl"
EOF
chmod +x "$dir/fakebin/python3"
PATH="$dir/fakebin:$PATH" GTRON_BENCH_DIR="$dir/out" bash "$dir/sh/bench_attention.sh" \
  --hs 128 --variants plain --backends cudnn,fa2 --repeats 5 >"$dir/sh.txt"
[[ "$(cat "$dir/bin_args.txt")" == "--hs 128 --variants plain --repeats 5" ]] ||
  die "binary args: $(cat "$dir/bin_args.txt")"
want="bench_attention.py --hs 128 --backends cudnn,fa2 --repeats 5"
[[ "$(cat "$dir/py_args.txt")" == *"$want" ]] ||
  die "python args: $(cat "$dir/py_args.txt")"
[[ -s "$dir/out/gtron.jsonl" && -s "$dir/out/torch.jsonl" ]] || die "JSON files not kept"
[[ "$(cat "$dir/bin_libs.txt")" == "$dir/sh/lib"* ]] || die "binary libs: $(cat "$dir/bin_libs.txt")"
! grep -q "$dir/sh/lib" "$dir/py_libs.txt" || die "python got the packed libraries"
grep -q "0.75" "$dir/sh.txt" || die "no table: $(cat "$dir/sh.txt")"
rc=0
FAKE_GTRON_RC=1 PATH="$dir/fakebin:$PATH" GTRON_BENCH_DIR="$dir/out" \
  bash "$dir/sh/bench_attention.sh" --hs 128 >"$dir/sh.txt" || rc=$?
[[ $rc -eq 1 ]] || die "a failing bench_attention gave exit $rc, not 1"
grep -q "0.75" "$dir/sh.txt" || die "no table after a failure"
echo ok
