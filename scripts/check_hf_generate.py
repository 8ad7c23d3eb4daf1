#!/usr/bin/env python3
"""Greedy `gtron sample` against transformers' greedy generate(), token for token (GPU machine).

Needs torch and transformers (the GPU machine has them) and a gtron binary:

  python3 scripts/check_hf_generate.py --gtron .gpubin/gtron [--tokens 100] [--work DIR]

For each member (the tiny llama-family shapes of check_hf_llama.py; default: Llama-3 style with
GQA and llama3 RoPE scaling, tied; Llama with MQA, untied; Qwen3 with q/k norms and head_dim 16)
gtron trains a model with MTP depth 2 on the synthetic source (--steps on --device, context 128,
so every position the check generates at was trained and the logits are peaked), exports it
(`gtron export --hf`), and transformers loads it (fp32, eager attention, TF32 off). Then, for two
prompts, transformers' generate(do_sample=False, no end-of-text stop) and `gtron sample
--temperature 0 --print-ids` each produce --tokens new tokens, gtron four ways: with the KV cache
(CUDA graphs per decoding step), --speculative, --no-graphs, and --speculative --no-graphs, all
in fp32. Every one must equal transformers' tokens exactly. A bf16 run (--dtype bf16) is also made
and reported (how many leading tokens agree), not required to agree: bf16 rounding may part two
close logits.

Prints one JSON object (per member and prompt: the first differing position of each run, or
null); exits 1 when any fp32 run differs from transformers.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_hf import train_and_export  # noqa: E402
from check_hf_llama import MEMBERS, gtron_model_keys  # noqa: E402
from gtron_bin import gtron_env  # noqa: E402

V, TMAX = 100, 128
PROMPTS = [[3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26], [7, 1, 8, 2, 8]]
RUNS = {  # name -> extra `gtron sample` flags
    "cache": [],
    "speculative": ["--speculative"],
    "no_graphs": ["--no-graphs"],
    "speculative_no_graphs": ["--speculative", "--no-graphs"],
    "bf16": ["--dtype", "bf16"],
}


def gtron_tokens(binary, checkpoint, prompt, n, device, flags):
    cmd = [binary, "sample", "--checkpoint", checkpoint, "--prompt-ids",
           ",".join(map(str, prompt)), "--tokens", str(n), "--temperature", "0", "--print-ids",
           "--device", device, *flags]
    r = subprocess.run(cmd, capture_output=True, text=True, env=gtron_env(binary))
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-400:]}")
    ids = [int(t) for t in r.stdout.strip().splitlines()[0].split(",")]
    return ids[len(prompt):], json.loads(r.stderr.strip().splitlines()[-1])


def hf_tokens(model, prompt, n, device):
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_member(binary, work, name, m, a):
    keys = gtron_model_keys(m)
    keys["context_length"] = TMAX
    checkpoint, hf_dir = train_and_export(binary, work, name, keys, 2, V, TMAX, steps=a.steps,
                                          device=a.device, global_batch=16, micro_batch=16,
                                          tokens=200000, warmup=20)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, torch_dtype=torch.float32, attn_implementation="eager").to(a.device).eval()
    # No end-of-text stop: every run makes exactly --tokens tokens.
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    results = []
    for p, prompt in enumerate(PROMPTS):
        want = hf_tokens(model, prompt, a.tokens, a.device)
        res = {"member": name, "hf_class": type(model).__name__, "prompt": p,
               "tokens": len(want), "runs": {}}
        for run, flags in RUNS.items():
            got, stats = gtron_tokens(binary, checkpoint, prompt, a.tokens, a.device, flags)
            entry = {"first_difference": first_difference(got, want)}
            if "acceptance" in stats and stats["acceptance"] is not None:
                entry["acceptance"] = round(stats["acceptance"], 3)
            res["runs"][run] = entry
        res["ok"] = len(want) == a.tokens and all(
            res["runs"][r]["first_difference"] is None for r in RUNS if r != "bf16")
        results.append(res)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gtron", required=True, help="path of the gtron binary")
    ap.add_argument("--work", default="", help="working directory (default: a fresh temp dir)")
    ap.add_argument("--tokens", type=int, default=100, help="new tokens per prompt")
    ap.add_argument("--steps", type=int, default=300, help="training steps per member")
    ap.add_argument("--device", default="cuda", help="where both sides run (cuda or cpu)")
    ap.add_argument("--members", default="llama3_tied,llama_mqa,qwen3",
                    help=f"comma-separated subset of {','.join(MEMBERS)}")
    a = ap.parse_args()
    if a.device == "cpu":
        del RUNS["bf16"]
    work = a.work or tempfile.mkdtemp(prefix="check_hf_generate_")
    os.makedirs(work, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results = []
    for name in a.members.split(","):
        if name not in MEMBERS:
            ap.error(f"--members: unknown member {name!r}; known: {', '.join(MEMBERS)}")
        results += check_member(a.gtron, work, name, MEMBERS[name], a)
    ok = all(r["ok"] for r in results)
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "tokens": a.tokens, "results": results, "ok": ok}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
