#!/usr/bin/env python3
"""The table of scripts/fp8_parity.sh's runs (issue 48, acceptance 2), as JSON lines.

  python3 scripts/fp8_parity.py RUNS [--warmup 100] [--smooth 5] [--plot FILE.png]

RUNS holds <precision>_s<seed>/metrics.jsonl for precision bf16 and fp8. Prints one line per run
(final validation main loss, its step), then a summary:
  final_val_bf16 / final_val_fp8: the means over seeds; rel_diff = fp8 / bf16 - 1 (target
  |rel_diff| <= 0.25%);
  curve: the training main loss, each run smoothed by a moving mean over --smooth logged steps;
  after --warmup steps, at every logged step, the bf16 seeds' band [min, max] against the fp8
  seeds' mean: the share of steps where the fp8 mean is inside it, and its largest relative
  distance outside; the same for the validation records.
--plot draws every run's smoothed curve (needs matplotlib). Exit 1 when a run has no metrics.
"""
import argparse
import glob
import json
import os
import re
import sys


def read(path):
    train, val = {}, {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("split") == "val":
                val[r["step"]] = r["val_main_loss"]
            elif r.get("split") == "train":
                train[r["step"]] = r["main_loss"]
    return train, val


def smooth(steps, values, k):
    out = []
    for i in range(len(values)):
        window = values[max(0, i - k + 1): i + 1]
        out.append(sum(window) / len(window))
    return dict(zip(steps, out))


def band_check(bf16_runs, fp8_runs, steps):
    inside, worst = 0, 0.0
    for s in steps:
        lo = min(r[s] for r in bf16_runs)
        hi = max(r[s] for r in bf16_runs)
        m = sum(r[s] for r in fp8_runs) / len(fp8_runs)
        if lo <= m <= hi:
            inside += 1
        else:
            worst = max(worst, (lo - m) / lo if m < lo else (m - hi) / hi)
    return {"steps": len(steps), "inside": inside,
            "share_inside": inside / len(steps) if steps else None,
            "worst_outside_rel": worst}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--smooth", type=int, default=5)
    ap.add_argument("--plot", default="")
    a = ap.parse_args()
    runs = {"bf16": {}, "fp8": {}}
    for d in sorted(glob.glob(os.path.join(a.runs, "*_s*"))):
        m = re.fullmatch(r"(bf16|fp8)_s(\d+)", os.path.basename(d))
        if not m or not os.path.isdir(d):
            continue
        path = os.path.join(d, "metrics.jsonl")
        if not os.path.exists(path):
            print(json.dumps({"run": os.path.basename(d), "error": "no metrics.jsonl"}))
            return 1
        runs[m.group(1)][int(m.group(2))] = read(path)
    if not runs["bf16"] or not runs["fp8"]:
        print(json.dumps({"error": f"no bf16 or fp8 runs under {a.runs}"}))
        return 1
    finals = {}
    for p in ("bf16", "fp8"):
        finals[p] = []
        for seed, (train, val) in sorted(runs[p].items()):
            last = max(val) if val else None
            finals[p].append(val[last] if val else float("nan"))
            print(json.dumps({"run": f"{p}_s{seed}", "final_val_main_loss": finals[p][-1],
                              "step": last, "last_train_main_loss": train[max(train)]}))
    mean = {p: sum(v) / len(v) for p, v in finals.items()}
    smoothed = {p: [] for p in runs}
    for p in runs:
        for seed, (train, _) in sorted(runs[p].items()):
            steps = sorted(train)
            smoothed[p].append(smooth(steps, [train[s] for s in steps], a.smooth))
    common = set.intersection(*(set(r) for p in runs for r in smoothed[p]))
    curve_steps = sorted(s for s in common if s > a.warmup)
    val_common = set.intersection(*(set(v) for p in runs for _, v in runs[p].values()))
    val_steps = sorted(s for s in val_common if s > a.warmup)
    val_runs = {p: [v for _, v in runs[p].values()] for p in runs}
    print(json.dumps({
        "summary": "fp8_parity",
        "seeds": {p: sorted(runs[p]) for p in runs},
        "final_val_bf16": mean["bf16"], "final_val_fp8": mean["fp8"],
        "rel_diff": mean["fp8"] / mean["bf16"] - 1.0,
        "bf16_seed_spread": max(finals["bf16"]) - min(finals["bf16"]),
        "curve": band_check(smoothed["bf16"], smoothed["fp8"], curve_steps),
        "val_curve": band_check(val_runs["bf16"], val_runs["fp8"], val_steps),
    }))
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 5))
        for p, colour in (("bf16", "tab:blue"), ("fp8", "tab:red")):
            for i, r in enumerate(smoothed[p]):
                steps = sorted(r)
                ax.plot(steps, [r[s] for s in steps], color=colour, lw=0.8, alpha=0.8,
                        label=p if i == 0 else None)
        ax.set_xlabel("step")
        ax.set_ylabel(f"train main loss (mean of {a.smooth} logs)")
        ax.set_ylim(top=min(8.0, ax.get_ylim()[1]))
        ax.legend()
        counts = {p: len(runs[p]) for p in runs}
        each = (f"{counts['bf16']} seeds each" if counts["bf16"] == counts["fp8"]
                else f"{counts['bf16']} bf16 and {counts['fp8']} fp8 seeds")
        ax.set_title(f"FP8 against bf16, {each}")
        fig.savefig(a.plot, dpi=110, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
