#!/usr/bin/env python3
"""gtron <-> Hugging Face transformers for Qwen3-MoE (Qwen3MoeForCausalLM), through the real files.

Needs torch, transformers, safetensors and numpy (the GPU machine has them; everything runs on
the CPU in fp32, with no network) and a gtron binary:

  python3 scripts/check_hf_moe.py --gtron .gpubin/gtron [--work DIR] [--tolerance 1e-5]
                                  [--tokens 20] [--members all_sparse,dense_first,sparse_step2]

Members (tiny: V = 100, C = 48, 4 query heads, 2 key/value heads, 8 experts of width 32, top 2):
  all_sparse    every layer a mixture of experts, norm_topk_prob true, head_dim 16 (not C / NH),
                untied head
  dense_first   3 layers, mlp_only_layers [0] (a dense first layer), norm_topk_prob false, tied
  sparse_step2  2 layers, decoder_sparse_step 2 (layer 1 sparse), norm_topk_prob true, untied
Each member, transformers -> gtron -> transformers:
  import    transformers builds the member with random weights (every parameter perturbed, so
            norms are off their init), save_pretrained writes it twice (one file; shards of about
            100 kB), `gtron import --hf` reads each, and `gtron logits` of the import is compared
            with the transformers model's logits on 3 sequences;
  export    `gtron export --hf` of the import, loaded back with from_pretrained: its state dict
            must equal the original model's bit for bit, and its logits the original's;
  generate  transformers' greedy generate() (no end-of-text stop) against `gtron sample
            --temperature 0 --device cpu` of the import, with the KV cache and with --recompute,
            token for token, from 2 prompts.
And gtron -> transformers: a Qwen3-MoE-shaped model (softmax router, dense first layer, MTP depth
1) that gtron trains for --steps steps, exported and loaded by from_pretrained: logits and greedy
tokens against gtron's.

The logit measure is max |gtron - transformers| / max |transformers| ("relative", must be <=
--tolerance) with max_abs_diff beside it. Prints one JSON object per line: one per case, then a
summary line {"summary": ...}; exits 1 when any case fails (a case that raises is a failure with
its error, and the other cases still run). The saved form of the experts is reported
("per_expert", or "fused": transformers 5's gate_up_proj / down_proj), gtron reads both.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gtron_bin import gtron_env  # noqa: E402

V, C, NH, NKV, F, E, FE, TOPK, TMAX = 100, 48, 4, 2, 80, 8, 32, 2, 64
PROMPTS = [[3, 14, 15, 92, 65, 35, 89, 79], [7, 1, 8]]

MEMBERS = {
    "all_sparse": {"layers": 2, "mlp_only_layers": [], "step": 1, "norm_topk_prob": True,
                   "tied": False, "head_dim": 16},
    "dense_first": {"layers": 3, "mlp_only_layers": [0], "step": 1, "norm_topk_prob": False,
                    "tied": True},
    "sparse_step2": {"layers": 2, "mlp_only_layers": [], "step": 2, "norm_topk_prob": True,
                     "tied": False},
}


def run_gtron(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True, env=gtron_env(binary))
    if r.returncode != 0:
        raise RuntimeError(f"gtron {' '.join(args)} exited {r.returncode}: "
                           f"{(r.stdout + r.stderr).strip()[-800:]}")
    return r.stdout


def emit(record):
    print(json.dumps(record), flush=True)
    return record


def rope_theta_is(config, theta):
    """True when the config holds RoPE theta `theta` in every form it has (a transformers 4 config
    keeps an unknown rope_parameters argument as a plain attribute beside its own rope_theta)."""
    rt = getattr(config, "rope_theta", None)
    rp = getattr(config, "rope_parameters", None)
    if rt is not None and rt != theta:
        return False
    if isinstance(rp, dict) and rp.get("rope_theta", theta) != theta:
        return False
    return rt is not None or isinstance(rp, dict)


def hf_config(m):
    hs = m.get("head_dim", C // NH)
    kw = dict(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=m["layers"],
              num_attention_heads=NH, num_key_value_heads=NKV, max_position_embeddings=TMAX,
              rms_norm_eps=1e-6, tie_word_embeddings=m["tied"], num_experts=E,
              num_experts_per_tok=TOPK, moe_intermediate_size=FE,
              norm_topk_prob=m["norm_topk_prob"], decoder_sparse_step=m["step"],
              mlp_only_layers=list(m["mlp_only_layers"]), initializer_range=0.1,
              attention_bias=False, use_sliding_window=False)
    cls = transformers.Qwen3MoeConfig
    theta = 1000000.0
    # transformers 5 takes rope_parameters, 4 takes rope_theta; head_dim may or may not be an
    # argument of the class (it is read with getattr either way): try each form in turn.
    attempts = [dict(head_dim=hs, rope_parameters={"rope_type": "default", "rope_theta": theta}),
                dict(rope_parameters={"rope_type": "default", "rope_theta": theta}),
                dict(head_dim=hs, rope_theta=theta),
                dict(rope_theta=theta)]
    config, errors = None, []
    for extra in attempts:
        try:
            config = cls(**kw, **extra)
        except (TypeError, ValueError) as e:
            errors.append(f"{sorted(extra)}: {e}")
            continue
        if rope_theta_is(config, theta):
            break
        errors.append(f"{sorted(extra)}: RoPE theta not taken")
        config = None
    if config is None:
        raise RuntimeError("Qwen3MoeConfig refused every form: " + " | ".join(errors))
    config.head_dim = hs
    config._attn_implementation = "eager"
    return config


def load_hf(directory):
    kw = dict(attn_implementation="eager")
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                                  **kw)
    except TypeError:  # transformers 4 names it torch_dtype
        model = transformers.AutoModelForCausalLM.from_pretrained(
            directory, torch_dtype=torch.float32, **kw)
    return no_stop(model.float().eval())


def no_stop(model):
    """Greedy generate() makes exactly the tokens asked for."""
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).logits.float().numpy()


def gtron_logits(binary, checkpoint, tokens, out):
    rows = []
    for row in tokens:
        rows += ["--tokens", ",".join(str(int(t)) for t in row)]
    run_gtron(binary, "logits", "--checkpoint", checkpoint, *rows, "--out", out)
    return load_file(out)["logits"]


def logit_case(case, member, ours, theirs, tolerance, **extra):
    rec = {"case": case, "member": member, **extra}
    if ours.shape != theirs.shape:
        return {**rec, "ok": False,
                "error": f"shapes differ: gtron {list(ours.shape)}, transformers "
                         f"{list(theirs.shape)}"}
    diff = float(np.max(np.abs(ours.astype(np.float64) - theirs.astype(np.float64))))
    scale = float(np.max(np.abs(theirs)))
    rel = diff / scale
    return {**rec, "shape": list(ours.shape), "max_abs_diff": diff, "max_abs_logit": scale,
            "relative": rel, "ok": bool(rel <= tolerance)}


def expert_form(directory):
    names = []
    for f in os.listdir(directory):
        if f.endswith(".safetensors"):
            names += list(load_file(os.path.join(directory, f)).keys())
    if any(n.endswith("mlp.experts.gate_up_proj") for n in names):
        return "fused"
    return "per_expert" if any(".mlp.experts.0." in n for n in names) else "none"


def hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=n, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
    gaps = []
    for s in out.scores:  # the logits of each step: how far the argmax is from a tie
        top = torch.topk(s[0].float(), 2).values
        gaps.append(float(top[0] - top[1]))
    return out.sequences[0, len(prompt):].tolist(), min(gaps)


def gtron_greedy(binary, checkpoint, prompt, n, flags):
    out = run_gtron(binary, "sample", "--checkpoint", checkpoint, "--prompt-ids",
                    ",".join(map(str, prompt)), "--tokens", str(n), "--temperature", "0",
                    "--print-ids", "--device", "cpu", *flags)
    ids = [int(t) for t in out.strip().splitlines()[0].split(",")]
    return ids[len(prompt):]


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def generate_cases(binary, member, model, checkpoint, n, direction):
    cases = []
    for p, prompt in enumerate(PROMPTS):
        want, gap = hf_greedy(model, prompt, n)
        runs = {}
        for run, flags in (("cache", []), ("recompute", ["--recompute"])):
            runs[run] = first_difference(gtron_greedy(binary, checkpoint, prompt, n, flags), want)
        cases.append(emit({"case": "generate", "direction": direction, "member": member,
                           "prompt": p, "tokens": len(want), "min_top2_gap": gap,
                           "first_difference": runs,
                           "ok": len(want) == n and all(d is None for d in runs.values())}))
    return cases


def state_dict_difference(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    if sorted(sa) != sorted(sb):
        return {"error": f"state dict names differ: {sorted(set(sa) ^ set(sb))[:6]}"}
    worst = max(float((sa[k].float() - sb[k].float()).abs().max()) for k in sa)
    return {"tensors": len(sa), "max_abs_diff": worst}


def hf_to_gtron(binary, work, tokens, name, m, a):
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(hf_config(m)).float()
    with torch.no_grad():  # off the init: norms away from 1
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model = no_stop(model.eval())
    theirs = hf_logits(model, tokens)
    cases, imported = [], None
    for how in ("one_file", "sharded"):
        tag = f"h2g_{name}_{how}"
        hf_dir = os.path.join(work, tag + "_hf")
        if how == "one_file":
            model.save_pretrained(hf_dir, safe_serialization=True)
        else:
            model.save_pretrained(hf_dir, safe_serialization=True, max_shard_size="100KB")
        checkpoint = os.path.join(work, tag + "_ckpt")
        run_gtron(binary, "import", "--hf", hf_dir, "--out", checkpoint)
        ours = gtron_logits(binary, checkpoint, tokens, os.path.join(work, tag + "_logits.st"))
        shards = sum(f.endswith(".safetensors") for f in os.listdir(hf_dir))
        cases.append(emit(logit_case("import", name, ours, theirs, a.tolerance, save=how,
                                     shards=shards, experts=expert_form(hf_dir))))
        imported = imported or checkpoint
    # Back out: gtron's export must give transformers the same model, bit for bit.
    out_dir = os.path.join(work, f"h2g_{name}_export")
    run_gtron(binary, "export", "--checkpoint", imported, "--hf", out_dir)
    back = load_hf(out_dir)
    same = state_dict_difference(model, back)
    rec = logit_case("export", name, hf_logits(back, tokens), theirs, a.tolerance,
                     hf_class=type(back).__name__, state_dict=same)
    rec["ok"] = rec["ok"] and same.get("max_abs_diff") == 0.0
    cases.append(emit(rec))
    cases += generate_cases(binary, name, model, imported, a.tokens, "transformers -> gtron")
    return cases


def gtron_to_hf(binary, work, tokens, a):
    """A gtron-trained Qwen3-MoE shape, exported: transformers' logits and tokens against gtron's."""
    model = {"arch": "llama", "vocab_size": V, "context_length": TMAX, "n_layer": 2, "n_head": NH,
             "n_kv_head": NKV, "n_embd": C, "intermediate_size": F, "qk_norm": True,
             "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tied_embeddings": False,
             "moe": {"num_experts": E, "top_k": TOPK, "expert_intermediate_size": FE,
                     "first_dense_layers": 1, "router": "softmax", "norm_topk_prob": False}}
    config = {"model": model, "mtp": {"depth": 1},
              "data": {"synthetic": {"vocab": V, "tokens": 100000, "val_tokens": 5000}},
              "optimizer": {"lr": 3e-3}, "schedule": {"warmup_steps": 5},
              "train": {"steps": a.steps, "global_batch": 8, "micro_batch": 8, "seq_len": TMAX,
                        "device": "cpu", "eval_batches": 1},
              "log": {"every": a.steps}}
    path = os.path.join(work, "g2h.json")
    with open(path, "w") as f:
        json.dump(config, f)
    run_dir = os.path.join(work, "g2h")
    run_gtron(binary, "train", "--config", path, "--out", run_dir)
    checkpoint = os.path.join(run_dir, "checkpoints", f"step_{a.steps:08d}")
    hf_dir = os.path.join(work, "g2h_hf")
    run_gtron(binary, "export", "--checkpoint", checkpoint, "--hf", hf_dir)
    hf = load_hf(hf_dir)
    ours = gtron_logits(binary, checkpoint, tokens, os.path.join(work, "g2h_logits.st"))
    cases = [emit(logit_case("export", "gtron_trained", ours, hf_logits(hf, tokens), a.tolerance,
                             direction="gtron -> transformers", hf_class=type(hf).__name__,
                             mtp_file=os.path.exists(os.path.join(hf_dir, "mtp.safetensors"))))]
    cases += generate_cases(binary, "gtron_trained", hf, checkpoint, a.tokens,
                            "gtron -> transformers")
    return cases


def guarded(fn, case, member):
    try:
        return fn()
    except Exception as e:  # one broken case must not hide the others
        return [emit({"case": case, "member": member, "ok": False,
                      "error": f"{type(e).__name__}: {e}",
                      "where": traceback.format_exc().strip().splitlines()[-3:]})]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gtron", required=True, help="path of the gtron binary")
    ap.add_argument("--work", default="", help="working directory (default: a fresh temp dir)")
    ap.add_argument("--tolerance", type=float, default=1e-5, help="max relative logit difference")
    ap.add_argument("--tokens", type=int, default=20, help="new tokens per greedy generation")
    ap.add_argument("--steps", type=int, default=60, help="gtron training steps (gtron -> hf)")
    ap.add_argument("--members", default=",".join(MEMBERS), help="comma-separated subset")
    a = ap.parse_args()
    if not os.access(a.gtron, os.X_OK):
        ap.error(f"--gtron {a.gtron!r} is not an executable file")
    names = [n for n in a.members.split(",") if n]
    for n in names:
        if n not in MEMBERS:
            ap.error(f"--members: unknown member {n!r}; known: {', '.join(MEMBERS)}")
    work = a.work or tempfile.mkdtemp(prefix="check_hf_moe_")
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(4)
    torch.backends.cuda.matmul.allow_tf32 = False
    tokens = np.random.default_rng(0).integers(0, V, size=(3, 24)).tolist()
    cases = []
    for n in names:
        cases += guarded(lambda: hf_to_gtron(a.gtron, work, tokens, n, MEMBERS[n], a),
                         "transformers -> gtron", n)
    cases += guarded(lambda: gtron_to_hf(a.gtron, work, tokens, a), "gtron -> transformers",
                     "gtron_trained")
    logit = [c for c in cases if "relative" in c]
    ok = all(c["ok"] for c in cases)
    emit({"summary": {"torch": torch.__version__, "transformers": transformers.__version__,
                      "tolerance": a.tolerance, "cases": len(cases),
                      "failed": sum(not c["ok"] for c in cases),
                      "max_relative": max((c["relative"] for c in logit), default=None),
                      "max_abs_diff": max((c["max_abs_diff"] for c in logit), default=None),
                      "work": work}, "ok": ok})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
