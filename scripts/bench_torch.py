#!/usr/bin/env python3
"""The PyTorch reference for scripts/bench_gpu.sh: the same model and step in PyTorch.

GPT-2 (learned positions, pre-LayerNorm, GELU-tanh MLP, tied embedding/head, vocab padded to a
multiple of 64) with D MTP depths as gtron builds them (depth k: h' = Block_k(W_k ·
concat(RMSNorm(h), RMSNorm(Emb(tokens shifted by k)))), predicting k+1 ahead through the shared
final norm and head; loss = CE_main + (λ/D)·Σ CE_k, unreachable targets ignored). One training
step: bf16 autocast forward, backward, gradient-norm clip at 1.0, fused AdamW, on random tokens.
Attention is F.scaled_dot_product_attention (flash on the H200). `--mode eager` or `compile`
(torch.compile of the model's forward + loss). Prints one JSON line like bench_gpu:
{tokens_per_s, ms_per_step, peak_mem_gib, system, mode, D, ...}.

Runs on the GPU machine (PyTorch is there; gtron itself never needs Python):
  python3 scripts/bench_torch.py --mode compile --D 1
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        heads = lambda t: t.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class MTPDepth(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.hnorm = nn.RMSNorm(C)
        self.enorm = nn.RMSNorm(C)
        self.proj = nn.Linear(2 * C, C, bias=False)
        self.block = Block(C, NH)

    def forward(self, h, emb):
        return self.block(self.proj(torch.cat([self.hnorm(h), self.enorm(emb)], dim=-1)))


class GPT(nn.Module):
    def __init__(self, V, T, L, C, NH, D, mtp_weight):
        super().__init__()
        self.Vp = (V + 63) // 64 * 64
        self.D, self.mtp_weight = D, mtp_weight
        self.wte = nn.Embedding(self.Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.mtp = nn.ModuleList(MTPDepth(C, NH) for _ in range(D))
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def head_loss(self, h, targets):
        logits = F.linear(self.ln_f(h), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1)

    def forward(self, tokens, targets):
        B, T = tokens.shape
        pos = torch.arange(T, device=tokens.device)
        h = self.wte(tokens) + self.wpe(pos)
        for blk in self.blocks:
            h = blk(h)
        loss = self.head_loss(h, targets)
        ignore = torch.full((B, 1), -1, dtype=targets.dtype, device=targets.device)
        shifted_tokens, shifted_targets = tokens, targets
        for k, depth in enumerate(self.mtp, start=1):
            # Depth k embeds the token k ahead and predicts the one k + 1 ahead.
            shifted_tokens = torch.cat([shifted_tokens[:, 1:], tokens[:, :1] * 0], dim=1)
            shifted_targets = torch.cat([shifted_targets[:, 1:], ignore], dim=1)
            h = depth(h, self.wte(shifted_tokens))
            loss = loss + self.mtp_weight / self.D * self.head_loss(h, shifted_targets)
        return loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["eager", "compile"], default="compile")
    ap.add_argument("--L", type=int, default=12)
    ap.add_argument("--C", type=int, default=768)
    ap.add_argument("--NH", type=int, default=12)
    ap.add_argument("--V", type=int, default=50257)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--D", type=int, default=0)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the timed steps, N more steps under torch.profiler (CUDA "
                         "activity); prints the 40 costliest kernels in ms per step to stderr")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda")
    model = GPT(a.V, a.T, a.L, a.C, a.NH, a.D, a.mtp_weight).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith("w")]
    no_decay = [p for n, p in model.named_parameters() if p.dim() != 2 or n.startswith("w")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_fn = torch.compile(model) if a.mode == "compile" else model
    gen = torch.Generator(device=dev).manual_seed(a.seed)

    def batch():
        x = torch.randint(0, a.V, (a.B, a.T + 1), device=dev, generator=gen)
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()

    def step():
        tokens, targets = batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(a.steps):
        loss = step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / a.steps
    print(json.dumps({
        "tokens_per_s": round(a.B * a.T / (ms / 1e3), 1),
        "ms_per_step": round(ms, 3),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        "system": "torch", "mode": a.mode, "torch": torch.__version__,
        "L": a.L, "C": a.C, "NH": a.NH, "T": a.T, "B": a.B, "V": a.V, "D": a.D,
        "steps": a.steps, "warmup": a.warmup, "loss": round(loss.item(), 4), "params": n_params,
    }), flush=True)
    if a.profile > 0:
        profile_kernels(step, a.profile)


def profile_kernels(step, n):
    """Per-kernel GPU time of n steps (CUPTI through torch.profiler), ms per step, to stderr."""
    import sys
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = e.cuda_time_total
        if t > 0:
            rows.append((t / 1e3 / n, e.count / n, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"torch kernels: {total:.3f} ms per step in {sum(r[1] for r in rows):.0f} launches",
          file=sys.stderr)
    for ms, count, name in rows[:40]:
        print(f"{ms:8.3f} ms {100 * ms / total:5.1f}% {count:6.1f}x  {name[:110]}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
