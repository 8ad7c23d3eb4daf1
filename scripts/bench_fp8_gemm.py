#!/usr/bin/env python3
"""PyTorch's FP8 products (torch._scaled_mm) at the shapes tests/model/bench_fp8_gemm.cc times.

Tensor-wise and row-wise scales, with and without fast accumulation, beside torch.matmul in bf16:
one JSON line per (model, linear, product, mode), the same keys as bench_fp8_gemm's lines with
"kernel": "torch". Run on the GPU machine (PyTorch there); scripts/bench_fp8_gemm.sh runs both.
"""
import argparse
import json
import sys

LINEARS = [
    ("llama1b", "qkv", 3072, 2048), ("llama1b", "o", 2048, 2048),
    ("llama1b", "gate_up", 16384, 2048), ("llama1b", "down", 2048, 8192),
    ("qwen06b", "qkv", 4096, 1024), ("qwen06b", "o", 1024, 2048),
    ("qwen06b", "gate_up", 6144, 1024), ("qwen06b", "down", 1024, 3072),
    ("gpt2_1.5b", "qkv", 4800, 1600), ("gpt2_1.5b", "proj", 1600, 1600),
    ("gpt2_1.5b", "fc", 6400, 1600), ("gpt2_1.5b", "fc2", 1600, 6400),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if args.tokens <= 0 or args.reps <= 0:
        print("bench_fp8_gemm.py: --tokens and --reps must be positive", file=sys.stderr)
        return 2
    import torch
    if not torch.cuda.is_available():
        print("bench_fp8_gemm.py: no CUDA GPU", file=sys.stderr)
        return 1
    dev = "cuda"
    card = torch.cuda.get_device_name(0)

    def timed(fn):
        for _ in range(3):
            fn()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(args.reps):
            fn()
        b.record()
        b.synchronize()
        return 1e3 * a.elapsed_time(b) / args.reps

    for model, name, out, inp in LINEARS:
        t = args.tokens
        # (m, n, k) as bench_fp8_gemm names them: D (m x n) = A (m x k) B (k x n).
        for product, (m, n, k) in (("fwd", (out, t, inp)), ("dgrad", (inp, t, out)),
                                   ("wgrad", (inp, out, t))):
            a16 = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            b16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            flops = 2.0 * m * n * k
            bf16_us = timed(lambda: a16 @ b16.t())
            a8 = a16.to(torch.float8_e4m3fn)
            b8 = b16.to(torch.float8_e4m3fn)
            one = torch.ones((), device=dev, dtype=torch.float32)
            rows_a = torch.ones(m, 1, device=dev, dtype=torch.float32)
            rows_b = torch.ones(1, n, device=dev, dtype=torch.float32)
            cases = [("bf16", 0, None)]
            for fast in (0, 1):
                cases.append(("tensor", fast, (one, one)))
                cases.append(("rowwise", fast, (rows_a, rows_b)))
            for mode, fast, scales in cases:
                if scales is None:
                    us = bf16_us
                else:
                    try:
                        us = timed(lambda: torch._scaled_mm(
                            a8, b8.t(), scale_a=scales[0], scale_b=scales[1],
                            out_dtype=torch.bfloat16, use_fast_accum=bool(fast)))
                    except RuntimeError as e:
                        print(json.dumps({"kernel": "torch", "model": model, "linear": name,
                                          "product": product, "mode": mode, "fast_accum": fast,
                                          "error": str(e)[:200]}))
                        continue
                print(json.dumps({"kernel": "torch", "card": card, "model": model, "linear": name,
                                  "product": product, "m": m, "n": n, "k": k, "mode": mode,
                                  "fast_accum": fast, "us": round(us, 1),
                                  "tflops": round(flops / us * 1e-6, 1),
                                  "speedup_vs_bf16": round(bf16_us / us, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
