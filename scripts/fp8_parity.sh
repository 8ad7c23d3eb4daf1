#!/usr/bin/env bash
# FP8 loss parity (issue 48, acceptance 2): a llama of C = 512 trained on real text, bf16 and fp8,
# three seeds each, on one GPU; then scripts/fp8_parity.py's table (final validation loss per
# run, the fp8 mean against the bf16 mean, the per-step curves against the bf16 seeds' spread).
#
#   scripts/fp8_parity.sh --pack DIR
#       here (any machine): DIR/corpus.jsonl.gz, every document of scripts/text_corpus.sh
#       --jsonl --unique (122 MB of text, no document twice: about 34M tokens, so a 2,000-step
#       run of 16.4M tokens never sees a token twice), and DIR/tokenizer.json (byte-level BPE,
#       vocabulary 8192, llama3 split pattern) trained on them; about 35 MB to carry.
#   scripts/fp8_parity.sh DIR [--steps N] [--seeds "1 2 3"] [--out RUNS] [--warmup W] [--device cpu]
#                         [--jobs J] [--batch B] [--data-seed S]
#       on the GPU machine: prepares DIR's corpus into shards (once), then trains every
#       (precision, seed) run for N steps (default 2000) into RUNS (default runs/fp8_parity),
#       J runs at a time (default 1; the model is small enough that several share one GPU, and
#       each run's result does not depend on what runs beside it), then prints the table as JSON
#       lines. GTRON=path/to/gtron (default .gpubin/gtron). --batch: sequences of 512 a step
#       (default 16, 8,192 tokens; 32 halves the gradient noise and still reads the unique corpus
#       about once in 2,000 steps). --data-seed: every run draws the same training windows
#       (data.seed = S), so the seeds differ only in their initialization and bf16 and fp8 of one
#       seed form a pair (default: each run's windows follow its seed).
#
# The model: llama, L=8, C=512, 8 query and 4 key/value heads of 64, SwiGLU width 1536, vocab
# 8192, T=512, 16 sequences a step (8,192 tokens), AdamW 1e-3 cosine with 100 warmup steps,
# graphs full, MTP off (D=0). Every linear size is a multiple of 128, so in fp8 every block linear
# runs its products in FP8.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--pack" ]]; then
  out=${2:?usage: scripts/fp8_parity.sh --pack DIR}
  mkdir -p "$out"
  bash scripts/text_corpus.sh --jsonl --unique "$out/corpus.jsonl.gz"
  scripts/gtron tokenizer train --text "$out/corpus.jsonl.gz" --pattern llama3 --vocab-size 8192 \
    --special '<|endoftext|>' --val-fraction 0.05 --out "$out/tokenizer.json"
  du -sh "$out"
  exit 0
fi

dir=${1:?usage: scripts/fp8_parity.sh DIR [--steps N] [--seeds \"1 2 3\"] [--out RUNS]}
shift
steps=2000
seeds="1 2 3"
runs=runs/fp8_parity
device=cuda
warmup=100
jobs=1
batch=16
data_seed=-1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --out) runs=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --data-seed) data_seed=$2; shift 2 ;;
    *) echo "fp8_parity.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
gtron=${GTRON:-.gpubin/gtron}
if [[ ! -f "$dir/shards/meta.json" ]]; then
  "$gtron" prepare --text "$dir/corpus.jsonl.gz" --tokenizer "$dir/tokenizer.json" \
    --val-fraction 0.05 --out "$dir/shards" | tail -2
fi
mkdir -p "$runs"
one_run() {  # PRECISION SEED
  local p=$1 seed=$2 start
  start=$(date +%s)
  "$gtron" train --config configs/llama_tiny.json --out "$runs/${p}_s$seed" \
    --set model.vocab_size=8192 --set model.context_length=512 --set model.n_layer=8 \
    --set model.n_head=8 --set model.n_kv_head=4 --set model.n_embd=512 \
    --set model.intermediate_size=1536 --set mtp.depth=0 \
    --set "data.train=$dir/shards/train_*.bin" --set "data.val=$dir/shards/val_*.bin" \
    --set train.seq_len=512 --set train.global_batch="$batch" --set train.micro_batch="$batch" \
    --set train.steps="$steps" --set train.eval_every=250 --set train.eval_batches=256 \
    --set train.seed="$seed" --set data.seed="$data_seed" --set train.precision="$p" --set train.device="$device" \
    --set optimizer.lr=1e-3 --set optimizer.weight_decay=0.1 --set schedule.warmup_steps="$warmup" \
    --set graphs.scope=full --set checkpoint.every=0 --set log.every=10 \
    >"$runs/${p}_s$seed.log" 2>&1 || { echo "run ${p}_s$seed failed:"; tail -5 "$runs/${p}_s$seed.log"; }
  echo "{\"run\": \"${p}_s$seed\", \"seconds\": $(( $(date +%s) - start ))}"
}
for seed in $seeds; do
  for p in bf16 fp8; do
    while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do wait -n || true; done
    one_run "$p" "$seed" &
  done
done
wait
python3 scripts/fp8_parity.py "$runs" --warmup "$warmup"
