#!/usr/bin/env python3
"""Per-kernel table from an `ncu --csv --metrics gpu__time_duration.sum` log (scripts/profile_gpu.sh).

The log holds warmup + N steps of kernels; the first warmup step's kernels are dropped by taking the
last (total / (N + 1)) * N launches, since every step launches the same sequence. Standard library
only.
"""
import argparse
import collections
import csv
import json
import re
import sys


def short(name):
    # "void gtron::cuda::(anonymous namespace)::flash_forward_kernel<64>(...)" -> "flash_forward_kernel<64>"
    name = re.sub(r"\(.*\)$", "", name.strip())
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"^void ", "", name)
    return name.split("::")[-1][:90]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    rows = []
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        rows.append((short(r["Kernel Name"]), float(r["Metric Value"].replace(",", ""))))
    if not rows:
        sys.exit("profile_table: no kernel rows in " + a.csv)
    per_step = len(rows) // (a.steps + 1)
    kept = rows[len(rows) - per_step * a.steps:]
    total = collections.defaultdict(float)
    count = collections.Counter()
    for name, ns in kept:
        total[name] += ns
        count[name] += 1
    step_ms = sum(total.values()) / a.steps / 1e6
    print(f"{'kernel':<92}{'ms/step':>9}{'share':>8}{'count':>7}")
    for name, ns in sorted(total.items(), key=lambda kv: -kv[1])[: a.top]:
        ms = ns / a.steps / 1e6
        print(f"{name:<92}{ms:9.3f}{100 * ms / step_ms:7.1f}%{count[name] // a.steps:7d}")
    print(json.dumps({"kernel_ms_per_step": round(step_ms, 3), "kernels_per_step": per_step,
                      "distinct_kernels": len(total)}))


if __name__ == "__main__":
    main()
