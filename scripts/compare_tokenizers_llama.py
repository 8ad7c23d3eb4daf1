#!/usr/bin/env python3
"""gtron's Llama-3- and Qwen2-style tokenizers against Hugging Face `tokenizers` (GPU machine).

`tokenizers` itself builds two tokenizers on a generated corpus (seeded, mixed scripts):
  llama3  BPE with ignore_merges, pre_tokenizer Sequence[Split(Llama-3 regex, Isolated),
          ByteLevel(use_regex=False)], special tokens, a TemplateProcessing that puts
          <|begin_of_text|> first, a non-special added token, ByteLevel decoder;
  qwen2   the same shape with Qwen2's regex, ignore_merges False, no template, and Qwen2's NFC
          normalizer (the text holds decomposed spellings: e + U+0301, Hangul jamo).
Each is saved as tokenizer.json; gtron (`tokenizer encode`) and `tokenizers` (`encode()`, special
tokens added as by default) encode the same generated text (--mb MB, another seed), and the ids
must agree token for token. Then gtron trains with --pattern llama3 and `tokenizers` loads that
file and encodes the text too (gtron_llama3). --every-code-point appends every code point in a
few contexts to the text (about 70 MB more; slower).

Prints one JSON line per tokenizer; exit code 1 on any difference or error.

Usage (from a directory holding the gtron binary at .gpubin/gtron):
  python3 scripts/compare_tokenizers_llama.py [--gtron .gpubin/gtron] [--mb 1.5] [--work DIR]
"""
import argparse
import json
import os
import random
import subprocess
import sys

from gtron_bin import gtron_env

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = "<tool>"  # a non-special added token

WORDS = ["the", "of", "and", "tokenizer", "Hello", "WORLD", "naïve", "café", "Ünïcödé", "東京",
         "タワー", "日本語のテキスト", "中文分词", "Привет", "мир", "ЗДРАВСТВУЙ", "ελληνικά", "עברית", "cafe\u0301",
         "\u1112\u1161\u11ab\u1100\u116e\u11a8", "A\u030a\u212b",
         "العربية", "हिन्दी", "한국어", "ไทย", "straße", "ǅemal", "ﬁne", "x²", "Ⅻ", "½"]
SPACES = [" ", " ", " ", " ", "  ", "\t", "\n", "\r\n", "\n\n", "  \n", " \t ", "\r", "\u00a0",
          "\u3000", "\u2003", "\u2028", "\u0085", "\u180e", "\u200b", "\ufeff", "\x0b", "\x0c"]
PUNCT = [".", ",", "!", "?", "...", "!!\r\n", ":", ";", "-", "—", "(", ")", "\"", "'", "«»", "@#",
         "$", "%", "&*", "/", "\\", "~", "`", "[", "]", "{}", "「", "」", "。", "、"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL",
                "'D", "'ſ", "'x"]
EMOJI = ["😀", "👍🏽", "🇩🇪", "👨\u200d👩\u200d👧", "❤️", "🎉🎉", "🤖"]
# Ranges to draw single characters from: scripts, marks, digits of several systems, symbols, and
# letters/numbers new in Unicode 15-16 (gtron's PCRE2 knows Unicode 14; see pretokenize.h).
# Nag Mundari's four combining marks U+1E4EC-U+1E4EF (Unicode 15) are left out: NFC reorders a
# run of them by their combining classes under ICU's Unicode 15 tables (gtron), while
# `tokenizers`' normalizer, whose tables predate them, leaves the run as it is (measured on the
# H200: the qwen2 tokenizer's first difference was such a pair). That is a difference of Unicode
# versions, not of the tokenizer's logic.
RANGES = [(0x21, 0x7E), (0xA1, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
          (0x5D0, 0x5EA), (0x620, 0x64A), (0x660, 0x669), (0x900, 0x97F), (0x966, 0x96F),
          (0x1C80, 0x1C8A), (0x2000, 0x206F), (0x2150, 0x218B), (0x3040, 0x30FF), (0x4E00, 0x9FFF),
          (0xAC00, 0xD7A3), (0xFF01, 0xFF5E), (0x10D40, 0x10D85), (0x1E4D0, 0x1E4EB), (0x1E4F0, 0x1E4F9),
          (0x1F300, 0x1F64F), (0x20000, 0x2A6DF), (0x31350, 0x323AF)]


def generated_text(seed, nbytes, specials):
    """At least nbytes of UTF-8: words, numbers, contractions, emoji, odd whitespace, specials."""
    rng = random.Random(seed)
    out, size = [], 0
    while size < nbytes:
        r = rng.random()
        if r < 0.35:
            piece = rng.choice(WORDS)
        elif r < 0.50:
            piece = str(rng.randint(0, 10 ** rng.randint(1, 12)))
        elif r < 0.62:
            lo, hi = rng.choice(RANGES)
            piece = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6)))
        elif r < 0.72:
            piece = rng.choice(PUNCT)
        elif r < 0.80:
            piece = rng.choice(CONTRACTIONS)
        elif r < 0.85:
            piece = rng.choice(EMOJI)
        elif r < 0.87:
            piece = rng.choice(specials + [ADDED])
        else:
            piece = " " * rng.randint(2, 6) + rng.choice(["", "\n", "x"])  # runs, trailing spaces
        piece += rng.choice(SPACES) if rng.random() < 0.6 else ""
        out.append(piece)
        size += len(piece.encode("utf-8"))
    return "".join(out)


def every_code_point():
    """Each code point between letters, digits, an apostrophe, spaces and line breaks."""
    parts = []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        parts.append(f"x{c}y 1{c}1 '{c} {c}{c}\n{c}  \r{c}\n\t{c}a ")
    return "".join(parts)


def build(name, regex, specials, ignore_merges, bos, corpus_file, vocab_size, work, nfc=False):
    """A tokenizer built and trained by `tokenizers`; returns the path of its tokenizer.json."""
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)
    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([corpus_file], trainer)
    # ignore_merges through the file: the trainer rebuilds the model, so set it afterwards.
    spec = json.loads(tok.to_str())
    spec["model"]["ignore_merges"] = ignore_merges
    tok = Tokenizer.from_str(json.dumps(spec))
    if bos:
        bos_id = tok.token_to_id(bos)
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1",
                                          special_tokens=[(bos, bos_id)])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens([AddedToken(ADDED, special=False, normalized=True)])
    os.makedirs(os.path.join(work, name), exist_ok=True)
    path = os.path.join(work, name, "tokenizer.json")
    tok.save(path)
    saved = json.load(open(path, encoding="utf-8"))
    pre = saved["pre_tokenizer"]["pretokenizers"]
    assert saved["model"].get("ignore_merges", False) == ignore_merges, "ignore_merges not saved"
    assert pre[0]["type"] == "Split" and pre[0]["pattern"]["Regex"] == regex, pre
    assert pre[1]["type"] == "ByteLevel" and pre[1]["use_regex"] is False, pre
    return path


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(name, tokenizer_json, prefix, gtron, text, text_file, work):
    """One JSON-able result: gtron's ids against tokenizers' for text (prefix: the template's)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_json)
    hf_ids = tok.encode(text).ids
    with open(os.path.join(work, name + ".tokenizers.ids"), "w") as f:
        f.write(" ".join(map(str, hf_ids)) + "\n")
    ids_file = os.path.join(work, name + ".gtron.ids")
    r = subprocess.run([gtron, "tokenizer", "encode", "--tokenizer", tokenizer_json, "--text",
                        text_file, "--ids-out", ids_file], capture_output=True, text=True,
                       env=gtron_env(gtron))
    if r.returncode != 0:
        raise RuntimeError(f"gtron tokenizer encode exited {r.returncode}: {r.stderr.strip()}")
    with open(ids_file) as f:
        gt_ids = [int(t) for t in f.read().split()]
    diff = first_difference(hf_ids, gt_ids)
    res = {"tokenizer": name, "file": tokenizer_json, "bytes": len(text.encode("utf-8")),
           "tokens_tokenizers": len(hf_ids), "tokens_gtron": len(gt_ids),
           "identical": diff is None, "first_id": gt_ids[0] if gt_ids else None,
           # With a normalizer, decoding gives the normalized text back.
           "decode_roundtrip": tok.decode(gt_ids, skip_special_tokens=False) ==
           prefix + (tok.normalizer.normalize_str(text) if tok.normalizer else text)}
    if diff is not None:
        lo = max(0, diff - 3)
        res["first_difference"] = diff
        res["tokenizers_tokens"] = [tok.id_to_token(i) for i in hf_ids[lo:diff + 5]]
        res["gtron_tokens"] = [tok.id_to_token(i) for i in gt_ids[lo:diff + 5]]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gtron", default=".gpubin/gtron")
    ap.add_argument("--work", default="/tmp/compare_tokenizers_llama")
    ap.add_argument("--mb", type=float, default=1.5, help="MB of generated text to compare on")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--every-code-point", action="store_true")
    a = ap.parse_args()
    gtron = os.path.abspath(a.gtron)
    os.makedirs(a.work, exist_ok=True)
    corpus = generated_text(a.seed, 4 << 20, LLAMA_SPECIALS + QWEN_SPECIALS)
    corpus_file = os.path.join(a.work, "corpus.txt")
    with open(corpus_file, "w", encoding="utf-8", newline="") as f:
        f.write(corpus)
    text = generated_text(a.seed + 1, int(a.mb * 1e6), LLAMA_SPECIALS + QWEN_SPECIALS)
    if a.every_code_point:
        text += every_code_point()
    text_file = os.path.join(a.work, "text.txt")
    with open(text_file, "w", encoding="utf-8", newline="") as f:
        f.write(text)

    jobs = [  # (name, make the tokenizer.json, what its template puts before the text)
        ("llama3", lambda: build("llama3", LLAMA3, LLAMA_SPECIALS, True, LLAMA_SPECIALS[0],
                                 corpus_file, a.vocab_size, a.work), LLAMA_SPECIALS[0]),
        ("qwen2", lambda: build("qwen2", QWEN2, QWEN_SPECIALS, False, None, corpus_file,
                                a.vocab_size, a.work, nfc=True), ""),
        ("gtron_llama3", lambda: gtron_trained(gtron, corpus_file, a.vocab_size, a.work), ""),
    ]
    ok = True
    for name, make, prefix in jobs:
        try:
            res = compare(name, make(), prefix, gtron, text, text_file, a.work)
        except Exception as e:  # noqa: BLE001 -- report it, go on with the next tokenizer
            res = {"tokenizer": name, "error": f"{type(e).__name__}: {e}"}
        ok = ok and res.get("identical", False) and res.get("decode_roundtrip", False)
        print(json.dumps(res, ensure_ascii=False), flush=True)
    sys.exit(0 if ok else 1)


def gtron_trained(gtron, corpus_file, vocab_size, work):
    """gtron trains with --pattern llama3 (the written file is what `tokenizers` then loads)."""
    path = os.path.join(work, "gtron_llama3", "tokenizer.json")
    specials = sum((["--special", s] for s in LLAMA_SPECIALS), [])
    subprocess.run([gtron, "tokenizer", "train", "--text", corpus_file, "--vocab-size",
                    str(vocab_size), "--pattern", "llama3", "--out", path] + specials,
                   check=True, capture_output=True, env=gtron_env(gtron))
    return path


if __name__ == "__main__":
    main()
