#!/usr/bin/env bash
# Convergence regression (CPU): builds gtron, then runs the parallel x MTP matrix against the golden
# curves in tests/golden/. Prints a table and "N passed, N failed"; non-zero exit on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //trainer:gtron >/dev/null 2>&1 || bazel build //trainer:gtron
exec python3 scripts/convergence.py "$@"
