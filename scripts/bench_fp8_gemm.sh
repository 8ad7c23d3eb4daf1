#!/usr/bin/env bash
# cuBLASLt's FP8 products per scaling mode (tests/model/bench_fp8_gemm.cc, which times gtron's FP8
# quantizers first) and PyTorch's torch._scaled_mm (scripts/bench_fp8_gemm.py) at the same shapes,
# in one command on the GPU machine, then a line per quantizer (us, GB/s) and one table line per
# (model, linear, product): TFLOP/s of bf16 and of each FP8 mode, gtron's cuBLASLt calls beside
# torch's. FLAGS (--tokens N, --reps R) go to both.
#   bash scripts/bench_fp8_gemm.sh [FLAGS]     (binary: .gpubin/bench_fp8_gemm or Bazel's)
# The JSON lines stay in $GTRON_BENCH_DIR (default: a new temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.gpubin/bench_fp8_gemm
[[ -x $bin ]] || bin=bazel-bin/tests/model/bench_fp8_gemm
dir=${GTRON_BENCH_DIR:-$(mktemp -d)}
mkdir -p "$dir"
"$bin" "$@" >"$dir/cublaslt.jsonl" || echo "bench_fp8_gemm: exit $?"
python3 scripts/bench_fp8_gemm.py "$@" >"$dir/torch.jsonl" || echo "bench_fp8_gemm.py: exit $?"
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
rows = {}
for src in ("cublaslt", "torch"):
    for line in open(f"{d}/{src}.jsonl"):
        r = json.loads(line)
        if "quantizer" in r:
            print(f'quantizer {r["quantizer"]} {r["shape"]}: {r["us"]} us, {r["gbps"]} GB/s')
            continue
        if "mode" not in r or "error" in r:
            if "card" in r and src == "cublaslt": print("card:", r["card"])
            continue
        key = (r["model"], r["linear"], r["product"])
        tf = r.get("tflops_best", r.get("tflops"))
        rows.setdefault(key, {})[f'{src[0]}:{r["mode"]}{"+f" if r["fast_accum"] else ""}'] = tf
cols = sorted({c for v in rows.values() for c in v})
print("model linear product | " + " ".join(f"{c:>11}" for c in cols))
for key, v in rows.items():
    print(" ".join(key) + " | " + " ".join(f"{v.get(c, 0):11.0f}" for c in cols))
PY
