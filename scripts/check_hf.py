#!/usr/bin/env python3
"""gtron <-> Hugging Face transformers: the same GPT-2 gives the same logits on both sides.

Needs torch, transformers and safetensors (the GPU machine has them; everything runs on the CPU
in fp32) and a gtron binary:

  python3 scripts/check_hf.py --gtron bazel-bin/trainer/gtron [--work DIR] [--tolerance 1e-4]

Two directions, each tied and untied:
  gtron -> transformers: a small model trained by gtron for a few steps (with MTP depths, which
    go to mtp.safetensors), `gtron export`ed, loaded by GPT2LMHeadModel.from_pretrained; its logits
    are compared with `gtron logits` of the checkpoint.
  transformers -> gtron: a GPT2LMHeadModel created by transformers with random weights (every
    parameter perturbed, so biases and norms are not at their init), saved with
    save_pretrained(safe_serialization=True), `gtron import`ed; `gtron logits` of the imported
    checkpoint are compared with the transformers model's.
The measure is max |gtron - transformers| / max |transformers| over every logit of 3 sequences.
Prints one JSON object; exits 1 when any case exceeds the tolerance.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file
from transformers import GPT2Config, GPT2LMHeadModel

from gtron_bin import gtron_env

V, TMAX, C, L, NH = 100, 32, 64, 2, 4  # V = 100 pads to 128 inside gtron


def run_gtron(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True, env=gtron_env(binary))
    if r.returncode != 0:
        sys.exit(f"check_hf: gtron {' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


def gtron_logits(binary, checkpoint, tokens, out):
    rows = []
    for row in tokens:
        rows += ["--tokens", ",".join(str(int(t)) for t in row)]
    run_gtron(binary, "logits", "--checkpoint", checkpoint, *rows, "--out", out)
    return load_file(out)["logits"]


def load_hf(directory):
    try:
        model = GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager")
    except (TypeError, ValueError):  # a transformers without the eager/sdpa choice
        model = GPT2LMHeadModel.from_pretrained(directory)
    return model.float().eval()


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).logits.float().numpy()


def compare(name, ours, theirs, tolerance, **extra):
    if ours.shape != theirs.shape:
        return {"case": name, **extra, "ok": False,
                "error": f"shapes differ: gtron {ours.shape}, transformers {theirs.shape}"}
    diff = float(np.max(np.abs(ours.astype(np.float64) - theirs.astype(np.float64))))
    scale = float(np.max(np.abs(theirs)))
    rel = diff / scale
    return {"case": name, **extra, "shape": list(ours.shape), "max_abs_diff": diff,
            "max_abs_logit": scale, "relative": rel, "ok": bool(rel <= tolerance)}


def train_and_export(binary, work, tag, model, depth, vocab, seq_len, steps=20, device="cpu",
                     global_batch=8, micro_batch=4, tokens=50000, warmup=2):
    """gtron trains `model` (the config's model keys) with MTP `depth` on the synthetic source for
    `steps` steps and exports the last checkpoint to Hugging Face's format: (checkpoint, hf_dir)."""
    config = {
        "model": model,
        "mtp": {"depth": depth},
        "data": {"synthetic": {"vocab": vocab, "tokens": tokens, "val_tokens": 5000}},
        "optimizer": {"lr": 3e-3},
        "schedule": {"warmup_steps": warmup},
        "train": {"steps": steps, "global_batch": global_batch, "micro_batch": micro_batch,
                  "seq_len": seq_len, "device": device, "eval_batches": 1},
        "log": {"every": min(10, steps)},
    }
    path = os.path.join(work, tag + ".json")
    with open(path, "w") as f:
        json.dump(config, f)
    run_dir = os.path.join(work, tag)
    run_gtron(binary, "train", "--config", path, "--out", run_dir)
    checkpoint = os.path.join(run_dir, "checkpoints", f"step_{steps:08d}")
    hf_dir = os.path.join(work, tag + "_hf")
    run_gtron(binary, "export", "--checkpoint", checkpoint, "--hf", hf_dir)
    return checkpoint, hf_dir


def gtron_to_hf(binary, work, tokens, tied, depth, tolerance):
    tag = f"g2h_{'tied' if tied else 'untied'}_d{depth}"
    model = {"vocab_size": V, "context_length": TMAX, "n_layer": L, "n_head": NH, "n_embd": C,
             "tied_embeddings": tied}
    checkpoint, hf_dir = train_and_export(binary, work, tag, model, depth, V, TMAX)
    theirs = hf_logits(load_hf(hf_dir), tokens)
    ours = gtron_logits(binary, checkpoint, tokens, os.path.join(work, tag + "_logits.st"))
    return compare("gtron -> transformers", ours, theirs, tolerance, tied=tied, mtp_depth=depth,
                   mtp_file=os.path.exists(os.path.join(hf_dir, "mtp.safetensors")))


def hf_to_gtron(binary, work, tokens, tied, tolerance):
    tag = f"h2g_{'tied' if tied else 'untied'}"
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=V, n_positions=TMAX, n_embd=C, n_layer=L, n_head=NH,
                        tie_word_embeddings=tied)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():  # off the init: nonzero biases, norms away from 1
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    hf_dir = os.path.join(work, tag + "_hf")
    model.save_pretrained(hf_dir, safe_serialization=True)
    names = sorted(load_file(os.path.join(hf_dir, "model.safetensors")).keys())
    checkpoint = os.path.join(work, tag + "_ckpt")
    run_gtron(binary, "import", "--hf", hf_dir, "--out", checkpoint)
    theirs = hf_logits(model, tokens)
    reloaded = hf_logits(load_hf(hf_dir), tokens)
    ours = gtron_logits(binary, checkpoint, tokens, os.path.join(work, tag + "_logits.st"))
    return compare("transformers -> gtron", ours, theirs, tolerance, tied=tied,
                   saved_tensors=len(names), has_lm_head="lm_head.weight" in names,
                   reload_equal=bool(np.array_equal(theirs, reloaded)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gtron", required=True, help="path of the gtron binary")
    ap.add_argument("--work", default="", help="working directory (default: a fresh temp dir)")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="max relative difference")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="check_hf_")
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(4)
    tokens = np.random.default_rng(0).integers(0, V, size=(3, TMAX)).tolist()
    cases = [gtron_to_hf(args.gtron, work, tokens, tied, depth, args.tolerance)
             for tied, depth in ((True, 0), (False, 2))]
    cases += [hf_to_gtron(args.gtron, work, tokens, tied, args.tolerance) for tied in (True, False)]
    ok = all(c["ok"] for c in cases)
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "tolerance": args.tolerance, "cases": cases, "ok": ok}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
