#!/usr/bin/env python3
"""The GPU timeline of bench_gpu's steps from a kernel trace (scripts/trace_gpu.sh).

Reads the lines tests/trainer/kernel_trace.cc writes (kind, start and end in ns, stream, graph,
size, name; kinds K kernel, S memset, C memcpy), cuts them into steps at the host-to-device copy
of the token window that starts every step, and for the last --steps complete steps prints:
- where the time between kernels goes: the largest idle gaps, summed per (op before, op after);
- every op's time and count per step (kernels by name, memsets, copies by kind);
- one JSON line: ms per step (start to start), the GPU's busy and idle time, and the kernel,
  memset and copy time and counts per step.
Standard library only.
"""
import argparse
import collections
import json
import re
import sys


def short(name):
    # "void gtron::cuda::(anonymous namespace)::onepass_kernel<T, 8>(T const*, ...)" ->
    # "onepass_kernel<T, 8>": the argument list starts at the first "(" outside template brackets.
    name = name.strip().replace("(anonymous namespace)::", "")
    depth = 0
    for i, ch in enumerate(name):
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0:
            name = name[:i]
            break
    name = re.sub(r"^void ", "", name)
    head = name.split("<", 1)
    return (head[0].split("::")[-1] + ("<" + head[1] if len(head) > 1 else ""))[:80]


def fail(msg):
    print(f"trace_table: {msg}", file=sys.stderr)
    sys.exit(2)


def read(path):
    recs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            p = line.rstrip("\n").split("\t")
            if len(p) < 7 or p[0] not in ("K", "S", "C"):
                fail(f"{path}:{n}: not a kernel-trace line: {line[:80]!r}")
            kind, start, end, size = p[0], int(p[1]), int(p[2]), int(p[5])
            name = short(p[6]) if kind == "K" else ("memset" if kind == "S" else p[6])
            recs.append((start, end, kind, size, name))
    recs.sort()
    return recs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=10, help="the last N complete steps")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    try:
        recs = read(a.trace)
    except (OSError, ValueError) as e:
        fail(f"{a.trace}: {e}")
    starts = [i for i, r in enumerate(recs) if r[2] == "C" and r[4] == "memcpy_HtoD"]
    if len(starts) < 2:
        fail("fewer than two steps (host-to-device window copies) in the trace")
    k = min(a.steps, len(starts) - 1)
    steps = [(starts[i], starts[i + 1]) for i in range(len(starts) - 1 - k, len(starts) - 1)]
    tot = collections.Counter()
    op_ms, op_n = collections.Counter(), collections.Counter()
    gap_ms, gap_n = collections.Counter(), collections.Counter()
    for lo, hi in steps:
        t0, t1 = recs[lo][0], recs[hi][0]
        tot["period"] += t1 - t0
        busy_end, prev = t0, "step start"
        for start, end, kind, size, name in recs[lo:hi]:
            tot[kind] += end - start
            tot[kind + "n"] += 1
            op_ms[name] += end - start
            op_n[name] += 1
            if start > busy_end:
                tot["idle"] += start - busy_end
                if start - busy_end > 2000:
                    tot["gaps2us"] += 1
                gap_ms[(prev, name)] += start - busy_end
                gap_n[(prev, name)] += 1
            if end > busy_end:
                busy_end, prev = end, name
        if t1 > busy_end:  # the tail, up to the next step's window copy
            tot["idle"] += t1 - busy_end
            tot["gaps2us"] += t1 - busy_end > 2000
            gap_ms[(prev, "next step")] += t1 - busy_end
            gap_n[(prev, "next step")] += 1
    ms = lambda ns: ns / k / 1e6
    print(f"largest idle gaps (ms per step, gaps per step: op before -> op after), last {k} steps:")
    for key, t in gap_ms.most_common(a.top):
        print(f"{ms(t):8.4f} {gap_n[key] / k:6.1f}  {key[0]} -> {key[1]}")
    print("ops (ms per step, count per step):")
    for name, t in op_ms.most_common(a.top * 2):
        print(f"{ms(t):8.4f} {op_n[name] / k:6.1f}  {name}")
    summary = {
        "steps": k,
        "ms_per_step": round(ms(tot["period"]), 4),
        "busy_ms": round(ms(tot["period"] - tot["idle"]), 4),
        "idle_ms": round(ms(tot["idle"]), 4),
        "kernel_ms": round(ms(tot["K"]), 4),
        "memset_ms": round(ms(tot["S"]), 4),
        "copy_ms": round(ms(tot["C"]), 4),
        "kernels_per_step": tot["Kn"] / k,
        "memsets_per_step": tot["Sn"] / k,
        "copies_per_step": tot["Cn"] / k,
        "idle_gaps_over_2us_per_step": tot["gaps2us"] / k,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
