#!/usr/bin/env bash
# Regenerates the golden loss curves in tests/golden/ on purpose (1 process, CPU) and prints what
# changed. CI never runs this; review the diff (git diff tests/golden) before committing.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //trainer:gtron >/dev/null 2>&1 || bazel build //trainer:gtron
python3 scripts/convergence.py --regen "$@"
git --no-pager diff --stat -- tests/golden || true
