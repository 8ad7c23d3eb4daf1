#!/usr/bin/env python3
"""gtron's llama-family logits against Hugging Face transformers' (GPU machine; not run in CI).

Usage: check_llama_hf.py CHECKPOINT_DIR LOGITS_FILE [--tolerance 1e-5] [--device cuda]

Builds transformers' LlamaForCausalLM (or Qwen3ForCausalLM when the checkpoint's model has
qk_norm) from the checkpoint's resolved config (trainer_state.json), loads gtron's fp32 tensors
into it (the packed attn.qkv rows split into q_proj, k_proj, v_proj; mlp.gate_up into gate_proj
and up_proj; docs/checkpoints-and-interop.md, "Parameter names"), runs it in fp32 with eager
attention on the `tokens` of LOGITS_FILE (written by `gtron logits`) and compares with that file's
`logits`. Prints one JSON line {"family", "hf_class", "rope", "relative", "max_abs_diff",
"shape"} and exits 1 when max|diff| / max|hf| exceeds the tolerance. Needs torch and transformers.
"""

import argparse
import inspect
import json
import os
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "trainer"))
from gpt2_reference import read_safetensors  # noqa: E402  (the tests' numpy reader)


def hf_config(m, vp, qwen3):
    nh = m["n_head"]
    nkv = m["n_kv_head"] or nh
    hs = m["head_dim"] or m["n_embd"] // nh
    f = m["intermediate_size"] or (8 * m["n_embd"] // 3 + 63) // 64 * 64
    rope = {"rope_type": "default", "rope_theta": m["rope_theta"]}
    scaling = m.get("rope_scaling") or {}
    if scaling.get("type") == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": m["rope_theta"], "factor": scaling["factor"],
                "low_freq_factor": scaling["low_freq_factor"],
                "high_freq_factor": scaling["high_freq_factor"],
                "original_max_position_embeddings": scaling["original_max_position_embeddings"]}
    cls = transformers.Qwen3Config if qwen3 else transformers.LlamaConfig
    kw = dict(vocab_size=vp, hidden_size=m["n_embd"], intermediate_size=f,
              num_hidden_layers=m["n_layer"], num_attention_heads=nh, num_key_value_heads=nkv,
              head_dim=hs, max_position_embeddings=max(m["context_length"], 64),
              rms_norm_eps=m["rms_norm_eps"], tie_word_embeddings=m["tied_embeddings"],
              attention_bias=False)
    if "rope_parameters" in inspect.signature(cls.__init__).parameters:
        kw["rope_parameters"] = rope
    else:  # transformers 4: rope_theta and rope_scaling
        kw["rope_theta"] = rope.pop("rope_theta")
        if rope["rope_type"] != "default":
            kw["rope_scaling"] = rope
    config = cls(**kw)
    config._attn_implementation = "eager"
    return config, nh, nkv, hs, f, rope


def hf_state(w, m, nh, nkv, hs, f):
    s = {"model.embed_tokens.weight": w["wte.weight"], "model.norm.weight": w["norm_f.weight"]}
    s["lm_head.weight"] = w.get("lm_head.weight", w["wte.weight"])
    for i in range(m["n_layer"]):
        g, h = "blocks.%d." % i, "model.layers.%d." % i
        qkv = w[g + "attn.qkv.weight"]
        s[h + "self_attn.q_proj.weight"] = qkv[:nh * hs]
        s[h + "self_attn.k_proj.weight"] = qkv[nh * hs:(nh + nkv) * hs]
        s[h + "self_attn.v_proj.weight"] = qkv[(nh + nkv) * hs:]
        s[h + "self_attn.o_proj.weight"] = w[g + "attn.proj.weight"]
        if g + "attn.q_norm.weight" in w:
            s[h + "self_attn.q_norm.weight"] = w[g + "attn.q_norm.weight"]
            s[h + "self_attn.k_norm.weight"] = w[g + "attn.k_norm.weight"]
        s[h + "input_layernorm.weight"] = w[g + "attn_norm.weight"]
        s[h + "post_attention_layernorm.weight"] = w[g + "mlp_norm.weight"]
        gate_up = w[g + "mlp.gate_up.weight"]
        s[h + "mlp.gate_proj.weight"] = gate_up[:f]
        s[h + "mlp.up_proj.weight"] = gate_up[f:]
        s[h + "mlp.down_proj.weight"] = w[g + "mlp.down.weight"]
    return {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in s.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("logits")
    ap.add_argument("--tolerance", type=float, default=1e-5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    with open(a.checkpoint + "/trainer_state.json") as fh:
        m = json.load(fh)["config"]["model"]
    if m.get("arch") != "llama":
        print("check_llama_hf: not a llama-family checkpoint", file=sys.stderr)
        return 2
    if m.get("qkv_bias"):
        print("check_llama_hf: qkv_bias (Qwen2) is not mapped by this script", file=sys.stderr)
        return 2
    w = read_safetensors(a.checkpoint + "/model.safetensors")
    vp = w["wte.weight"].shape[0]
    qwen3 = bool(m.get("qk_norm"))
    config, nh, nkv, hs, f, rope = hf_config(m, vp, qwen3)
    cls = transformers.Qwen3ForCausalLM if qwen3 else transformers.LlamaForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False  # true fp32 GEMMs, as gtron's
    torch.manual_seed(0)
    model = cls(config).to(torch.float32)
    state = hf_state(w, m, nh, nkv, hs, f)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        print("check_llama_hf: missing %s, unexpected %s" % (missing, unexpected), file=sys.stderr)
        return 1
    model = model.to(a.device).eval()
    ref = read_safetensors(a.logits)
    tokens = torch.from_numpy(ref["tokens"].astype(np.int64)).to(a.device)
    got = ref["logits"].astype(np.float64)
    with torch.no_grad():
        want = model(input_ids=tokens).logits.double().cpu().numpy()[..., :got.shape[-1]]
    diff = float(np.abs(want - got).max())
    rel = diff / float(np.abs(want).max())
    print(json.dumps({"family": "qwen3" if qwen3 else "llama", "hf_class": cls.__name__,
                      "rope": rope, "tied": m["tied_embeddings"], "n_kv_head": nkv,
                      "head_dim": hs, "relative": rel, "max_abs_diff": diff,
                      "shape": list(got.shape), "transformers": transformers.__version__}))
    return 0 if rel <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
