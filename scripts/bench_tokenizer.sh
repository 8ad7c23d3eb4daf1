#!/usr/bin/env bash
# Tokenizer speed on this machine: `gtron tokenizer train` on 10 MB of text to a vocabulary of 8192
# (wall time, as the CLI reports it), then `gtron tokenizer encode` of the same 10 MB pinned to one
# core (taskset -c 0; encoding time only, cold cache). Prints one JSON line. The text is
# scripts/text_corpus.sh's (fortunes + Python sources). Usage: scripts/bench_tokenizer.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/gtron-bench-tokenizer}
mkdir -p "$work"
bazel build //trainer:gtron >/dev/null 2>&1 || bazel build //trainer:gtron
gtron=bazel-bin/trainer/gtron
bytes=10000000
scripts/text_corpus.sh "$work/corpus.txt" "$bytes"
train=$("$gtron" tokenizer train --text "$work/corpus.txt" --vocab-size 8192 \
  --special '<|endoftext|>' --out "$work/tokenizer.json")
encode=$(taskset -c 0 "$gtron" tokenizer encode --tokenizer "$work/tokenizer.json" \
  --text "$work/corpus.txt")
/usr/bin/python3 - "$train" "$encode" "$bytes" <<'PY'
import json, os, sys
train, encode, nbytes = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
print(json.dumps({
    "corpus_bytes": nbytes,
    "train_vocab_size": train["vocab_size"],
    "train_unique_words": train["unique_words"],
    "train_seconds": round(train["seconds"], 3),
    "encode_tokens": encode["tokens"],
    "encode_seconds_one_core": round(encode["seconds"], 3),
    "encode_mb_per_s_one_core": round(encode["mb_per_s"], 2),
    "bytes_per_token": round(nbytes / encode["tokens"], 3),
    "cpus": os.cpu_count(),
}))
PY
