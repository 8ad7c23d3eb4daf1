#!/usr/bin/env bash
# Multi-rank layouts on ONE GPU over the IPC backend (parallel.backend=ipc): trains a small GPT
# (L=4, C=256, NH=4, V=256, T=256, micro-batch 4, MTP D=1, bf16, synthetic data) for
# GTRON_BENCH_STEPS (20) steps per layout through scripts/gtronrun with log.comm_timing on, and
# prints one JSON line per layout:
#   {"layout", "backend", "nproc", "tokens_per_s", "ms_per_step", "comm_ag_ms", "comm_rs_ms",
#    "comm_ar_ms", "comm_exposed_ms"}
# (the last logged step's values; comm_* are per step on rank 0's communicators, eager
# collectives only). Its speed means little — the ranks' contexts time-slice one GPU — it shows
# that a layout runs and where its time goes. Layouts as arguments, from: one dp2 gtp2 gtp4 tp2
# tp2_gtp2 dp2_gtp2 (default: one dp2 gtp2 tp2). Several GPUs and NCCL: scripts/bench_multigpu.py.
#
# The binary: .gpubin/gtron (scripts/gpu_tests.sh), else bazel-bin/trainer/gtron. Run from the
# repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.gpubin/gtron
[[ -x "$bin" ]] || bin=bazel-bin/trainer/gtron
[[ -x "$bin" ]] || { echo "bench_ipc.sh: no gtron binary (.gpubin/ or bazel-bin/)" >&2; exit 2; }
steps=${GTRON_BENCH_STEPS:-20}
layouts=("$@")
[[ ${#layouts[@]} -gt 0 ]] || layouts=(one dp2 gtp2 tp2)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/c.json" <<EOF
{"model": {"vocab_size": 256, "context_length": 256, "n_layer": 4, "n_head": 4, "n_embd": 256},
 "mtp": {"depth": 1}, "data": {"synthetic": {"vocab": 256, "tokens": 400000, "val_tokens": 20000}},
 "schedule": {"warmup_steps": 2},
 "train": {"steps": $steps, "global_batch": 16, "micro_batch": 4, "seq_len": 256,
           "device": "cuda", "eval_batches": 1},
 "log": {"every": $steps, "comm_timing": true}}
EOF
for l in "${layouts[@]}"; do
  case "$l" in
    one) n=1 sets=() ;;
    dp2) n=2 sets=() ;;
    gtp2) n=2 sets=(--set parallel.gtp=2) ;;
    gtp4) n=4 sets=(--set parallel.gtp=4) ;;
    tp2) n=2 sets=(--set parallel.tp=2) ;;
    tp2_gtp2) n=4 sets=(--set parallel.tp=2 --set parallel.gtp=2) ;;
    dp2_gtp2) n=4 sets=(--set parallel.gtp=2) ;;
    *) echo "bench_ipc.sh: unknown layout '$l'" >&2; exit 2 ;;
  esac
  out="$work/$l"
  if [[ $n -eq 1 ]]; then
    "$bin" train --config "$work/c.json" --out "$out" > "$out.log" 2>&1
  else
    python3 scripts/gtronrun --standalone --nproc-per-node "$n" -- "$bin" train \
      --config "$work/c.json" --out "$out" --set parallel.backend=ipc "${sets[@]}" > "$out.log" 2>&1
  fi || { echo "bench_ipc.sh: layout $l failed:" >&2; tail -5 "$out.log" >&2; exit 1; }
  python3 - "$out/metrics.jsonl" "$l" "$n" <<'EOF'
import json, sys
last = [json.loads(x) for x in open(sys.argv[1]) if '"tokens_per_s"' in x][-1]
tps = last["tokens_per_s"]
row = {"layout": sys.argv[2], "backend": "ipc" if int(sys.argv[3]) > 1 else "none",
       "nproc": int(sys.argv[3]), "tokens_per_s": tps, "ms_per_step": 16 * 256 / tps * 1e3}
for k in ("comm_ag_ms", "comm_rs_ms", "comm_ar_ms", "comm_exposed_ms"):
    row[k] = last.get(k)
print(json.dumps(row))
EOF
done
