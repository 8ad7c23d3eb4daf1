#!/usr/bin/python3
"""Draws loss curves from one or more metrics.jsonl files into a PNG.

Usage: scripts/plot_metrics.py runs/a/metrics.jsonl [runs/b/metrics.jsonl ...] -o loss.png
       [--meta DATA/meta.json] [--floor NATS]

Per file, in one colour: the training main loss (solid), each MTP depth's training loss (dashed,
dotted, ...), and the validation main and MTP losses (the "split": "val" records; dots, crosses,
pluses, ...). Horizontal lines:
the entropy floor (`entropy_rate`) and the unigram loss (`unigram_entropy`) of the data's
meta.json: --meta, else <run folder>/data/meta.json when it exists (the synthetic source);
--floor draws a floor by hand. Records without "split" (older files) are training records.

Needs Debian's python3-matplotlib, importable by /usr/bin/python3 (installed by scripts/setup.sh).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


DEPTH_LINES = ["--", ":", "-."]  # MTP depth 1, 2, 3 (then again)
DEPTH_MARKERS = ["x", "+", "^"]


def load(path):
    """(train, val): each a dict of steps, main and mtp (a list of per-depth lists)."""
    train = {"steps": [], "main": [], "mtp": []}
    val = {"steps": [], "main": [], "mtp": []}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_metrics: {path}:{n}: not JSON ({e})")
            if r.get("split", "train") == "val":
                val["steps"].append(r["step"])
                val["main"].append(r["val_main_loss"])
                val["mtp"].append(r.get("val_mtp_losses", []))
            else:
                train["steps"].append(r["step"])
                train["main"].append(r.get("main_loss", r["loss"]))
                train["mtp"].append(r.get("mtp_losses", []))
    return train, val


def meta_of(path, explicit):
    """The data's meta.json as a dict ({} when there is none)."""
    meta = explicit or os.path.join(os.path.dirname(os.path.abspath(path)), "data", "meta.json")
    if not os.path.exists(meta):
        if explicit:
            sys.exit(f"plot_metrics: --meta {explicit}: no such file")
        return {}
    with open(meta) as f:
        return json.load(f)


def depth_curves(rows):
    depth = max((len(m) for m in rows), default=0)
    return [[m[k] if len(m) > k else None for m in rows] for k in range(depth)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--out", default="loss.png")
    ap.add_argument("--meta", default=None,
                    help="the data's meta.json (default: <run folder>/data/meta.json)")
    ap.add_argument("--floor", type=float, default=None, help="a floor line by hand, nats/token")
    args = ap.parse_args()
    fig, ax = plt.subplots(figsize=(8, 5))
    lines = {}  # label -> value: each meta.json line once
    for path in args.files:
        train, val = load(path)
        (main_line,) = ax.plot(train["steps"], train["main"], label=f"{path}: train main")
        color = main_line.get_color()
        for k, curve in enumerate(depth_curves(train["mtp"])):
            ax.plot(train["steps"], curve, DEPTH_LINES[k % 3], color=color, alpha=0.6,
                    label=f"{path}: train mtp {k + 1}")
        if val["steps"]:
            ax.plot(val["steps"], val["main"], "o", color=color, label=f"{path}: val main")
            for k, curve in enumerate(depth_curves(val["mtp"])):
                ax.plot(val["steps"], curve, DEPTH_MARKERS[k % 3], color=color, alpha=0.6,
                        label=f"{path}: val mtp {k + 1}")
        meta = meta_of(path, args.meta)
        if "entropy_rate" in meta:
            lines[f"floor (entropy rate) {meta['entropy_rate']:.3f}"] = meta["entropy_rate"]
        if "unigram_entropy" in meta:
            lines[f"unigram {meta['unigram_entropy']:.3f}"] = meta["unigram_entropy"]
    if args.floor is not None:
        lines[f"floor {args.floor:.3f}"] = args.floor
    for (label, value), style in zip(lines.items(), [":", "-.", (0, (1, 3))] * len(lines)):
        ax.axhline(value, color="k", linestyle=style, linewidth=1, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}" + "".join(f" | {k}" for k in lines))


if __name__ == "__main__":
    main()
