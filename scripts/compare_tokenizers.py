#!/usr/bin/env python3
"""gtron's BPE against Hugging Face `tokenizers`, on a machine where `tokenizers` is installed.

1. gtron trains a tokenizer on CORPUS; `tokenizers` loads its tokenizer.json and encodes a held-out
   text; gtron encodes the same text; the ids must be identical.
2. `tokenizers` trains a byte-level BPE on CORPUS (same vocabulary size and special token); gtron
   loads that tokenizer.json and encodes the held-out text; the ids must be identical.
3. Any GPT-2 tokenizer.json found in the local Hugging Face cache gets the same check (no download).
4. Speed beside gtron's: tokenizers' training time (all cores, and one thread) and its encoding
   throughput on one core (one encode() call of the whole corpus).

The held-out text is HELDOUT plus a generated stretch of mixed scripts, digits, punctuation,
emoji and unusual whitespace (seeded), to exercise the Unicode classes of the split pattern.
Prints one JSON object; exit code 1 if any comparison differs.

Usage: compare_tokenizers.py --gtron BIN --corpus FILE --heldout FILE [--vocab-size 8192] [--work D]
"""
import argparse
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import time

EOT = "<|endoftext|>"


def generated_text(seed, n):
    """n characters from several scripts, categories and whitespace kinds."""
    rng = random.Random(seed)
    ranges = [(0x41, 0x5A), (0x61, 0x7A), (0x30, 0x39), (0xC0, 0x24F), (0x370, 0x3FF),
              (0x400, 0x4FF), (0x5D0, 0x5EA), (0x620, 0x64A), (0x660, 0x669), (0x900, 0x97F),
              (0x3040, 0x309F), (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x1F600, 0x1F64F),
              (0x2000, 0x206F), (0x21, 0x2F), (0x300, 0x36F), (0xFF10, 0xFF19)]
    spaces = [" ", " ", " ", "  ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u2003", "\u3000",
              "\u2028", "\u000b", "\u000c", "\u0085", "\u1680", "\u200b", "\ufeff"]
    out = []
    while len(out) < n:
        lo, hi = rng.choice(ranges)
        out.extend(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))
        if rng.random() < 0.3:
            out.append(rng.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", EOT]))
        out.append(rng.choice(spaces))
    return "".join(out)


def gtron_encode(gtron, tokenizer_json, text_file, ids_file, one_core=True):
    pin = one_core and shutil.which("taskset")
    cmd = (["taskset", "-c", "0"] if pin else []) + [
        gtron, "tokenizer", "encode", "--tokenizer", tokenizer_json, "--text", text_file,
        "--ids-out", ids_file]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"gtron encode failed ({r.returncode}): {r.stderr}")
    with open(ids_file) as f:
        ids = [int(t) for t in f.read().split()]
    return ids, json.loads(r.stdout)


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(name, tok, gtron, tokenizer_json, heldout_file, text, work):
    hf_ids = tok.encode(text).ids
    gt_ids, _ = gtron_encode(gtron, tokenizer_json, heldout_file, os.path.join(work, name + ".ids"))
    diff = first_difference(hf_ids, gt_ids)
    res = {"tokens_tokenizers": len(hf_ids), "tokens_gtron": len(gt_ids), "identical": diff is None}
    if diff is not None:
        res["first_difference"] = diff
        res["tokenizers_ids"] = hf_ids[max(0, diff - 3):diff + 5]
        res["gtron_ids"] = gt_ids[max(0, diff - 3):diff + 5]
        res["tokenizers_pieces"] = [tok.id_to_token(i) for i in res["tokenizers_ids"]]
        res["gtron_pieces"] = [tok.id_to_token(i) for i in res["gtron_ids"]]
    res["decode_roundtrip_tokenizers"] = tok.decode(gt_ids, skip_special_tokens=False) == text
    return res


def train_tokenizers(corpus, vocab_size, threads):
    """A byte-level BPE trained by tokenizers; threads is informational (RAYON_NUM_THREADS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    t0 = time.time()
    tok.train([corpus], trainer)
    return tok, time.time() - t0


def section(report, key, fn):
    """report[key] = fn(), or the error it raised (so one failure does not hide the rest)."""
    try:
        report[key] = fn()
    except BaseException as e:  # noqa: B036 -- SystemExit from a failed gtron call included
        report[key] = {"error": f"{type(e).__name__}: {e}"}


def one_thread_train_seconds(corpus, vocab_size):
    env = dict(os.environ, RAYON_NUM_THREADS="1", RAYON_RS_NUM_CPUS="1")
    r = subprocess.run([sys.executable, __file__, "--train-seconds-only", "--corpus", corpus,
                        "--vocab-size", str(vocab_size), "--gtron", "-", "--heldout", "-"],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return round(float(r.stdout.strip()), 3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gtron", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--work", default="/tmp/compare_tokenizers")
    ap.add_argument("--train-seconds-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.train_seconds_only:
        print(train_tokenizers(a.corpus, a.vocab_size, 1)[1])
        return
    os.makedirs(a.work, exist_ok=True)
    import tokenizers
    from tokenizers import Tokenizer
    with open(a.heldout, encoding="utf-8") as f:
        text = f.read() + generated_text(7, 200000)
    heldout = os.path.join(a.work, "heldout.txt")
    with open(heldout, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    report = {"tokenizers_version": tokenizers.__version__, "cpus": os.cpu_count(),
              "heldout_chars": len(text), "heldout_bytes": len(text.encode("utf-8"))}

    gt_json = os.path.join(a.work, "gtron_tokenizer.json")
    r = subprocess.run([a.gtron, "tokenizer", "train", "--text", a.corpus, "--vocab-size",
                        str(a.vocab_size), "--special", EOT, "--out", gt_json],
                       capture_output=True, text=True, check=True)
    report["gtron_train"] = json.loads(r.stdout)
    section(report, "gtron_trained_in_tokenizers", lambda: compare(
        "gtron_trained", Tokenizer.from_file(gt_json), a.gtron, gt_json, heldout, text, a.work))

    hf_tok, hf_train_s = train_tokenizers(a.corpus, a.vocab_size, None)
    hf_json = os.path.join(a.work, "tokenizers_tokenizer.json")
    hf_tok.save(hf_json)
    section(report, "tokenizers_trained_in_gtron", lambda: compare(
        "tokenizers_trained", Tokenizer.from_file(hf_json), a.gtron, hf_json, heldout, text,
        a.work))

    hub = os.environ.get("HF_HUB_CACHE", os.path.expanduser("~/.cache/huggingface/hub"))
    gpt2 = sorted(glob.glob(os.path.join(hub, "models--*gpt2*/snapshots/*/tokenizer.json")))
    if gpt2:
        section(report, "gpt2_in_gtron", lambda: compare(
            "gpt2", Tokenizer.from_file(gpt2[0]), a.gtron, gpt2[0], heldout, text, a.work))
        report["gpt2_file"] = gpt2[0]
    else:
        report["gpt2_in_gtron"] = "no GPT-2 tokenizer.json in the local Hugging Face cache"

    with open(a.corpus, encoding="utf-8", errors="replace") as f:
        corpus_text = f.read()
    fresh = Tokenizer.from_file(hf_json)
    t0 = time.time()
    n = len(fresh.encode(corpus_text).ids)
    enc_s = time.time() - t0
    _, gt_enc = gtron_encode(a.gtron, gt_json, a.corpus, os.path.join(a.work, "corpus.ids"))
    nbytes = os.path.getsize(a.corpus)
    section(report, "tokenizers_train_seconds_one_thread",
            lambda: one_thread_train_seconds(a.corpus, a.vocab_size))
    report["speed"] = {
        "corpus_bytes": nbytes,
        "tokenizers_train_seconds_all_cores": round(hf_train_s, 3),
        "tokenizers_encode_mb_per_s_one_call": round(nbytes / enc_s / 1e6, 2),
        "tokenizers_encode_tokens": n,
        "gtron_train_seconds": round(report["gtron_train"]["seconds"], 3),
        "gtron_encode_mb_per_s_one_core": round(gt_enc["mb_per_s"], 2),
    }
    print(json.dumps(report, indent=1))
    ok = all(isinstance(report[k], dict) and report[k].get("identical") for k in
             ["gtron_trained_in_tokenizers", "tokenizers_trained_in_gtron"])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
