#!/usr/bin/env bash
# The test command: installs what is missing, builds everything (the CUDA sources too), runs every
# CPU test (GPU-tagged tests are filtered) and the convergence regression, then prints
# "N passed, N failed".
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh || exit 1

log=$(mktemp)
bazel build --config=ci //... 2>&1 | tail -n 30
build_rc=${PIPESTATUS[0]}
if ((build_rc != 0)); then
  echo "test: bazel build //... failed" >&2
  echo "0 passed, 1 failed"
  exit 1
fi
bazel test --config=ci //... 2>&1 | tee "$log"
test_rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//.* (PASSED|\(cached\) PASSED)' "$log")
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$log")
rm -f "$log"

conv_rc=0
if [[ -x scripts/convergence.sh ]]; then
  bash scripts/convergence.sh
  conv_rc=$?
  if ((conv_rc == 0)); then passed=$((passed + 1)); else failed=$((failed + 1)); fi
fi

if ((test_rc != 0 && failed == 0)); then failed=1; fi
echo "${passed} passed, ${failed} failed"
((test_rc == 0 && conv_rc == 0))
