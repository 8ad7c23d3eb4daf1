#!/usr/bin/env python3
"""gtron <-> Hugging Face transformers for the llama family, through the real file formats.

Needs torch, transformers and safetensors (the GPU machine has them; everything runs on the CPU
in fp32) and a gtron binary:

  python3 scripts/check_hf_llama.py --gtron .gpubin/gtron [--work DIR] [--tolerance 1e-5]

Members (tiny, V = 100 so gtron pads the vocabulary to 128):
  llama3_tied   LlamaForCausalLM, 2 key/value heads of 4 (GQA), llama3 RoPE scaling, tied head
  llama_mqa     LlamaForCausalLM, 1 key/value head (MQA), no scaling, untied head
  qwen3         Qwen3ForCausalLM, q/k norms, head_dim 16 (not C / NH = 12), untied head
  qwen2_bias    Qwen2ForCausalLM, q/k/v biases, tied head
Each member both ways:
  gtron -> transformers: a gtron model of the member's shape trained 20 steps on the CPU (MTP
    depth 2, whose tensors go to mtp.safetensors), `gtron export --hf`, loaded with
    AutoModelForCausalLM.from_pretrained; its logits against `gtron logits` of the checkpoint.
  transformers -> gtron: the member built by transformers with random weights (every parameter
    perturbed, so norms and biases are off their init), saved by save_pretrained three ways: fp32
    in one file; bf16 in shards of about 40 kB (model.safetensors.index.json); and fp32 again.
    `gtron import --hf` each and compare `gtron logits` with the transformers model's own (for
    the bf16 save: the model with its weights rounded to bf16, run in fp32).
The measure is max |gtron - transformers| / max |transformers| over every logit of 3 sequences.
Prints one JSON object; exits 1 when any case exceeds the tolerance.
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_hf import (compare, gtron_logits, hf_logits, run_gtron,  # noqa: E402
                      train_and_export)

V, TMAX, C, L, NH, F = 100, 32, 48, 2, 4, 80

MEMBERS = {
    "llama3_tied": {"cls": "LlamaForCausalLM", "n_kv_head": 2, "tied": True,
                    "rope_theta": 10000.0,
                    "llama3": {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 16}},
    "llama_mqa": {"cls": "LlamaForCausalLM", "n_kv_head": 1, "tied": False,
                  "rope_theta": 500000.0},
    "qwen3": {"cls": "Qwen3ForCausalLM", "n_kv_head": 2, "tied": False, "head_dim": 16,
              "qk_norm": True, "rope_theta": 1000000.0},
    "qwen2_bias": {"cls": "Qwen2ForCausalLM", "n_kv_head": 2, "tied": True, "qkv_bias": True,
                   "rope_theta": 1000000.0},
}


def gtron_model_keys(m):
    keys = {"arch": "llama", "vocab_size": V, "context_length": TMAX, "n_layer": L, "n_head": NH,
            "n_embd": C, "intermediate_size": F, "n_kv_head": m["n_kv_head"],
            "tied_embeddings": m["tied"], "rope_theta": m["rope_theta"],
            "qk_norm": m.get("qk_norm", False), "qkv_bias": m.get("qkv_bias", False)}
    if "head_dim" in m:
        keys["head_dim"] = m["head_dim"]
    if "llama3" in m:
        keys["rope_scaling"] = {"type": "llama3", **m["llama3"]}
    return keys


def hf_config(m):
    cls = getattr(transformers, m["cls"].replace("ForCausalLM", "Config"))
    rope = {"rope_type": "default", "rope_theta": m["rope_theta"]}
    if "llama3" in m:
        rope = {"rope_type": "llama3", "rope_theta": m["rope_theta"], **m["llama3"]}
    kw = dict(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L,
              num_attention_heads=NH, num_key_value_heads=m["n_kv_head"],
              head_dim=m.get("head_dim", C // NH), max_position_embeddings=64,
              rms_norm_eps=1e-5, tie_word_embeddings=m["tied"])
    if m["cls"] == "LlamaForCausalLM":
        kw["attention_bias"] = False
    try:
        config = cls(**kw, rope_parameters=rope)  # transformers 5
        if getattr(config, "rope_parameters", None) is None:
            raise TypeError
    except TypeError:  # transformers 4: rope_theta and rope_scaling
        theta = rope.pop("rope_theta")
        config = cls(**kw, rope_theta=theta,
                     rope_scaling=None if rope["rope_type"] == "default" else rope)
    config._attn_implementation = "eager"
    return config


def gtron_to_hf(binary, work, tokens, name, m, tolerance):
    tag = f"g2h_{name}"
    checkpoint, hf_dir = train_and_export(binary, work, tag, gtron_model_keys(m), 2, V, TMAX)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    theirs = hf_logits(model, tokens)
    ours = gtron_logits(binary, checkpoint, tokens, os.path.join(work, tag + "_logits.st"))
    return compare("gtron -> transformers", ours, theirs, tolerance, member=name,
                   hf_class=type(model).__name__,
                   mtp_file=os.path.exists(os.path.join(hf_dir, "mtp.safetensors")))


def hf_to_gtron(binary, work, tokens, name, m, tolerance):
    torch.manual_seed(0)
    cls = getattr(transformers, m["cls"])
    model = cls(hf_config(m)).float()
    with torch.no_grad():  # off the init: norms away from 1, nonzero biases
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.eval()
    cases = []
    for how in ("fp32", "bf16_sharded"):
        tag = f"h2g_{name}_{how}"
        hf_dir = os.path.join(work, tag + "_hf")
        if how == "fp32":
            model.save_pretrained(hf_dir, safe_serialization=True)
            ref = model
        else:
            low = cls(hf_config(m)).float()
            low.load_state_dict(model.state_dict())
            low.to(torch.bfloat16).save_pretrained(hf_dir, safe_serialization=True,
                                                   max_shard_size="40KB")
            # The reference: the weights rounded to bf16 in an fp32 model (not the bf16 model cast
            # back, whose RoPE frequency buffer would be rounded too).
            ref = cls(hf_config(m)).float()
            ref.load_state_dict({k: v.to(torch.bfloat16).float()
                                 for k, v in model.state_dict().items()})
            ref.eval()
        files = sorted(os.listdir(hf_dir))
        with open(os.path.join(hf_dir, "config.json")) as f:
            saved = json.load(f)
        checkpoint = os.path.join(work, tag + "_ckpt")
        run_gtron(binary, "import", "--hf", hf_dir, "--out", checkpoint)
        theirs = hf_logits(ref, tokens)
        ours = gtron_logits(binary, checkpoint, tokens, os.path.join(work, tag + "_logits.st"))
        cases.append(compare("transformers -> gtron", ours, theirs, tolerance, member=name,
                             save=how,
                             shards=sum(f.endswith(".safetensors") for f in files),
                             rope_keys=[k for k in ("rope_theta", "rope_scaling",
                                                    "rope_parameters") if k in saved]))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gtron", required=True, help="path of the gtron binary")
    ap.add_argument("--work", default="", help="working directory (default: a fresh temp dir)")
    ap.add_argument("--tolerance", type=float, default=1e-5, help="max relative difference")
    ap.add_argument("--members", default=",".join(MEMBERS), help="comma-separated subset")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="check_hf_llama_")
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(4)
    torch.backends.cuda.matmul.allow_tf32 = False
    tokens = np.random.default_rng(0).integers(0, V, size=(3, TMAX)).tolist()
    cases = []
    for name in args.members.split(","):
        if name not in MEMBERS:
            ap.error(f"--members: unknown member {name!r}; known: {', '.join(MEMBERS)}")
        cases.append(gtron_to_hf(args.gtron, work, tokens, name, MEMBERS[name], args.tolerance))
        cases += hf_to_gtron(args.gtron, work, tokens, name, MEMBERS[name], args.tolerance)
    ok = all(c["ok"] for c in cases)
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "tolerance": args.tolerance, "cases": cases, "ok": ok}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
