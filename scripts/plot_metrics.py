#!/usr/bin/python3
"""Draws loss curves from one or more metrics.jsonl files into a PNG.

Usage: scripts/plot_metrics.py runs/a/metrics.jsonl [runs/b/metrics.jsonl ...] -o loss.png
       [--floor NATS] (a horizontal line, e.g. the entropy rate from meta.json)

Needs Debian's python3-matplotlib, importable by /usr/bin/python3 (installed by scripts/setup.sh).
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    steps, loss, main, mtp = [], [], [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_metrics: {path}:{n}: not JSON ({e})")
            steps.append(r["step"])
            loss.append(r["loss"])
            main.append(r.get("main_loss", r["loss"]))
            mtp.append(r.get("mtp_losses", []))
    return steps, loss, main, mtp


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--out", default="loss.png")
    ap.add_argument("--floor", type=float, default=None)
    args = ap.parse_args()
    fig, ax = plt.subplots(figsize=(8, 5))
    for path in args.files:
        steps, loss, main_loss, mtp = load(path)
        ax.plot(steps, main_loss, label=f"{path}: main")
        depth = max((len(m) for m in mtp), default=0)
        for k in range(depth):
            ax.plot(steps, [m[k] if len(m) > k else None for m in mtp], "--",
                    label=f"{path}: mtp {k + 1}")
    if args.floor is not None:
        ax.axhline(args.floor, color="k", linestyle=":", label=f"floor {args.floor:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
