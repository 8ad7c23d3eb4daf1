#!/usr/bin/env python3
"""The PyTorch reference for scripts/bench_generate.sh (issue 14): Hugging Face transformers'
generate() on the same shape (GPT-2 124M by default), greedy, use_cache=True, a 128-token prompt
and 256 new tokens, at batch 1 and 16. Runs on the GPU machine (torch + transformers are there).

Prints one JSON line per batch size: {"impl": "transformers", "batch", "dtype", "tokens",
"tokens_per_s", "prefill_ms", "seconds"}; tokens counts the new tokens of every row, as gtron's
stats line does. Weights are random (speed does not depend on them); generation is forced to the
full length (no end-of-text stop). prefill_ms is the time of a separate generate() of one new
token (the prompt pass plus one token). Each measurement is the median of --repeats timed runs
after one warm-up run. Example: python3 scripts/bench_hf_generate.py --batches 1 16
"""
import argparse
import json
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_generate(model, ids, new_tokens, device):
    """Seconds of one greedy generate() of new_tokens tokens, and of its prefill alone."""
    kwargs = dict(do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None,
                  attention_mask=torch.ones_like(ids))
    sync(device)
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kwargs)
    sync(device)
    t1 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
    sync(device)
    t2 = time.perf_counter()
    assert out.shape[1] == ids.shape[1] + new_tokens, out.shape
    return t2 - t1, t1 - t0


def main():
    a = parse_args()
    torch.manual_seed(a.seed)
    cfg = GPT2Config(n_layer=a.layers, n_embd=a.embd, n_head=a.heads, vocab_size=a.vocab,
                     n_positions=a.context)
    dtype = getattr(torch, a.dtype)
    model = GPT2LMHeadModel(cfg).to(device=a.device, dtype=dtype).eval()
    with torch.inference_mode():
        for b in a.batches:
            ids = torch.randint(0, a.vocab, (b, a.prompt), device=a.device)
            timed_generate(model, ids, a.tokens, a.device)  # warm-up
            runs = [timed_generate(model, ids, a.tokens, a.device) for _ in range(a.repeats)]
            seconds = statistics.median(r[0] for r in runs)
            prefill = statistics.median(r[1] for r in runs)
            print(json.dumps({"impl": "transformers", "batch": b, "dtype": a.dtype,
                              "tokens": b * a.tokens,
                              "tokens_per_s": round(b * a.tokens / seconds, 2),
                              "prefill_ms": round(1e3 * prefill, 3),
                              "seconds": round(seconds, 4)}), flush=True)


if __name__ == "__main__":
    main()
