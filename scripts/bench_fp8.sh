#!/usr/bin/env bash
# FP8 on a GPU machine, in one command: the FP8 GPU tests, gtron bf16 against fp8 at the
# Llama-3.2-1B shape (B=8, T=1024, vocab 50304, tied, graphs full, D=0), torch.compile bf16 and the
# PyTorch FP8 rowwise reference (scripts/bench_torch.py --fp8 rowwise) at the same shape, and fp8
# over the IPC backend (GTP=2, TP=2 x GTP=2 on one GPU) against one process.
#
# Binaries: .gpubin/ as scripts/gpu_tests.sh fp8 leaves it (fp8_cuda_test, fp8_fused_cuda_test,
# bench_gpu, gtron), or GTRON_BIN=DIR. Run from the repository root:
#   bash scripts/bench_fp8.sh [--steps N]
set -u
cd "$(dirname "$0")/.."
bin=${GTRON_BIN:-.gpubin}
steps=20
if [[ "${1:-}" == "--steps" ]]; then steps=$2; fi
export LD_LIBRARY_PATH=$PWD/$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
echo "== fp8_cuda_test"
timeout 200 "$bin/fp8_cuda_test" 2>&1 | grep -v '^\[ RUN\|^\[       OK' | tail -30
echo "== fp8_fused_cuda_test"
timeout 200 "$bin/fp8_fused_cuda_test" 2>&1 | grep -v '^\[ RUN\|^\[       OK' | tail -30
L1B=(--arch llama --L 16 --C 2048 --NH 32 --NKV 8 --HS 64 --F 8192 --V 50304 --T 1024 --B 8
  --steps "$steps" --warmup 5)
for p in bf16 fp8 fp8 bf16; do
  echo "== gtron $p"
  timeout 150 "$bin/bench_gpu" "${L1B[@]}" --precision "$p" --graphs full --D 0 2>&1 | tail -1
done
# fp8 layouts on one GPU over the IPC backend: a llama of C = 256 whose weights shard into whole
# 128-row blocks at GTP = 2 (FP8 gathers), 12 steps, against one process.
S=(--set model.n_embd=256 --set model.n_head=4 --set model.n_kv_head=2
  --set model.intermediate_size=512 --set train.steps=12 --set train.global_batch=16
  --set train.micro_batch=4 --set train.seq_len=64 --set log.every=1 --set checkpoint.every=0
  --set train.eval_batches=1 --set schedule.warmup_steps=2 --set train.precision=fp8)
work=$(mktemp -d)
layout() {  # NAME LAUNCHER... -- EXTRA --set ARGS
  local name=$1
  shift
  local cmd=() extra=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do cmd+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift
  extra=("$@")
  timeout 200 "${cmd[@]}" train --config configs/llama_tiny.json "${S[@]}" "${extra[@]}" \
    --set train.out_dir="$work/$name" >"$work/$name.log" 2>&1
  echo "$name: exit $?"
}
layout one "$bin/gtron"
layout one_bf16 "$bin/gtron" -- --set train.precision=bf16
layout gtp2 python3 scripts/gtronrun --nproc-per-node 2 "$bin/gtron" -- \
  --set parallel.backend=ipc --set parallel.gtp=2
layout tp2gtp2 python3 scripts/gtronrun --nproc-per-node 4 "$bin/gtron" -- \
  --set parallel.backend=ipc --set parallel.gtp=2 --set parallel.tp=2
# Gathered bytes a step (metrics gtp_gathered_bytes, counted as the host issues the gathers, so
# graphs off): GTP=2 in fp8 against the same run in bf16.
layout bytes_fp8 python3 scripts/gtronrun --nproc-per-node 2 "$bin/gtron" -- \
  --set parallel.backend=ipc --set parallel.gtp=2 --set graphs.scope=none
layout bytes_bf16 python3 scripts/gtronrun --nproc-per-node 2 "$bin/gtron" -- \
  --set parallel.backend=ipc --set parallel.gtp=2 --set graphs.scope=none --set train.precision=bf16
python3 - "$work" <<'PY'
import json, sys
def losses(d):
    try:
        return [json.loads(l)["loss"] for l in open(f"{d}/metrics.jsonl") if '"val"' not in l]
    except OSError as e:
        return None
# The bound: FP8's own noise at this model, the largest relative distance between one process's
# fp8 and bf16 curves. A layout's fp8 run is another draw of that noise around the same bf16
# trajectory (its sums are reassociated, which moves a few codes; the recipe is the same), so by
# the triangle inequality it stays within twice that of one process's fp8 run.
base = losses(f"{sys.argv[1]}/one")
ref = losses(f"{sys.argv[1]}/one_bf16")
noise = max(abs(a - b) / abs(b) for a, b in zip(base, ref)) if base and ref else None
print(json.dumps({"fp8_noise": noise, "note": "max rel diff of one process fp8 vs bf16"}))
for name in ("gtp2", "tp2gtp2"):
    got = losses(f"{sys.argv[1]}/{name}")
    if not base or not got:
        print(json.dumps({"layout": name, "error": "no metrics"}))
        continue
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, base))
    print(json.dumps({"layout": name, "first": got[0], "one_process_first": base[0],
                      "max_rel_diff": worst, "steps": len(got),
                      "bound": 2 * noise if noise else None,
                      "within": bool(noise) and worst <= 2 * noise}))
def per_step(d):  # gathered bytes between the last two logged steps (log.every = 1), fp8 gathers
    try:
        rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"val"' not in l]
        return (rows[-1]["gtp_gathered_bytes"] - rows[-2]["gtp_gathered_bytes"],
                rows[-1]["gtp_fp8_gathers"] - rows[-2]["gtp_fp8_gathers"])
    except (OSError, KeyError, IndexError):
        return None
f, b = per_step(f"{sys.argv[1]}/bytes_fp8"), per_step(f"{sys.argv[1]}/bytes_bf16")
if f and b:
    print(json.dumps({"metric": "gtp_gathered_bytes_per_step", "layout": "gtp2", "fp8": f[0],
                      "bf16": b[0], "fp8_over_bf16": round(f[0] / b[0], 4),
                      "fp8_gathers_per_step": f[1]}))
else:
    print(json.dumps({"metric": "gtp_gathered_bytes_per_step", "error": "no metrics"}))
PY
echo "== torch.compile bf16"
timeout 200 python3 scripts/bench_torch.py --mode compile --D 0 "${L1B[@]}" 2>&1 | tail -1
echo "== torch.compile fp8 rowwise"
timeout 200 python3 scripts/bench_torch.py --mode compile --fp8 rowwise --D 0 "${L1B[@]}" 2>&1 |
  tail -1
