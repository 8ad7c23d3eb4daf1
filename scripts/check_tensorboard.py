#!/usr/bin/env python3
"""Reads a run folder of TensorBoard event files the way TensorBoard does and prints its scalars.

Usage: scripts/check_tensorboard.py RUN_DIR

Loads every events.out.tfevents.* file in RUN_DIR (not its sub-folders; a gtron run folder, whose
files are in RUN_DIR/tensorboard/ (log.tensorboard), is read there) with TensorBoard's own
EventAccumulator, keeping every point, and prints one JSON object:
  {"run": RUN_DIR, "tags": [sorted scalar tags],
   "scalars": {tag: {"points": N, "last_step": S, "last_value": V}}}
Exit code: 0 when at least one scalar was found, 1 when none, 2 for a missing folder or bad
arguments. Needs the `tensorboard` Python package (the GPU machines have it; CI does not run
this script): it checks that files from trainer/tensorboard.h are what TensorBoard reads.

Note: EventAccumulator drops points whose step goes back below an earlier one (it takes them for
a restarted run), as TensorBoard's UI does.
"""

import argparse
import json
import math
import os
import sys


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("run_dir", help="folder holding events.out.tfevents.* files")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.run_dir):
        print(f"check_tensorboard: no such folder: {args.run_dir}", file=sys.stderr)
        return 2

    events = lambda d: [f for f in os.listdir(d) if f.startswith("events.out.tfevents.")]
    sub = os.path.join(args.run_dir, "tensorboard")
    if not events(args.run_dir) and os.path.isdir(sub) and events(sub):
        args.run_dir = sub  # a gtron run folder

    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(
        args.run_dir, size_guidance={event_accumulator.SCALARS: 0})  # 0: keep every point
    acc.Reload()
    tags = sorted(acc.Tags().get(event_accumulator.SCALARS, []))
    scalars = {}
    for tag in tags:
        points = acc.Scalars(tag)
        last = points[-1]
        value = last.value if math.isfinite(last.value) else str(last.value)  # JSON has no NaN
        scalars[tag] = {"points": len(points), "last_step": last.step, "last_value": value}
    print(json.dumps({"run": args.run_dir, "tags": tags, "scalars": scalars}, indent=1))
    if not scalars:
        print(f"check_tensorboard: no scalars in {args.run_dir}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
