#!/usr/bin/env python3
"""A second Llama-family decoder, in numpy (float64), over a gtron checkpoint.

Usage: llama_reference.py CHECKPOINT_DIR LOGITS_FILE [--tolerance 1e-5]

Reads CHECKPOINT_DIR/trainer_state.json (the resolved config's "model" keys) and
CHECKPOINT_DIR/model.safetensors (gtron's names: docs/checkpoints-and-interop.md, "Parameter
names", llama family), runs the main model on the `tokens` tensor of LOGITS_FILE (written by
`gtron logits`) and compares with that file's `logits`: prints {"max_abs_diff", "relative",
"shape"} and exits 1 when max|diff| / max|reference| exceeds the tolerance.

Written from docs/models.md's description of the family (Hugging Face's LlamaForCausalLM,
Qwen3ForCausalLM and Qwen3MoeForCausalLM): RMSNorm, packed q|k|v rows, optional q/k RMSNorm per
head before RoPE, RoPE in the rotate-half convention (dimension i pairs with i + HS/2) with the
optional llama3 frequency rewrite, grouped-query causal attention, SwiGLU, final RMSNorm, head
(tied to the embedding unless untied). A block whose MLP is a mixture of experts (model.moe: a
router blocks.i.mlp.router.weight, experts blocks.i.mlp.experts.e.{gate_up,down}.weight) routes
each token on its own: softmax over the experts (or sigmoid, the choice made on sigmoid + the
router bias blocks.i.mlp.router.expert_bias), the top_k largest (ties to the lower index), gates
renormalized to sum 1 when norm_topk_prob (always for sigmoid), the gated sum of those experts'
SwiGLU outputs, plus the shared experts' SwiGLU (blocks.i.mlp.shared.*) when there are any. It
shares no code with gtron (only gpt2_reference.py's safetensors reader).
"""

import json
import math
import sys

import numpy as np

from gpt2_reference import read_safetensors  # the same file reader (this folder)


def rms_norm(x, weight, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


def inv_frequencies(hs, theta, scaling):
    inv = 1.0 / theta ** (np.arange(0, hs, 2, dtype=np.float64) / hs)
    if scaling.get("type", "none") != "llama3":
        return inv
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < original / high:  # high frequencies: kept
            out.append(f)
        elif wavelen > original / low:  # low frequencies: divided by the factor
            out.append(f / factor)
        else:  # between: interpolated
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def rope(x, inv):
    """x: [T, heads, HS]; positions 0..T-1; pairs (i, i + HS/2)."""
    t = x.shape[0]
    angles = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]  # [T, HS/2]
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)[:, None, :]
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def swiglu(g, gate_up, down):
    f = gate_up.shape[0] // 2
    gu = g @ gate_up.T
    gate, up = gu[..., :f], gu[..., f:]
    return (gate / (1.0 + np.exp(-gate)) * up) @ down.T


def mixture_of_experts(g, w, p, moe):
    """g: [T, C]; the routed experts of every token, one token at a time."""
    logits = g @ w[p + "router.weight"].T  # [T, E]
    sigmoid = moe.get("router", "softmax") == "sigmoid"
    if sigmoid:
        scores = 1.0 / (1.0 + np.exp(-logits))
        choice = scores + w.get(p + "router.expert_bias", np.zeros(logits.shape[1]))
    else:
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        scores = e / e.sum(axis=-1, keepdims=True)
        choice = scores
    out = np.zeros_like(g)
    for t in range(g.shape[0]):
        ids = sorted(range(logits.shape[1]), key=lambda i: (-choice[t, i], i))[:moe["top_k"]]
        gates = scores[t, ids]
        if sigmoid or moe.get("norm_topk_prob", False):
            gates = gates / gates.sum()
        for gate, i in zip(gates, ids):
            ex = p + "experts.%d." % i
            out[t] += gate * swiglu(g[t], w[ex + "gate_up.weight"], w[ex + "down.weight"])
    if p + "shared.gate_up.weight" in w:
        out += swiglu(g, w[p + "shared.gate_up.weight"], w[p + "shared.down.weight"])
    return out


def block(x, w, p, m, inv):
    nh, nkv, hs = m["n_head"], m["n_kv_head"], m["head_dim"]
    eps = m["rms_norm_eps"]
    t = x.shape[0]
    h = rms_norm(x, w[p + "attn_norm.weight"], eps)
    qkv = h @ w[p + "attn.qkv.weight"].T
    if p + "attn.qkv.bias" in w:
        qkv = qkv + w[p + "attn.qkv.bias"]
    q = qkv[:, :nh * hs].reshape(t, nh, hs)
    k = qkv[:, nh * hs:(nh + nkv) * hs].reshape(t, nkv, hs)
    v = qkv[:, (nh + nkv) * hs:].reshape(t, nkv, hs)
    if p + "attn.q_norm.weight" in w:
        q = rms_norm(q, w[p + "attn.q_norm.weight"], eps)
        k = rms_norm(k, w[p + "attn.k_norm.weight"], eps)
    q, k = rope(q, inv), rope(k, inv)
    group = nh // nkv
    out = np.zeros((t, nh, hs))
    mask = np.tril(np.ones((t, t), dtype=bool))
    for head in range(nh):
        kv = head // group
        scores = q[:, head, :] @ k[:, kv, :].T / math.sqrt(hs)
        scores = np.where(mask, scores, -np.inf)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        out[:, head, :] = probs @ v[:, kv, :]
    x = x + out.reshape(t, nh * hs) @ w[p + "attn.proj.weight"].T
    g = rms_norm(x, w[p + "mlp_norm.weight"], eps)
    if p + "mlp.router.weight" in w:
        return x + mixture_of_experts(g, w, p + "mlp.", m["moe"])
    return x + swiglu(g, w[p + "mlp.gate_up.weight"], w[p + "mlp.down.weight"])


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    ckpt, logits_file = argv[1], argv[2]
    tol = float(argv[argv.index("--tolerance") + 1]) if "--tolerance" in argv else 1e-5
    with open(ckpt + "/trainer_state.json") as f:
        m = dict(json.load(f)["config"]["model"])
    if m.get("arch") != "llama":
        print("llama_reference: not a llama-family checkpoint", file=sys.stderr)
        return 2
    if m["n_kv_head"] == 0:
        m["n_kv_head"] = m["n_head"]
    if m["head_dim"] == 0:
        m["head_dim"] = m["n_embd"] // m["n_head"]
    w = {k: v.astype(np.float64) for k, v in read_safetensors(ckpt + "/model.safetensors").items()}
    ref_file = read_safetensors(logits_file)
    tokens, got = ref_file["tokens"], ref_file["logits"].astype(np.float64)
    inv = inv_frequencies(m["head_dim"], m["rope_theta"], m.get("rope_scaling", {}))
    head = w.get("lm_head.weight", w["wte.weight"])
    want = []
    for row in tokens:
        x = w["wte.weight"][row]
        for i in range(m["n_layer"]):
            x = block(x, w, "blocks.%d." % i, m, inv)
        want.append(rms_norm(x, w["norm_f.weight"], m["rms_norm_eps"]) @ head.T)
    want = np.stack(want)[..., :m["vocab_size"]]  # gtron logits writes the real vocabulary
    diff = float(np.abs(want - got).max())
    rel = diff / float(np.abs(want).max())
    print(json.dumps({"max_abs_diff": diff, "relative": rel, "shape": list(got.shape)}))
    return 0 if rel <= tol else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
