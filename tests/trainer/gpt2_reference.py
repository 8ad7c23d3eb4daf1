#!/usr/bin/env python3
"""A second GPT-2, in numpy (float64), over a transformers GPT-2 directory.

Usage: gpt2_reference.py HF_DIR LOGITS_FILE [--tolerance 1e-5]

Reads HF_DIR/config.json and HF_DIR/model.safetensors the way transformers' GPT2LMHeadModel reads
them (Conv1D weights [in, out], c_attn = [q | k | v], heads in column blocks, GELU-tanh, pre-LN,
lm_head tied to wte unless tie_word_embeddings is false), runs it on the `tokens` tensor of
LOGITS_FILE (written by `gtron logits`) and compares with that file's `logits`: prints
{"max_abs_diff", "relative"} and exits 1 when max|diff| / max|reference| exceeds the tolerance.
CI has numpy but no torch: this stands in for transformers (scripts/check_hf.py runs the real one).
It shares no code with gtron.
"""

import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
    return out


def layer_norm(x, weight, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def attention(x, w, prefix, n_head):
    B, T, C = x.shape
    hs = C // n_head
    qkv = x @ w[prefix + "attn.c_attn.weight"] + w[prefix + "attn.c_attn.bias"]
    # [B, T, 3C] -> three [B, NH, T, HS]
    q, k, v = (part.reshape(B, T, n_head, hs).transpose(0, 2, 1, 3)
               for part in np.split(qkv, 3, axis=-1))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    y = (p @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    return y @ w[prefix + "attn.c_proj.weight"] + w[prefix + "attn.c_proj.bias"]


def gpt2_logits(cfg, w, tokens):
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    T = tokens.shape[1]
    x = w["wte.weight"][tokens] + w["wpe.weight"][:T]
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        x = x + attention(layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps), w, p,
                          cfg["n_head"])
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = gelu_tanh(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], eps)
    head = w["wte.weight"] if cfg.get("tie_word_embeddings", True) else w["lm_head.weight"]
    return x @ head.T


def main(argv):
    if len(argv) not in (3, 5) or (len(argv) == 5 and argv[3] != "--tolerance"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    tolerance = float(argv[4]) if len(argv) == 5 else 1e-5
    with open(argv[1] + "/config.json") as f:
        cfg = json.load(f)
    weights = {}
    for name, t in read_safetensors(argv[1] + "/model.safetensors").items():
        weights[name[len("transformer."):] if name.startswith("transformer.") else name] = \
            t.astype(np.float64)
    got = read_safetensors(argv[2])
    ref = gpt2_logits(cfg, weights, got["tokens"].astype(np.int64))
    diff = float(np.abs(got["logits"].astype(np.float64) - ref).max())
    rel = diff / float(np.abs(ref).max())
    print(json.dumps({"max_abs_diff": diff, "relative": rel, "shape": list(ref.shape)}))
    return 0 if rel <= tolerance else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
