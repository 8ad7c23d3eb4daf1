#!/usr/bin/env bash
# Runs a command while nvidia-smi samples GPU 0's power draw, SM clock and throttle reasons, then
# prints one JSON line about the samples taken while the command ran (after --skip-s seconds):
#   {"power_gpu": true, "samples", "seconds", "power_w_mean", "power_w_max", "power_limit_w",
#    "sm_mhz_mean", "sm_mhz_min", "power_capped_fraction", "energy_j", "command"}
# power_capped_fraction: the share of samples whose throttle reasons include the software power
# cap (bit 0x4); energy_j: Σ power × interval over those samples. Divided by the steps run in that
# window it is the energy a step takes: at the cap, a step's time is its energy over the cap, so a
# faster kernel elsewhere in the step buys less than its own time (see docs/measurements.md).
# The command's own output comes first, unchanged. Exit status: the command's.
#
# Usage: scripts/power_gpu.sh [--interval-ms 100] [--skip-s 0] -- CMD [ARGS...]
#   e.g. scripts/power_gpu.sh --skip-s 20 -- .gpubin/bench_gpu --graphs full --steps 200
# GTRON_NVIDIA_SMI names the nvidia-smi to run (tests put a fake one there).
set -euo pipefail
interval_ms=100
skip_s=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --interval-ms) interval_ms="$2"; shift 2 ;;
    --skip-s) skip_s="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "power_gpu.sh: unknown argument '$1' (usage: [--interval-ms N] [--skip-s S] -- CMD ...)" >&2; exit 2 ;;
  esac
done
if [[ $# -eq 0 ]]; then
  echo "power_gpu.sh: no command given (usage: [--interval-ms N] [--skip-s S] -- CMD ...)" >&2
  exit 2
fi
if ! [[ "$interval_ms" =~ ^[0-9]+$ && "$interval_ms" -ge 10 ]]; then
  echo "power_gpu.sh: --interval-ms is a whole number of milliseconds >= 10, got '$interval_ms'" >&2
  exit 2
fi
if ! [[ "$skip_s" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "power_gpu.sh: --skip-s is a number of seconds >= 0, got '$skip_s'" >&2
  exit 2
fi
smi="${GTRON_NVIDIA_SMI:-nvidia-smi}"
samples="$(mktemp)"
trap 'rm -f "$samples"' EXIT
# One CSV line per sample, prefixed with the host's clock (seconds) so the skip window is exact.
"$smi" --id=0 --query-gpu=timestamp,power.draw,power.limit,clocks.sm,clocks_throttle_reasons.active \
  --format=csv,noheader,nounits -lms "$interval_ms" |
  while IFS= read -r line; do printf '%s,%s\n' "$(date +%s.%N)" "$line"; done >"$samples" &
sampler=$!
start="$(date +%s.%N)"
rc=0
"$@" || rc=$?
end="$(date +%s.%N)"
kill "$sampler" 2>/dev/null || true
wait "$sampler" 2>/dev/null || true
python3 - "$samples" "$start" "$end" "$skip_s" "$interval_ms" "$*" <<'EOF'
import json, sys
path, start, end, skip, interval_ms, command = sys.argv[1:7]
start, end, skip, dt = float(start), float(end), float(skip), float(interval_ms) / 1000.0
power, limit, mhz, capped = [], [], [], 0
for line in open(path):
    f = [x.strip() for x in line.split(",")]
    if len(f) < 6:
        continue
    try:
        t, p, lim, clk = float(f[0]), float(f[2]), float(f[3]), float(f[4])
        reasons = int(f[5], 16)
    except ValueError:
        continue  # "[N/A]" fields
    if t < start + skip or t > end:
        continue
    power.append(p)
    limit.append(lim)
    mhz.append(clk)
    capped += 1 if reasons & 0x4 else 0
n = len(power)
out = {"power_gpu": True, "samples": n, "seconds": round(max(0.0, end - start - skip), 3),
       "command": command}
if n:
    out.update({"power_w_mean": round(sum(power) / n, 1), "power_w_max": round(max(power), 1),
                "power_limit_w": round(max(limit), 1), "sm_mhz_mean": round(sum(mhz) / n, 1),
                "sm_mhz_min": round(min(mhz), 1), "power_capped_fraction": round(capped / n, 3),
                "energy_j": round(sum(power) * dt, 1)})
print(json.dumps(out))
EOF
exit "$rc"
