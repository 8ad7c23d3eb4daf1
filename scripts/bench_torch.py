#!/usr/bin/env python3
"""The PyTorch reference for scripts/bench_gpu.sh: the same model and step in PyTorch.

GPT-2 (learned positions, pre-LayerNorm, GELU-tanh MLP, tied embedding/head, vocab padded to a
multiple of 64) with D MTP depths as gtron builds them (depth k: h' = Block_k(W_k ·
concat(RMSNorm(h), RMSNorm(Emb(tokens shifted by k)))), predicting k+1 ahead through the shared
final norm and head; loss = CE_main + (λ/D)·Σ CE_k, unreachable targets ignored). One training
step: bf16 autocast forward, backward, gradient-norm clip at 1.0, fused AdamW, on random tokens.
Attention is F.scaled_dot_product_attention (flash on the H200). `--mode eager` or `compile`
(torch.compile of the model's forward + loss). Prints one JSON line like bench_gpu:
{tokens_per_s, ms_per_step, peak_mem_gib, system, mode, D, arch, ...}.

`--arch llama`: the Llama-3 / Qwen3 family as Hugging Face's LlamaForCausalLM and
Qwen3ForCausalLM compute it, in plain PyTorch: RMSNorm with fp32 statistics (eps 1e-5, gtron's
default), q/k/v projections without bias, optional per-head q/k RMSNorm (`--qk-norm 1`), RoPE in
the rotate-half convention with base `--rope-theta` (no position table), SDPA with
enable_gqa=True on the un-repeated `--NKV` key/value heads of head size `--HS`, o_proj, residual,
RMSNorm, SwiGLU down(silu(gate(x)) * up(x)) of width `--F`, residual; final RMSNorm; the head
tied to the embedding or not (`--tied 0|1`). Its MTP depths are gtron's for the family
(model/layers.h MTPModule): RMSNorm of h and of the shifted tokens' embedding, the [C, 2C]
projection without bias, one llama block. The flags and their defaults are bench_gpu's (NKV: NH,
HS: C / NH, F: 8C/3 rounded up to a multiple of 64). The GPT-2 model (`--arch gpt2`, the
default) is tied and takes none of these flags.

`--moe-experts E` (llama): gtron's mixture of experts in blocks l >= `--moe-first-dense` (the MTP
depths stay dense, as mtp.moe = false), with bench_gpu's flags and model.moe's defaults:
`--moe-top-k` (2), `--moe-width` (F), `--moe-shared` (0), `--moe-router softmax|sigmoid`,
`--moe-norm-topk 0|1` (1). The layer is scripts/bench_torch_moe.py: experts through
torch._grouped_mm over the rows sorted by expert, compiled with the model (`--moe-align A` pads
each expert's rows to a multiple of A, `--moe-compile-experts 0` keeps the experts out of the
compiled graph; the JSON line's "moe_impl" says which). A MoE model is built on the GPU (its
billions of parameters would take a minute to initialize on the host). `--check` runs
bench_torch_moe.check() instead of a benchmark (its own small shape with `--moe-router` and
`--moe-norm-topk`; the GPU when there is one, else the CPU) and exits 1 if a case fails.

Runs on the GPU machine (PyTorch is there; gtron itself never needs Python):
  python3 scripts/bench_torch.py --mode compile --D 1
  python3 scripts/bench_torch.py --arch llama --L 16 --C 2048 --NH 32 --NKV 8 --HS 64 --F 8192 --B 8
  python3 scripts/bench_torch.py --check [--moe-router sigmoid]   (scripts/bench_moe.sh runs it)
"""
import argparse
import contextlib
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_torch_moe import MoE, check as moe_check, moe_std


def _rowwise_fp8(t):
    """t [R, K] in e4m3 with one fp32 scale per row (amax / 448): codes and the [R, 1] scales."""
    amax = t.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / 448.0
    return (t.float() / scale).to(torch.float8_e4m3fn), scale


class _RowwiseFp8Matmul(torch.autograd.Function):
    """y = x·wᵀ with the three products in FP8 through torch._scaled_mm, row-wise scales (the
    recipe torchao calls rowwise): x by token, w by output row (forward) or by input column
    (input gradient), dy by token (input gradient) or by output feature (weight gradient)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        xq, xs = _rowwise_fp8(x)
        wq, ws = _rowwise_fp8(w)
        return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dyq, dys = _rowwise_fp8(dy)
        wtq, wts = _rowwise_fp8(w.t().contiguous())  # [K, N]: scales per input column
        dx = torch._scaled_mm(dyq, wtq.t(), scale_a=dys, scale_b=wts.t(),
                              out_dtype=torch.bfloat16)
        dytq, dyts = _rowwise_fp8(dy.t().contiguous())  # [N, M]: per output feature
        xtq, xts = _rowwise_fp8(x.t().contiguous())  # [K, M]: per input feature
        dw = torch._scaled_mm(dytq, xtq.t(), scale_a=dyts, scale_b=xts.t(),
                              out_dtype=torch.float32)
        return dx, dw.to(w.dtype)


class Fp8Linear(nn.Linear):
    """nn.Linear whose products run in row-wise FP8 (`--fp8 rowwise`); bf16 autocast outside."""

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(torch.bfloat16)
        with torch.autocast("cuda", enabled=False):
            y = _RowwiseFp8Matmul.apply(x2, self.weight.to(torch.bfloat16))
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.view(*shape[:-1], y.shape[-1])


def use_fp8_linears(model):
    """Every block and MTP nn.Linear becomes an Fp8Linear (the head and embedding stay)."""
    for module in model.modules():
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and name != "lm_head":
                child.__class__ = Fp8Linear


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
        T = tokens.shape[1]
        pos = torch.arange(T, device=tokens.device)
        h = self.wte(tokens) + self.wpe(pos)
        for blk in self.blocks:
            h = blk(h)
        return with_mtp_losses(self, h, tokens, targets)


def with_mtp_losses(model, h, tokens, targets, *rope):
    """The main head's loss on h plus the D depths' (weighted λ/D): depth k embeds the token k
    ahead and predicts the one k + 1 ahead; `rope` goes to each depth (the llama family's)."""
    loss = model.head_loss(h, targets)
    ignore = torch.full((tokens.shape[0], 1), -1, dtype=targets.dtype, device=targets.device)
    shifted_tokens, shifted_targets = tokens, targets
    for k, depth in enumerate(model.mtp, start=1):
        shifted_tokens = torch.cat([shifted_tokens[:, 1:], tokens[:, :1] * 0], dim=1)
        shifted_targets = torch.cat([shifted_targets[:, 1:], ignore], dim=1)
        h = depth(h, model.wte(shifted_tokens), *rope)
        loss = loss + model.mtp_weight / model.D * model.head_loss(h, shifted_targets)
    return loss


class RMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm: statistics in fp32, the result cast back, then the weight."""

    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class LlamaBlock(nn.Module):
    """Hugging Face's LlamaDecoderLayer (Qwen3DecoderLayer with qk_norm)."""

    def __init__(self, C, NH, NKV, HS, F_, qk_norm, eps, moe=None):
        super().__init__()
        self.NH, self.NKV, self.HS = NH, NKV, HS
        self.attn_norm = RMSNorm(C, eps)
        self.q_proj = nn.Linear(C, NH * HS, bias=False)
        self.k_proj = nn.Linear(C, NKV * HS, bias=False)
        self.v_proj = nn.Linear(C, NKV * HS, bias=False)
        self.q_norm = RMSNorm(HS, eps) if qk_norm else None
        self.k_norm = RMSNorm(HS, eps) if qk_norm else None
        self.o_proj = nn.Linear(NH * HS, C, bias=False)
        self.mlp_norm = RMSNorm(C, eps)
        self.moe = moe  # bench_torch_moe.MoE in place of the SwiGLU, or None
        if moe is None:
            self.gate_proj = nn.Linear(C, F_, bias=False)
            self.up_proj = nn.Linear(C, F_, bias=False)
            self.down_proj = nn.Linear(F_, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        a = self.attn_norm(x)
        q = self.q_proj(a).view(B, T, self.NH, self.HS)
        k = self.k_proj(a).view(B, T, self.NKV, self.HS)
        v = self.v_proj(a).view(B, T, self.NKV, self.HS).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, heads, T, HS]
        q = q * cos + rotate_half(q) * sin  # cos, sin: [T, HS], fp32 as Hugging Face's
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, self.NH * self.HS))
        g = self.mlp_norm(x)
        if self.moe is not None:
            return x + self.moe(g)
        return x + self.down_proj(F.silu(self.gate_proj(g)) * self.up_proj(g))


class LlamaMTPDepth(nn.Module):
    """gtron's MTP depth of the llama family: the norms with the family's eps, the projection,
    one llama block at positions 0 .. T-1."""

    def __init__(self, C, NH, NKV, HS, F_, qk_norm, eps):
        super().__init__()
        self.hnorm = RMSNorm(C, eps)
        self.enorm = RMSNorm(C, eps)
        self.proj = nn.Linear(2 * C, C, bias=False)
        self.block = LlamaBlock(C, NH, NKV, HS, F_, qk_norm, eps)

    def forward(self, h, emb, cos, sin):
        return self.block(self.proj(torch.cat([self.hnorm(h), self.enorm(emb)], dim=-1)), cos, sin)


class Llama(nn.Module):
    def __init__(self, V, T, L, C, NH, NKV, HS, F_, qk_norm, tied, rope_theta, D, mtp_weight,
                 eps=1e-5, moe=None):
        super().__init__()
        self.Vp = (V + 63) // 64 * 64
        self.D, self.mtp_weight = D, mtp_weight
        self.wte = nn.Embedding(self.Vp, C)
        dims = (C, NH, NKV, HS, F_, qk_norm, eps)
        # moe: MoE's keyword arguments and "first_dense" (blocks before it keep the SwiGLU).
        moe = dict(moe or {})
        first_dense = moe.pop("first_dense", L)
        std, resid_std = moe_std(L)
        self.blocks = nn.ModuleList(
            LlamaBlock(*dims, moe=MoE(C, std=std, resid_std=resid_std, **moe)
                       if moe and l >= first_dense else None) for l in range(L))
        self.norm_f = RMSNorm(C, eps)
        self.lm_head = None if tied else nn.Linear(C, self.Vp, bias=False)
        self.mtp = nn.ModuleList(LlamaMTPDepth(*dims) for _ in range(D))
        # Hugging Face's rotary table: inv_freq in fp32, angles = position * inv_freq, both halves.
        inv_freq = 1.0 / rope_theta ** (torch.arange(0, HS, 2, dtype=torch.int64).float() / HS)
        angles = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
        emb = torch.cat([angles, angles], dim=-1)  # [T, HS]
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                resid = name.endswith(("o_proj.weight", "down_proj.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if resid else 0.02)

    def head_loss(self, h, targets):
        head = self.wte.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(self.norm_f(h), head)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        h = self.wte(tokens)
        for blk in self.blocks:
            h = blk(h, cos, sin)
        return with_mtp_losses(self, h, tokens, targets, cos, sin)


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
    ap.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    # The llama family's shape (bench_gpu's flags); None: not given (the family's default).
    ap.add_argument("--NKV", type=int, default=None, help="key/value heads (llama; default NH)")
    ap.add_argument("--HS", type=int, default=None, help="head size (llama; default C / NH)")
    ap.add_argument("--F", type=int, default=None,
                    help="SwiGLU width (llama; default 8C/3 rounded up to a multiple of 64)")
    ap.add_argument("--qk-norm", type=int, choices=[0, 1], default=None,
                    help="per-head q/k RMSNorm (llama, Qwen3)")
    ap.add_argument("--rope-theta", type=float, default=None, help="RoPE base (llama; 500000)")
    ap.add_argument("--tied", type=int, choices=[0, 1], default=1,
                    help="head tied to the embedding (0: llama only)")
    ap.add_argument("--transient-grads", choices=["0", "1", "auto"], default="auto",
                    help="bench_gpu's flag, accepted so --compare can pass it to both; PyTorch's "
                         "gradients come into being in the backward anyway (set_to_none)")
    ap.add_argument("--packed-masters", choices=["0", "1"], default="0",
                    help="bench_gpu's flag, accepted so --compare can pass it to both; PyTorch "
                         "keeps no bf16 copy of its fp32 weights (autocast casts them per use)")
    ap.add_argument("--fp8", choices=["none", "rowwise"], default="none",
                    help="rowwise: the block and MTP linears' products in FP8 e4m3 through "
                         "torch._scaled_mm with row-wise scales (the PyTorch FP8 reference)")
    # The mixture of experts (llama; bench_gpu's flags = model.moe's keys); None: not given.
    ap.add_argument("--moe-experts", type=int, default=0, help="routed experts E (0: dense)")
    ap.add_argument("--moe-top-k", type=int, default=None, help="experts per token (2)")
    ap.add_argument("--moe-width", type=int, default=None, help="each expert's width (F's)")
    ap.add_argument("--moe-shared", type=int, default=None, help="shared experts (0)")
    ap.add_argument("--moe-first-dense", type=int, default=None, help="dense blocks first (0)")
    ap.add_argument("--moe-router", choices=["softmax", "sigmoid"], default=None)
    ap.add_argument("--moe-norm-topk", type=int, choices=[0, 1], default=None,
                    help="softmax: renormalize the top-k gates (1)")
    ap.add_argument("--moe-align", type=int, default=1,
                    help="pad each expert's rows to a multiple of this (1: no padding)")
    ap.add_argument("--moe-compile-experts", type=int, choices=[0, 1], default=1,
                    help="0: the experts outside the compiled graph (torch.compiler.disable)")
    ap.add_argument("--check", action="store_true",
                    help="check the grouped_mm MoE against a per-expert loop, then exit")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the timed steps, N more steps under torch.profiler (CUDA "
                         "activity); prints the 40 costliest kernels in ms per step to stderr")
    ap.add_argument("--profile-trace", default="", metavar="FILE",
                    help="with --profile: also write the profiled steps as a Chrome trace "
                         "(every kernel with its start, duration and grid) to FILE")
    a = ap.parse_args()
    if a.check:  # its own small shape; only the router's kind comes from the flags
        raise SystemExit(0 if moe_check(router=a.moe_router or "softmax",
                                        norm_topk=a.moe_norm_topk != 0) else 1)
    family = resolve_family(ap, a)
    moe_fields = resolve_moe(ap, a, family)

    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda")
    # A MoE model is built on the GPU (billions of parameters); the dense ones as before.
    with torch.device(dev) if moe_fields else contextlib.nullcontext():
        if a.arch == "llama":
            model = Llama(a.V, a.T, a.L, a.C, a.NH, family["NKV"], family["HS"], family["F"],
                          family["qk_norm"] == 1, family["tied"] == 1, family["rope_theta"], a.D,
                          a.mtp_weight, moe=moe_kwargs(a, moe_fields)).to(dev)
        else:
            model = GPT(a.V, a.T, a.L, a.C, a.NH, a.D, a.mtp_weight).to(dev)
    if moe_fields:
        moe_fields["moe_impl"] = next(m for m in model.modules() if isinstance(m, MoE)).impl()
    if a.fp8 == "rowwise":
        use_fp8_linears(model)
    n_params = sum(p.numel() for p in model.parameters())
    # Matrices decay (the experts' [E, out, in] stacks too), the embedding does not.
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.startswith("w")]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or n.startswith("w")]
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
        "system": "torch", "mode": a.mode, "fp8": a.fp8, "torch": torch.__version__,
        "L": a.L, "C": a.C, "NH": a.NH, "T": a.T, "B": a.B, "V": a.V, "D": a.D,
        "steps": a.steps, "warmup": a.warmup, "loss": round(loss.item(), 4), "params": n_params,
        **family, **moe_fields,
    }), flush=True)
    if a.profile > 0:
        profile_kernels(step, a.profile, a.profile_trace)


def resolve_family(ap, a):
    """The family's JSON fields (bench_gpu's keys), defaults resolved; a usage error (exit 2) for
    a llama flag with --arch gpt2 or a shape gtron's llama refuses."""
    llama_flags = {"NKV": a.NKV, "HS": a.HS, "F": a.F, "qk-norm": a.qk_norm,
                   "rope-theta": a.rope_theta}
    if a.arch == "gpt2":
        given = [name for name, v in llama_flags.items() if v is not None]
        if given:
            ap.error(f"--{given[0]} is a flag of --arch llama")
        if a.tied != 1:
            ap.error("--tied 0 is for --arch llama (the GPT-2 reference is tied)")
        return {"arch": "gpt2", "tied": 1}
    nkv = a.NKV or a.NH  # 0, as bench_gpu's default, too
    hs = a.HS or a.C // a.NH
    f = a.F or (8 * a.C // 3 + 63) // 64 * 64
    theta = a.rope_theta if a.rope_theta is not None else 500000.0
    if nkv <= 0 or a.NH % nkv != 0 or hs <= 0 or hs % 2 != 0 or f <= 0 or theta <= 0:
        ap.error(f"llama shape NH {a.NH}, NKV {nkv}, HS {hs}, F {f}, rope-theta {theta}: NKV must "
                 "divide NH, HS be even and positive, F and rope-theta positive")
    return {"arch": "llama", "NKV": nkv, "HS": hs, "F": f, "qk_norm": a.qk_norm or 0,
            "tied": a.tied, "rope_theta": theta}


def resolve_moe(ap, a, family):
    """The MoE JSON fields (bench_gpu's names, model.moe's defaults resolved), {} for a dense
    model; a usage error (exit 2) for a MoE flag without --moe-experts, with --arch gpt2 or
    --fp8, or a shape gtron refuses (model.moe's checks in trainer/config_moe.cc)."""
    flags = {"moe-top-k": a.moe_top_k, "moe-width": a.moe_width, "moe-shared": a.moe_shared,
             "moe-first-dense": a.moe_first_dense, "moe-router": a.moe_router,
             "moe-norm-topk": a.moe_norm_topk}
    if a.moe_experts == 0:
        given = [name for name, v in flags.items() if v is not None]
        if given:
            ap.error(f"--{given[0]} needs --moe-experts E > 0")
        return {}
    if a.arch != "llama":
        ap.error("--moe-experts: the mixture of experts belongs to --arch llama")
    if a.fp8 != "none":
        ap.error("--moe-experts with --fp8: gtron has no FP8 grouped expert GEMM on CUDA")
    fields = {"moe_experts": a.moe_experts,
              "moe_top_k": 2 if a.moe_top_k is None else a.moe_top_k,
              "moe_width": a.moe_width or family["F"],
              "moe_shared": a.moe_shared or 0, "moe_first_dense": a.moe_first_dense or 0,
              "moe_router": a.moe_router or "softmax",
              "moe_norm_topk": 1 if a.moe_norm_topk is None else a.moe_norm_topk}
    if not 1 <= fields["moe_top_k"] <= a.moe_experts or a.moe_experts > 512:
        ap.error(f"--moe-top-k {fields['moe_top_k']} with --moe-experts {a.moe_experts}: top-k "
                 "must be 1 .. E, and E at most 512 (gtron's CUDA router)")
    if fields["moe_first_dense"] >= a.L or fields["moe_shared"] < 0 or fields["moe_width"] <= 0:
        ap.error(f"--moe-first-dense {fields['moe_first_dense']} must be < --L {a.L}, "
                 "--moe-shared >= 0 and --moe-width > 0")
    if a.moe_align < 1:
        ap.error(f"--moe-align {a.moe_align}: 1 (no padding) or more")
    return fields


def moe_kwargs(a, fields):
    """Llama's `moe` argument from resolve_moe()'s fields (None: dense)."""
    if not fields:
        return None
    return {"E": fields["moe_experts"], "top_k": fields["moe_top_k"],
            "F_": fields["moe_width"], "num_shared": fields["moe_shared"],
            "router": fields["moe_router"], "norm_topk": fields["moe_norm_topk"] == 1,
            "align": a.moe_align, "compile_experts": a.moe_compile_experts == 1,
            "first_dense": fields["moe_first_dense"]}


def profile_kernels(step, n, trace_path=""):
    """Per-kernel GPU time of n steps (CUPTI through torch.profiler), ms per step, to stderr;
    the Chrome trace to trace_path when one is given."""
    import sys
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    if trace_path:
        prof.export_chrome_trace(trace_path)
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
