#!/usr/bin/env python3
"""gtron's step against torch.compile's, by kind of kernel, in ms of GPU time per step.

Reads what the two profilers print:
- gtron: the standard output of scripts/trace_gpu.sh (scripts/trace_table.py's "ops (ms per
  step, count per step):" section, and its closing JSON line);
- torch.compile: the standard error of scripts/bench_torch.py --profile N (its "torch kernels:
  T ms per step in N launches" line and the costliest kernels under it, one per line).
Sorts every kernel by its name into a kind (GEMMs, attention, optimizer, norms, loss, memsets and
copies, the rest: norms, activations, casts), and prints a table (kind, gtron ms, torch.compile ms, difference) and one JSON
line {"kernel_compare": {"gtron": {kind: ms}, "torch": {kind: ms}, "gtron_total", "torch_total"}}.
bench_torch.py lists only its costliest kernels: the time of the others is the kind "unlisted".
Run both on the same shape, in one device command:

  scripts/trace_gpu.sh $SHAPE > gtron.txt
  python3 scripts/bench_torch.py --mode compile $SHAPE --profile 2 2> torch.txt
  scripts/kernel_compare.py gtron.txt torch.txt

Exit code 2 for a file that is missing or has no kernel lines of its profiler. Standard library
only.
"""
import argparse
import json
import re
import sys

# (kind, pattern on the kernel name); the first match wins. The names are those of gtron's
# kernels (model/ops, trainer/) and of what torch.compile launches (cuBLAS's nvjet / xmma, cuDNN's
# SDPA, Triton's fused kernels, PyTorch's fused AdamW and foreach kernels).
KINDS = [
    ("gemm", r"nvjet|xmma|gemm|cutlass|cublas"),
    ("attention", r"flash|fmha|sdpa|wg_forward|wg_backward|attention|dot_do_o|convert_dq|"
                  r"reduce_head"),
    ("optimizer", r"adam|FusedOpti|multi_tensor_apply|sumsq|finalize_kernel|batched_finish"),
    ("loss", r"onepass|log_softmax|nll_loss|cross_entropy"),
    ("memset_copy", r"^memset|^memcpy|Memset|Memcpy"),
]
# Everything else is "other": norms, activations, RoPE, residual adds, casts. torch.compile's
# Triton kernels fuse several of these into one, so no finer split compares like with like.
ORDER = [k for k, _ in KINDS] + ["other", "unlisted"]


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return "other"


def fail(msg):
    print(f"kernel_compare.py: {msg}", file=sys.stderr)
    sys.exit(2)


def read(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")


def gtron_kinds(path):
    """{kind: ms per step} and the total from trace_gpu.sh's ops section."""
    lines = read(path)
    try:
        start = next(i for i, l in enumerate(lines) if l.startswith("ops (ms per step"))
    except StopIteration:
        fail(f"{path}: no 'ops (ms per step, count per step):' section (scripts/trace_gpu.sh "
             "output expected)")
    out = {}
    for line in lines[start + 1:]:
        m = re.match(r"\s+([0-9.]+)\s+([0-9.]+)\s+(\S.*)$", line)
        if not m:
            break
        kind = kind_of(m.group(3))
        out[kind] = out.get(kind, 0.0) + float(m.group(1))
    if not out:
        fail(f"{path}: the ops section has no kernel lines")
    return out, sum(out.values())


def torch_kinds(path):
    """{kind: ms per step} and the total from bench_torch.py --profile's lines."""
    lines = read(path)
    total = None
    out = {}
    for line in lines:
        t = re.match(r"torch kernels: ([0-9.]+) ms per step", line)
        if t:
            total = float(t.group(1))
            continue
        m = re.match(r"\s*([0-9.]+) ms\s+[0-9.]+%\s+[0-9.]+x\s+(\S.*)$", line)
        if m and total is not None:
            kind = kind_of(m.group(2))
            out[kind] = out.get(kind, 0.0) + float(m.group(1))
    if total is None or not out:
        fail(f"{path}: no 'torch kernels: ...' line with kernel lines under it "
             "(bench_torch.py --profile N's standard error expected)")
    out["unlisted"] = max(0.0, total - sum(out.values()))
    return out, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gtron", help="scripts/trace_gpu.sh's standard output")
    ap.add_argument("torch", help="scripts/bench_torch.py --profile N's standard error")
    a = ap.parse_args()
    g, g_total = gtron_kinds(a.gtron)
    t, t_total = torch_kinds(a.torch)
    print(f"{'kind':<12} {'gtron ms':>9} {'torch ms':>9} {'gtron - torch':>14}")
    for kind in ORDER:
        if kind in g or kind in t:
            gv, tv = g.get(kind, 0.0), t.get(kind, 0.0)
            print(f"{kind:<12} {gv:9.3f} {tv:9.3f} {gv - tv:+14.3f}")
    print(f"{'total':<12} {g_total:9.3f} {t_total:9.3f} {g_total - t_total:+14.3f}")
    r3 = lambda d: {k: round(v, 3) for k, v in sorted(d.items(), key=lambda kv: ORDER.index(kv[0]))}
    print(json.dumps({"kernel_compare": {"gtron": r3(g), "torch": r3(t),
                                         "gtron_total": round(g_total, 3),
                                         "torch_total": round(t_total, 3)}}))


if __name__ == "__main__":
    main()
