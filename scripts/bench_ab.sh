#!/usr/bin/env bash
# On a GPU machine: the two bench_gpu builds of scripts/bench_ab_pack.sh, base and new, alternating
# (base, new, base, new, ...) on the same arguments, then one summary line. Each run prints one
# JSON line: {"build", "round", "ms_per_step", "tokens_per_s", "peak_mem_gib", "loss"}. The summary:
# {"ab": {"rounds", "base_ms", "new_ms", "new_over_base": base median ms / new median ms (above 1:
# the new build is faster), "same_loss": whether every run ended on the same loss bits, "args"}}.
#   tar xJf .gpupack/ab.tar.xz && .gpuab/bench_ab.sh --rounds 2 -- --L 12 --C 1536 --NH 12 --B 16
# Defaults after the arguments: --steps 20 --warmup 5 --D 0 --graphs full unless given. Binaries
# come from GTRON_AB_DIR (default: this script's directory). Exit 2 on bad arguments, 1 if a run
# fails (its stderr tail is printed).
set -euo pipefail
usage() {
  echo "usage: bench_ab.sh [--rounds N] -- BENCH_GPU_ARGS..." >&2
  exit 2
}
rounds=2
while [[ $# -gt 0 && "$1" != "--" ]]; do
  case "$1" in
    --rounds)
      [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || usage
      rounds="$2"
      shift 2
      ;;
    *) usage ;;
  esac
done
[[ $# -gt 0 ]] || usage
shift
dir="${GTRON_AB_DIR:-$(cd "$(dirname "$0")" && pwd)}"
for b in base new; do
  if [[ ! -x "$dir/bench_gpu_$b" ]]; then
    echo "bench_ab.sh: $dir/bench_gpu_$b is missing (scripts/bench_ab_pack.sh builds it)" >&2
    exit 2
  fi
done
[[ -d "$dir/lib" ]] && export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
args=("$@")
for d in "--steps 20" "--warmup 5" "--D 0" "--graphs full"; do
  flag="${d%% *}"
  have=0
  for a in "${args[@]}"; do [[ "$a" == "$flag" ]] && have=1; done
  [[ $have -eq 1 ]] || args+=("$flag" "${d#* }")
done
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for r in $(seq 1 "$rounds"); do
  for b in base new; do
    if ! "$dir/bench_gpu_$b" "${args[@]}" >"$out/run.json" 2>"$out/run.err"; then
      echo "bench_ab.sh: bench_gpu_$b ${args[*]} failed:" >&2
      tail -20 "$out/run.err" >&2
      exit 1
    fi
    python3 - "$out/run.json" "$b" "$r" "$out/all.jsonl" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
line = {"build": sys.argv[2], "round": int(sys.argv[3]), "ms_per_step": j["ms_per_step"],
        "tokens_per_s": j["tokens_per_s"], "peak_mem_gib": j["peak_mem_gib"], "loss": j["loss"]}
print(json.dumps(line), flush=True)
open(sys.argv[4], "a").write(json.dumps(line) + "\n")
PY
  done
done
python3 - "$out/all.jsonl" "${args[*]}" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
ms = {b: [r["ms_per_step"] for r in runs if r["build"] == b] for b in ("base", "new")}
losses = {repr(r["loss"]) for r in runs}
print(json.dumps({"ab": {"rounds": len(ms["new"]), "base_ms": ms["base"], "new_ms": ms["new"],
                         "new_over_base": round(statistics.median(ms["base"]) /
                                                statistics.median(ms["new"]), 4),
                         "same_loss": len(losses) == 1, "args": sys.argv[2]}}))
PY
