#!/usr/bin/env python3
"""Generation speed of the llama family: `gtron sample` against transformers' generate() on the
same model, in one process tree (GPU machine; torch and transformers are there).

  python3 scripts/bench_generate_llama.py --gtron .gpubin/gtron [--work DIR] [--batches 1 16]
      [--dtypes f32 bf16] [--prompt 128] [--tokens 256] [--repeats 3]

The model: transformers builds a Llama-3.2-1B-shaped LlamaForCausalLM (by default: 16 layers,
hidden 2048, 32 heads over 8 key/value heads of 64, intermediate 8192, vocabulary 128256, tied
head, llama3 RoPE scaling, max_position_embeddings 8192) with random weights (speed does not
depend on them) and saves it
with save_pretrained (fp32); `gtron import --hf` reads that directory. Both then decode greedily
the same random prompt (--prompt ids, repeated over the batch) for --tokens new tokens with no
end-of-text stop, at each batch size and dtype:
  gtron:        `gtron sample --warmup --temperature 0 --print-ids --device cuda --dtype D`
                (KV cache, a CUDA graph per decoding step), its stats line;
  transformers: generate(do_sample=False, use_cache=True) of the model cast to D, on the GPU,
                the median of --repeats runs after a warm-up (bench_hf_generate.timed_generate).
tokens_per_s counts the new tokens of every row over the whole generation, prefill included
(gtron's stats line does the same). --eager also times gtron with --no-graphs (impl
"gtron_eager"); a gtron run that fails or passes --gtron-timeout prints an "error" line.
--hf-attn picks transformers' attention (default: its SDPA, as `generate()` comes; on the H200
the bf16 batch-16 generate() with it did not finish in 200 s, twice, on 2026-12-04:
`sdpa-no-cudnn` and `eager` are the checks of whether cuDNN's attention plans were the cause).
--hf-timeout (300 s) bounds transformers' runs of one (dtype, batch): past it, its line carries
an "error" and the next case runs.

Prints JSON lines: one per run ({"impl", "batch", "dtype", "tokens", "tokens_per_s",
"prefill_ms", ...}), then one per (batch, dtype) with "gtron_over_transformers" and whether the
two produced the same tokens ("same_tokens": bf16 and batched GEMMs may part two close logits;
random weights make many near-ties, so this is reported, not required).
"""

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_hf_generate import timed_generate  # noqa: E402
from gtron_bin import gtron_env  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gtron", required=True, help="path of the gtron binary")
    p.add_argument("--work", default="", help="working directory (default: a fresh temp dir)")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--dtypes", nargs="+", choices=["f32", "bf16"], default=["f32", "bf16"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eager", action="store_true",
                   help="also time gtron with --no-graphs (every step eager), impl gtron_eager")
    p.add_argument("--hf-attn", choices=["sdpa", "sdpa-no-cudnn", "eager"], default="sdpa",
                   help="transformers' attention: its default SDPA; SDPA without the cuDNN "
                        "backend (flash, memory-efficient or math kernels only); or eager")
    p.add_argument("--hf-timeout", type=int, default=300,
                   help="seconds transformers' runs at one (dtype, batch) may take in all "
                        "(warm-up, repeats, the token check); past it the line says so and the "
                        "next case runs")
    p.add_argument("--gtron-timeout", type=float, default=240,
                   help="seconds a gtron sample may take before it counts as failed")
    return p.parse_args()


def build_model(a):
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    kw = dict(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
              num_hidden_layers=a.layers, num_attention_heads=a.heads,
              num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
              max_position_embeddings=a.context, rms_norm_eps=1e-5, tie_word_embeddings=True,
              attention_bias=False, mlp_bias=False)
    try:
        config = transformers.LlamaConfig(**kw, rope_parameters=rope)  # transformers 5
        if getattr(config, "rope_parameters", None) is None:
            raise TypeError
    except TypeError:  # transformers 4
        theta = rope.pop("rope_theta")
        config = transformers.LlamaConfig(**kw, rope_theta=theta, rope_scaling=rope)
    config._attn_implementation = "eager" if a.hf_attn == "eager" else "sdpa"
    torch.manual_seed(a.seed)
    with torch.device("cuda"):  # random init on the GPU: seconds, not minutes
        model = transformers.LlamaForCausalLM(config).float()
    return model.eval()


def sdpa_backends(a):
    """The SDPA backends transformers may use (--hf-attn sdpa-no-cudnn leaves cuDNN's out: it
    builds a plan per new key length, and a decode step has a new one each token)."""
    if a.hf_attn != "sdpa-no-cudnn":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])


def gtron_run(a, checkpoint, prompt, batch, dtype, flags=()):
    """(rows of new tokens, stats line), or (None, {"error": ...}) when gtron fails or times out."""
    cmd = [a.gtron, "sample", "--checkpoint", checkpoint, "--prompt-ids", ",".join(map(str, prompt)),
           "--tokens", str(a.tokens), "--temperature", "0", "--print-ids", "--device", "cuda",
           "--dtype", dtype, "--batch", str(batch), "--warmup", *flags]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=gtron_env(a.gtron),
                           timeout=a.gtron_timeout)
    except subprocess.TimeoutExpired:
        return None, {"error": f"timed out after {a.gtron_timeout} s"}
    if r.returncode != 0:
        return None, {"error": f"exit {r.returncode}: {r.stderr.strip()[-400:]}"}
    rows = [[int(t) for t in line.split(",")][len(prompt):]
            for line in r.stdout.strip().splitlines()]
    return rows, json.loads(r.stderr.strip().splitlines()[-1])


def hf_run(a, model, prompt, batch, dtype):
    ids = torch.tensor([prompt] * batch, dtype=torch.long, device="cuda")
    timed_generate(model, ids, a.tokens, "cuda")  # warm-up
    runs = [timed_generate(model, ids, a.tokens, "cuda") for _ in range(a.repeats)]
    seconds = statistics.median(r[0] for r in runs)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=a.tokens, min_new_tokens=a.tokens,
                             do_sample=False, pad_token_id=0, eos_token_id=None,
                             attention_mask=torch.ones_like(ids))
    rows = out[:, len(prompt):].tolist()
    return rows, {"tokens": batch * a.tokens, "seconds": round(seconds, 4),
                  "tokens_per_s": round(batch * a.tokens / seconds, 2),
                  "prefill_ms": round(1e3 * statistics.median(r[1] for r in runs), 3)}


class HfTimeout(Exception):
    pass


def hf_run_bounded(a, model, prompt, batch, dtype):
    """hf_run under a SIGALRM after --hf-timeout s: (None, {"error": ...}) when it fires (a
    generate() stuck in per-step attention plans must not take the whole command)."""
    def on_alarm(signum, frame):
        raise HfTimeout()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(a.hf_timeout)
    try:
        return hf_run(a, model, prompt, batch, dtype)
    except HfTimeout:
        torch.cuda.synchronize()
        return None, {"error": f"timed out after {a.hf_timeout} s"}
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def main():
    a = parse_args()
    work = a.work or tempfile.mkdtemp(prefix="bench_generate_llama_")
    os.makedirs(work, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build_model(a)
    hf_dir, checkpoint = os.path.join(work, "hf"), os.path.join(work, "ckpt")
    model.save_pretrained(hf_dir, safe_serialization=True)
    r = subprocess.run([a.gtron, "import", "--hf", hf_dir, "--out", checkpoint],
                       capture_output=True, text=True, env=gtron_env(a.gtron))
    if r.returncode != 0:
        sys.exit(f"gtron import failed ({r.returncode}): {r.stderr.strip()[-600:]}")
    gen = torch.Generator().manual_seed(a.seed + 1)
    prompt = torch.randint(0, a.vocab, (a.prompt,), generator=gen).tolist()
    for dtype in a.dtypes:
        model = model.to(torch.float32 if dtype == "f32" else torch.bfloat16)
        for batch in a.batches:
            ours, stats = gtron_run(a, checkpoint, prompt, batch, dtype)
            print(json.dumps({"impl": "gtron", "batch": batch, "dtype": dtype, **stats}),
                  flush=True)
            if a.eager:
                _, eager = gtron_run(a, checkpoint, prompt, batch, dtype, ["--no-graphs"])
                print(json.dumps({"impl": "gtron_eager", "batch": batch, "dtype": dtype,
                                  **eager}), flush=True)
            if ours is None:
                continue
            with torch.inference_mode(), sdpa_backends(a):
                theirs, hf = hf_run_bounded(a, model, prompt, batch, dtype)
            print(json.dumps({"impl": "transformers", "attn": a.hf_attn, "batch": batch,
                              "dtype": dtype, **hf}), flush=True)
            if theirs is None:
                continue
            print(json.dumps({"summary": True, "batch": batch, "dtype": dtype,
                              "gtron_over_transformers":
                                  round(stats["tokens_per_s"] / hf["tokens_per_s"], 3),
                              "same_tokens": ours == theirs}), flush=True)


if __name__ == "__main__":
    main()
