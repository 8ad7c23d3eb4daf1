#!/usr/bin/env bash
# The llama family on one GPU (GPU machine; not run in CI), from the repository root with the
# binaries in .gpubin/ (scripts/gpu_tests.sh) or bazel-bin/:
#   scripts/check_llama_gpu.sh [OUT_DIR]
# For three tiny members (Llama-3 style: GQA + llama3 RoPE scaling, tied; Llama with an untied head
# and MQA; Qwen3 style: q/k norms, head size 12 != C/NH, untied), each with MTP D=2, 20 steps:
#   - fp32 on CUDA with graphs none, layers and full: the three loss curves bit for bit equal;
#   - fp32 on CUDA against the same config on the CPU: worst relative loss difference;
#   - bf16 on CUDA, graphs full, twice: bit-identical reruns, no allocator misses from step 5 on;
#   - the fp32 checkpoint's logits (`gtron logits`) against transformers' LlamaForCausalLM /
#     Qwen3ForCausalLM loaded with the same tensors (scripts/check_llama_hf.py, fp32, 1e-5).
# Prints one JSON line per check; exits 1 if any check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
gtron=.gpubin/gtron
[[ -x $gtron ]] || gtron=bazel-bin/trainer/gtron
out=${1:-/tmp/gtron_llama_gpu}
rm -rf "$out"
mkdir -p "$out"
fail=0

members=(
  'llama3|"n_kv_head": 2, "rope_theta": 10000, "rope_scaling": {"type": "llama3", "factor": 4, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 16}'
  'llama_untied_mqa|"n_kv_head": 1, "tied_embeddings": false'
  'qwen3|"n_kv_head": 2, "head_dim": 12, "qk_norm": true, "tied_embeddings": false, "rope_theta": 1000000'
)

for m in "${members[@]}"; do
  name=${m%%|*}
  keys=${m#*|}
  dir=$out/$name
  mkdir -p "$dir"
  cat >"$dir/c.json" <<EOF
{"model": {"arch": "llama", "vocab_size": 64, "context_length": 32, "n_layer": 2, "n_head": 4,
           "n_embd": 64, "intermediate_size": 96, $keys},
 "mtp": {"depth": 2},
 "data": {"synthetic": {"vocab": 64, "tokens": 50000, "val_tokens": 5000}},
 "optimizer": {"lr": 3e-3}, "schedule": {"warmup_steps": 5},
 "train": {"steps": 20, "global_batch": 16, "micro_batch": 8, "seq_len": 32},
 "checkpoint": {"every": 0}, "log": {"every": 1}}
EOF
  run() {  # run NAME SETS...
    local run=$1
    shift
    local sets=()
    for s in "$@"; do sets+=(--set "$s"); done
    if ! "$gtron" train --config "$dir/c.json" --out "$dir/$run" "${sets[@]}" >"$dir/$run.log" 2>&1; then
      echo "{\"member\": \"$name\", \"run\": \"$run\", \"error\": \"train failed\"}"
      tail -5 "$dir/$run.log"
      fail=1
    fi
  }
  for g in none layers full; do run "fp32_$g" train.device=cuda train.precision=fp32 graphs.scope=$g; done
  run cpu train.device=cpu
  run bf16_a train.device=cuda train.precision=bf16 graphs.scope=full
  run bf16_b train.device=cuda train.precision=bf16 graphs.scope=full
  python3 - "$name" "$dir" <<'EOF' || fail=1
import json, sys
name, d = sys.argv[1], sys.argv[2]
def losses(run):
    return [json.loads(l)["loss"] for l in open(f"{d}/{run}/metrics.jsonl") if '"loss"' in l]
def misses(run):  # allocator misses (cumulative) at steps 5 and 20: equal = none in steady state
    r = {j["step"]: j["alloc_misses"] for j in map(json.loads, open(f"{d}/{run}/metrics.jsonl"))
         if "alloc_misses" in j}
    return [r.get(5), r.get(20)]
none, layers, full, cpu = (losses(r) for r in ("fp32_none", "fp32_layers", "fp32_full", "cpu"))
a, b = losses("bf16_a"), losses("bf16_b")
worst = max(abs(x - y) / abs(y) for x, y in zip(none, cpu))
m = misses("bf16_a")
ok = (len(none) == 20 and none == layers == full and a == b and worst < 1e-5 and
      m[0] is not None and m[0] == m[1])
print(json.dumps({"member": name, "fp32_graphs_none_layers_full_equal": none == layers == full,
                  "fp32_cuda_vs_cpu_worst_rel": worst, "bf16_rerun_equal": a == b,
                  "bf16_last_loss": a[-1] if a else None, "fp32_first_last": [none[0], none[-1]],
                  "bf16_alloc_misses_steps_5_20": m, "ok": ok}))
sys.exit(0 if ok else 1)
EOF
  ckpt=$dir/fp32_none/checkpoints/step_00000020
  "$gtron" logits --checkpoint "$ckpt" --tokens 1,2,3,63,0,7,7,7,20,9,4,4,12,30,2,5,40,41,42,43,1,1,1,1,50,51,52,53,60,61,62,63 \
    --tokens 8,6,7,5,3,0,9,1,1,2,2,3,3,4,4,5,9,9,9,9,33,34,35,36,37,38,39,40,41,42,43,44 \
    --out "$dir/logits.safetensors" >/dev/null || fail=1
  python3 scripts/check_llama_hf.py "$ckpt" "$dir/logits.safetensors" --tolerance 1e-5 || fail=1
done
exit $fail
