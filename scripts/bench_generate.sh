#!/usr/bin/env bash
# Generation benchmark (issue 14): tokens/s of full recomputation (--recompute), of the KV cache,
# and of MTP self-speculative decoding (--speculative, with its acceptance), at each batch size,
# for a model trained on the tiny Markov source (order 2, 16 tokens) with each MTP depth D; with
# --hf, also Hugging Face transformers' generate() on the same shape (scripts/bench_hf_generate.py).
# Default shape: GPT-2 124M (L=12, C=768, NH=12, V=50257, context 1024), a 128-token prompt from
# the source's validation split, 256 new tokens, batch 1 and 16, D = 1 and 2, greedy.
#
# Output (stdout, JSON lines, also in DIR/results.jsonl):
#   one line per run: {"D", "batch", "mode", "device", "tokens", "tokens_per_s", "prefill_ms",
#     "proposed", "accepted", "acceptance"}, mode = cache | speculative | recompute | eager (a
#     failed run: {"D", "batch", "mode", "device", "error"} with its last stderr line);
#   with --hf, bench_hf_generate.py's lines ({"impl": "transformers", "batch", ...});
#   then one summary line per (D, batch): {"summary": true, "acceptance", "cache_over_recompute",
#     "speculative_over_cache", "cache_over_eager", "cache_over_transformers",
#     "same_tokens_as_speculative", "same_tokens_as_eager", "same_tokens_as_recompute"} (what was
#     measured; the same_tokens fields compare the printed ids, DIR/ids_D<d>_b<b>_<mode>.txt, of
#     greedy runs with the cache's).
# Recomputation does not depend on D (the same shape, the same work), so it runs once per batch
# size, on the first depth's model, after everything else (it is the slow path: at batch 16 it
# copies about 200 GB of logits to the host); its tokens/s is the divisor of every D's
# cache_over_recompute.
#
# Flags (a small CPU shape, for example:
#   scripts/bench_generate.sh --layers 2 --embd 64 --heads 4 --vocab 16 --context 256 \
#     --prompt 32 --tokens 64 --train-steps 1000 --lr 3e-3 --device cpu):
#   --layers L --embd C --heads NH --vocab V --context TMAX   model shape
#   --depths "1 2" --batches "1 16" --prompt P --tokens N      what is measured
#   --train-steps S --seq-len T --lr LR --device auto|cpu|cuda  how each model is trained
#                             (--seq-len defaults to prompt + tokens: every generated position
#                             trained)
#   --temperature X (0 = greedy) --out DIR (runs/bench_generate) --no-recompute (skip the slow path)
#   --sample-device cpu|cuda  where generation runs (default: cuda when --device is cuda, or is
#                             auto and nvidia-smi lists a GPU; else cpu)
#   --no-warmup               time each gtron sample from its first token: by default it passes
#                             --warmup (an untimed 8-token generation first, as
#                             bench_hf_generate.py times after one warm-up run), so the stats
#                             leave out the process's one-time CUDA start-up (about 80 ms on an
#                             H200: module loading, cuBLASLt's first calls)
#   --eager                   also time the cache with --no-graphs (eager CUDA steps), mode "eager"
#   --hf                      also run bench_hf_generate.py (torch + transformers) on the same
#                             shape, prompt, tokens and batches, fp32, after gtron's cached runs
# A trained model is reused when DIR/D<k>/checkpoints already holds its final step.
#
# Uses GTRON_BIN, or a prebuilt binary in .gpubin/ (GPU machines have no Bazel), or builds one.
# When the binary's folder has a lib/ (the shared libraries scripts/gpu_tests.sh collects), gtron
# runs with it on LD_LIBRARY_PATH; python never does (those libraries break torch).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
layers=12 embd=768 heads=12 vocab=50257 context=1024
depths="1 2" batches="1 16" prompt=128 tokens=256
steps=600 seq_len="" lr=6e-4 device=auto temperature=0 out=runs/bench_generate recompute=1
sample_device="" hf=0 eager=0 warmup=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --layers) layers=$2; shift 2 ;;
    --embd) embd=$2; shift 2 ;;
    --heads) heads=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --context) context=$2; shift 2 ;;
    --depths) depths=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --train-steps) steps=$2; shift 2 ;;
    --seq-len) seq_len=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --temperature) temperature=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-recompute) recompute=0; shift ;;
    --sample-device) sample_device=$2; shift 2 ;;
    --hf) hf=1; shift ;;
    --eager) eager=1; shift ;;
    --no-warmup) warmup=0; shift ;;
    *) echo "bench_generate.sh: unknown flag '$1' (see the comment at the top)" >&2; exit 2 ;;
  esac
done

bin="${GTRON_BIN:-}"
if [[ -z "$bin" && -x "$here/../.gpubin/gtron" ]]; then bin="$here/../.gpubin/gtron"; fi
if [[ -z "$bin" ]]; then
  (cd "$here/.." && { bazel build //trainer:gtron >/dev/null 2>&1 || bazel build //trainer:gtron; })
  bin="$here/../bazel-bin/trainer/gtron"
fi
libdir="$(cd "$(dirname "$bin")" && pwd)/lib"
gtron() {
  if [[ -d "$libdir" ]]; then
    LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bin" "$@"
  else
    "$bin" "$@"
  fi
}
py="$(command -v python3)"
# Train on windows that cover every position generation uses: the position embeddings of
# positions past the training length stay at their random init, and there the main model and
# its MTP depths disagree (acceptance collapses).
if [[ -z "$seq_len" ]]; then seq_len=$((prompt + tokens)); fi
if ((seq_len < prompt + tokens)); then
  echo "bench_generate.sh: warning: --seq-len $seq_len < prompt + tokens = $((prompt + tokens));" \
    "later positions are untrained" >&2
fi
if [[ -z "$sample_device" ]]; then
  sample_device=cpu
  if [[ $device == cuda ]] || { [[ $device == auto ]] && nvidia-smi -L >/dev/null 2>&1; }; then
    sample_device=cuda
  fi
fi

# train D: trains (or reuses) the model of depth D; prints its checkpoint directory.
train() {
  local d=$1 run="$out/D$1"
  local ckpt="$run/checkpoints/step_$(printf '%08d' "$steps")"
  if [[ ! -f "$ckpt/MANIFEST.json" ]]; then
    cat >"$out/D$d.json" <<JSON
{
  "model": {"vocab_size": $vocab, "context_length": $context, "n_layer": $layers,
            "n_head": $heads, "n_embd": $embd},
  "mtp": {"depth": $d},
  "data": {"synthetic": {"order": 2, "vocab": 16, "alpha": 0.2}},
  "optimizer": {"lr": $lr, "weight_decay": 0.0},
  "schedule": {"warmup_steps": $((steps / 10))},
  "train": {"steps": $steps, "global_batch": 16, "micro_batch": 16, "seq_len": $seq_len,
            "device": "$device", "out_dir": "$run"},
  "log": {"every": $(((steps + 4) / 5))}
}
JSON
    gtron train --config "$out/D$d.json" --overwrite >&2  # a partial earlier run: start over
  fi
  echo "$ckpt"
}

# The prompt: the first tokens of the source's validation split (llm.c shard: 1024-byte header,
# then uint16 tokens).
prompt_ids() {
  "$py" - "$out/D$1/data/val_000.bin" "$prompt" <<'PY'
import struct, sys
with open(sys.argv[1], "rb") as f:
    header = struct.unpack("<256i", f.read(1024))
    n = int(sys.argv[2])
    assert header[1] == 1 and header[2] >= n, "bench_generate.sh: short or uint32 val shard"
    print(",".join(str(t) for t in struct.unpack("<%dH" % n, f.read(2 * n))))
PY
}

# measure D BATCH MODE CKPT IDS: one gtron sample run, one JSON line.
measure() {
  local d=$1 b=$2 mode=$3 ckpt=$4 ids=$5 flags=()
  [[ $warmup == 1 ]] && flags+=(--warmup)
  [[ $mode == recompute ]] && flags+=(--recompute)
  [[ $mode == speculative ]] && flags+=(--speculative)
  [[ $mode == eager ]] && flags+=(--no-graphs)
  local stats head="{\"D\": $d, \"batch\": $b, \"mode\": \"$mode\", \"device\": \"$sample_device\""
  stats=$(gtron sample --checkpoint "$ckpt" --prompt-ids "$ids" --tokens "$tokens" \
    --batch "$b" --temperature "$temperature" --device "$sample_device" --print-ids \
    "${flags[@]}" 2>&1 >"$out/ids_D${d}_b${b}_$mode.txt" | tail -1) || true
  if [[ $stats == \{* ]]; then
    echo "$head, ${stats#\{}"
  else  # a failed run: its last stderr line, quotes and backslashes dropped
    stats=${stats//\"/}
    echo "$head, \"error\": \"${stats//\\/}\"}"
  fi
}

mkdir -p "$out"
first=""
{
  for d in $depths; do
    ckpt=$(train "$d")
    ids=$(prompt_ids "$d")
    [[ -z "$first" ]] && first="$d $ckpt $ids"
    for b in $batches; do
      measure "$d" "$b" cache "$ckpt" "$ids"
      measure "$d" "$b" speculative "$ckpt" "$ids"
      if [[ $eager == 1 ]]; then measure "$d" "$b" eager "$ckpt" "$ids"; fi
    done
  done
  if [[ $hf == 1 ]]; then
    # shellcheck disable=SC2086
    "$py" "$here/bench_hf_generate.py" --layers "$layers" --embd "$embd" --heads "$heads" \
      --vocab "$vocab" --context "$context" --prompt "$prompt" --tokens "$tokens" \
      --batches $batches --repeats 2
  fi
  if [[ $recompute == 1 ]]; then
    read -r d ckpt ids <<<"$first"
    for b in $batches; do measure "$d" "$b" recompute "$ckpt" "$ids"; done
  fi
} | tee "$out/results.jsonl"

"$py" - "$out/results.jsonl" <<'PY'
import json, os, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
gtron = [r for r in runs if "mode" in r and "error" not in r]
speed = {(r["D"], r["batch"], r["mode"]): r["tokens_per_s"] for r in gtron}
recompute = {r["batch"]: r["tokens_per_s"] for r in gtron if r["mode"] == "recompute"}
hf = {r["batch"]: r["tokens_per_s"] for r in runs if r.get("impl") == "transformers"}
out = os.path.dirname(sys.argv[1])
def ids(d, b, mode):
    p = os.path.join(out, "ids_D%d_b%d_%s.txt" % (d, b, mode))
    return open(p).read() if (d, b, mode) in speed and os.path.exists(p) else None
first_d = min((r["D"] for r in gtron if r["mode"] == "recompute"), default=None)
acc = {(r["D"], r["batch"]): r["acceptance"] for r in gtron if r["mode"] == "speculative"}
for (d, b) in sorted({(r["D"], r["batch"]) for r in gtron}):
    s = {"D": d, "batch": b, "summary": True, "acceptance": acc.get((d, b))}
    cache = speed.get((d, b, "cache"))
    if cache and b in recompute:
        s["cache_over_recompute"] = round(cache / recompute[b], 2)
    if cache and (d, b, "speculative") in speed:
        s["speculative_over_cache"] = round(speed[(d, b, "speculative")] / cache, 2)
    if cache and (d, b, "eager") in speed:
        s["cache_over_eager"] = round(cache / speed[(d, b, "eager")], 2)
    if cache and b in hf:
        s["cache_over_transformers"] = round(cache / hf[b], 2)
    # The printed ids (prompt + new tokens of every row) of the other modes against the cache's.
    for mode, d_of in (("speculative", d), ("eager", d), ("recompute", first_d)):
        if d_of == d and ids(d, b, "cache") is not None and ids(d, b, mode) is not None:
            s["same_tokens_as_" + mode] = ids(d, b, "cache") == ids(d, b, mode)
    print(json.dumps(s))
PY
