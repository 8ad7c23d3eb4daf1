#!/usr/bin/env bash
# scripts/power_gpu.sh against a fake nvidia-smi that reports 600 W at a 700 W limit, capped
# (throttle reason 0x4) on every other sample: the JSON line's means, cap share and energy, the
# command's exit status passed through, the skip window, and bad arguments exiting 2.
set -euo pipefail
script="$1"
dir="${TEST_TMPDIR:-/tmp}/power_gpu_test"
mkdir -p "$dir"
cat >"$dir/nvidia-smi" <<'SMI'
#!/usr/bin/env bash
# Every 20 ms: timestamp, power.draw, power.limit, clocks.sm, clocks_throttle_reasons.active.
i=0
while true; do
  if (( i % 2 )); then r=0x0000000000000004; c=1500; else r=0x0000000000000000; c=1700; fi
  echo "2026/12/04 12:00:00.000, 600.00, 700.00, $c, $r"
  i=$((i + 1))
  sleep 0.02
done
SMI
chmod +x "$dir/nvidia-smi"
export GTRON_NVIDIA_SMI="$dir/nvidia-smi"

bash "$script" --interval-ms 20 -- sh -c 'echo hello; sleep 1' >"$dir/out.txt"
python3 - "$dir/out.txt" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert lines[0] == "hello", lines            # the command's output first, unchanged
s = json.loads(lines[-1])
assert s["power_gpu"] is True
assert 20 <= s["samples"] <= 60, s          # about 1 s / 20 ms
assert s["power_w_mean"] == 600.0 and s["power_w_max"] == 600.0 and s["power_limit_w"] == 700.0, s
assert 1500 <= s["sm_mhz_mean"] <= 1700 and s["sm_mhz_min"] == 1500.0, s
assert 0.3 <= s["power_capped_fraction"] <= 0.7, s
assert abs(s["energy_j"] - 600.0 * 0.02 * s["samples"]) < 0.1, s
assert "sleep 1" in s["command"], s
PY

# The command's exit status is the script's; a skip longer than the run leaves no samples.
set +e
bash "$script" --interval-ms 20 --skip-s 5 -- sh -c 'sleep 0.2; exit 3' >"$dir/out2.txt"
rc=$?
set -e
[[ $rc == 3 ]] || { echo "exit status $rc, want 3"; exit 1; }
python3 -c 'import json,sys; s=json.loads(open(sys.argv[1]).read().splitlines()[-1]); assert s["samples"] == 0 and "power_w_mean" not in s, s' "$dir/out2.txt"

# Bad arguments: exit 2 with a message naming the argument.
for args in "--interval-ms 5 -- true" "--skip-s -1 -- true" "--bogus -- true" ""; do
  set +e
  # shellcheck disable=SC2086
  bash "$script" $args >/dev/null 2>"$dir/err.txt"
  rc=$?
  set -e
  [[ $rc == 2 ]] || { echo "'$args': exit $rc, want 2"; exit 1; }
  grep -q "power_gpu.sh:" "$dir/err.txt" || { echo "'$args': no message"; exit 1; }
done
echo "power_gpu_test: ok"
