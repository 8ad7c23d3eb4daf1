#!/usr/bin/env bash
# scripts/trace_table.py on a made-up trace of three steps whose numbers are known: step length,
# busy and idle time, per-kind time and counts, the largest gap and its ops; bad input exits 2.
set -euo pipefail
table="$1"
dir="${TEST_TMPDIR:-/tmp}/trace_table_test"
mkdir -p "$dir"
# Each 20 µs step: window copy [0, 1), memset [2, 3), kernel [6, 16) (a 3 µs gap after the
# memset), a device copy [15, 17) overlapping it, then idle until the next step at 20.
python3 - "$dir/trace.tsv" <<'PY'
import sys
lines = []
for s in range(4):
    t = s * 20000
    lines.append(f"C\t{t}\t{t + 1000}\t7\t0\t65600\tmemcpy_HtoD")
    lines.append(f"S\t{t + 2000}\t{t + 3000}\t7\t2\t4\tmemset")
    lines.append(f"K\t{t + 6000}\t{t + 16000}\t7\t2\t132\tvoid gtron::cuda::(anonymous namespace)::gemm_like<float, 8>(float const*, int)")
    lines.append(f"C\t{t + 15000}\t{t + 17000}\t7\t0\t4096\tmemcpy_DtoD")
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
python3 "$table" "$dir/trace.tsv" --steps 3 >"$dir/out.txt"
python3 - "$dir/out.txt" <<'PY'
import json, sys
text = open(sys.argv[1]).read().splitlines()
s = json.loads(text[-1])
want = {"steps": 3, "ms_per_step": 0.02, "busy_ms": 0.013, "idle_ms": 0.007, "kernel_ms": 0.01,
        "memset_ms": 0.001, "copy_ms": 0.003, "kernels_per_step": 1.0, "memsets_per_step": 1.0,
        "copies_per_step": 2.0, "idle_gaps_over_2us_per_step": 2.0}
for k, v in want.items():
    assert abs(s[k] - v) < 1e-9, (k, s[k], v)
# the largest gap: 3 µs from the memset to the kernel (whose name lost its namespace and arguments)
assert text[1].split() == ["0.0030", "1.0", "memset", "->", "gemm_like<float,", "8>"], text[1]
print("trace_table: ok")
PY
echo "K 1 2" >"$dir/bad.tsv"
if python3 "$table" "$dir/bad.tsv" 2>"$dir/err.txt"; then
  echo "a malformed trace was accepted" >&2
  exit 1
else
  rc=$?
  [[ $rc -eq 2 ]] || { echo "exit $rc, not 2" >&2; exit 1; }
  grep -q "not a kernel-trace line" "$dir/err.txt"
fi
python3 "$table" "$dir/missing.tsv" 2>"$dir/err.txt" && exit 1 || [[ $? -eq 2 ]]
echo ok
