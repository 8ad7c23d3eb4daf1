"""The mixture-of-experts MLP of scripts/bench_torch.py (`--moe-experts E`): gtron's
model/moe.h in PyTorch, its experts run through torch._grouped_mm, and `--check` against a
per-expert loop.

What it computes (model/moe.h's header and Note [MoE layout]): per token g [C],
  logits = router(g)                                  [E], the block linears' precision
  s      = softmax(logits) or sigmoid(logits)         in fp32 (Note [fp32 routing on CUDA])
  ids    = the k largest s; gates = s[ids], divided by their sum for sigmoid, and for softmax
           when norm_topk_prob
  y      = sum_j gates_j * Expert_ids_j(g)  +  Shared(g)
Every expert is a SwiGLU down(silu(gate(g)) * up(g)) with one [2F, C] gate|up matrix (gate's
rows first) and a [C, F] down matrix; the shared experts are one such MLP of width S*F; the
routing is dropless (every token reaches its k experts). gtron's sigmoid router adds a bias to
the scores for the choice only; the bias moves only with model.moe.bias_update_rate > 0, which
neither benchmark sets, so it is left out here.

How (the way PyTorch's own MoE code, torchtitan's, runs experts): the N*k (token, slot) pairs
are sorted by expert with a stable argsort of the flattened ids (so each expert's rows are in
token order, as gtron's plan orders them), the offsets are each expert's cumulative row end
(searchsorted over the sorted ids, int32), the rows are gathered with index_select, and the two
expert GEMMs are torch._grouped_mm(rows [M, K] bf16, weights [E, K, N] bf16, offs=...) with the
weights kept as nn.Linear-style [E, out, in] parameters passed transposed. The outputs come back
to (token, slot) order through the inverse permutation and are summed per token in fp32 with
the fp32 gates (gtron's combine), then cast to the rows' dtype. Every shape is fixed by N, k, E,
C and F (only the offsets depend on the routing), so torch.compile takes the whole layer with no
graph break and no recompile ("moe_impl": "grouped_mm").

--moe-align A > 1 rounds each expert's group up to a multiple of A rows in a fixed-size zeroed
buffer of N*k + E*(A-1) rows (what torchtitan did while bf16 grouped GEMMs needed 8-row groups;
its current default is 1, no padding): "grouped_mm+alignA". --moe-compile-experts 0 keeps the
expert part out of the compiled graph (torch.compiler.disable): "grouped_mm+nocompile".

`--check` (check()): small sizes with odd group sizes and one expert no token picks; the routing
against a per-token sort, then the grouped layer against a loop over the experts (F.linear per
expert, index_add of the gated outputs) in float32 (CPU or GPU), in bf16 autocast on a GPU, and
torch.compile'd against eager, forward and every gradient. One JSON line; "align_ok" lists the
alignments whose case in the benchmark's dtype (bf16 on a GPU) passed, "compile_ok" whether the
compiled layer did (null: not tried), "ok" whether everything did.
"""
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MoE(nn.Module):
    """The MoE MLP of one llama block: [..., C] -> [..., C] (no residual)."""

    def __init__(self, C, E, top_k, F_, num_shared=0, router="softmax", norm_topk=True,
                 std=0.02, resid_std=0.02, align=1, compile_experts=True):
        super().__init__()
        self.E, self.k, self.F = E, top_k, F_
        self.sigmoid = router == "sigmoid"
        self.normalize = self.sigmoid or norm_topk
        self.align = align
        self.router = nn.Linear(C, E, bias=False)
        self.gate_up = nn.Parameter(torch.empty(E, 2 * F_, C))  # per expert: gate rows, up rows
        self.down = nn.Parameter(torch.empty(E, C, F_))
        nn.init.normal_(self.router.weight, 0.0, std)
        nn.init.normal_(self.gate_up, 0.0, std)
        nn.init.normal_(self.down, 0.0, resid_std)
        self.shared_gate_up = self.shared_down_proj = None
        if num_shared > 0:
            self.shared_gate_up = nn.Linear(C, 2 * num_shared * F_, bias=False)
            self.shared_down_proj = nn.Linear(num_shared * F_, C, bias=False)
            nn.init.normal_(self.shared_gate_up.weight, 0.0, std)
            nn.init.normal_(self.shared_down_proj.weight, 0.0, resid_std)
        self._experts = grouped_experts if compile_experts else grouped_experts_nocompile

    def impl(self):
        """The "moe_impl" field of the JSON line."""
        name = "grouped_mm"
        if self.align > 1:
            name += f"+align{self.align}"
        if self._experts is grouped_experts_nocompile:
            name += "+nocompile"
        return name

    def route(self, g):
        """g [N, C] -> gates [N, k] fp32, ids [N, k] int64 (slot 0 the largest), compute dtype."""
        logits = self.router(g)  # bf16 under autocast: the dtype the experts compute in
        scores = logits.float()
        scores = torch.sigmoid(scores) if self.sigmoid else torch.softmax(scores, dim=-1)
        gates, ids = torch.topk(scores, self.k, dim=-1)
        if self.normalize:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        return gates, ids, logits.dtype

    def shared(self, g):
        h = self.shared_gate_up(g)
        Fs = h.shape[-1] // 2
        return self.shared_down_proj(F.silu(h[..., :Fs]) * h[..., Fs:])

    def forward(self, g, experts=None):
        shape = g.shape
        g = g.reshape(-1, shape[-1])
        gates, ids, dt = self.route(g)
        run = experts or self._experts
        y = run(g.to(dt), gates, ids, self.gate_up.to(dt), self.down.to(dt), self.align)
        if self.shared_gate_up is not None:
            y = y + self.shared(g)
        return y.view(shape)


def _swiglu(h):
    Fe = h.shape[-1] // 2
    return F.silu(h[:, :Fe]) * h[:, Fe:]


def grouped_experts(x, gates, ids, w_gate_up, w_down, align=1):
    """The routed experts over x [N, C] in dtype dt: sort, two grouped GEMMs, back, gated sum."""
    N, k = ids.shape
    E = w_gate_up.shape[0]
    M = N * k
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # slot n*k + j in expert order, tokens ascending
    sorted_ids = flat[order]
    experts = torch.arange(E, device=x.device, dtype=sorted_ids.dtype)
    ends = torch.searchsorted(sorted_ids, experts, right=True, out_int32=True)  # cumulative
    rows = x.index_select(0, order // k)  # [M, C]
    if align > 1:  # groups padded to multiples of align inside a fixed [M + E*(align-1), C]
        counts = torch.diff(ends, prepend=ends.new_zeros(1))
        padded = (counts + align - 1) // align * align
        pad_ends = torch.cumsum(padded, 0, dtype=torch.int32)
        shift = (pad_ends - padded) - (ends - counts)  # group start, padded minus packed
        dest = shift[sorted_ids] + torch.arange(M, device=x.device)
        buf = rows.new_zeros(M + E * (align - 1), rows.shape[1]).index_copy(0, dest, rows)
        h = torch._grouped_mm(buf, w_gate_up.transpose(-2, -1), offs=pad_ends)
        y = torch._grouped_mm(_swiglu(h), w_down.transpose(-2, -1), offs=pad_ends)
        y = y.index_select(0, dest)
    else:
        h = torch._grouped_mm(rows, w_gate_up.transpose(-2, -1), offs=ends)  # [M, 2F]
        y = torch._grouped_mm(_swiglu(h), w_down.transpose(-2, -1), offs=ends)  # [M, C]
    y = y.index_select(0, torch.argsort(order)).view(N, k, -1)  # (token, slot) order
    return (y.float() * gates.unsqueeze(-1)).sum(dim=1).to(x.dtype)


grouped_experts_nocompile = torch.compiler.disable(grouped_experts)


def loop_experts(x, gates, ids, w_gate_up, w_down, align=1):
    """The reference: one expert at a time, its tokens picked with a mask, F.linear, index_add."""
    del align
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w_gate_up.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        ye = F.linear(_swiglu(F.linear(x[tok], w_gate_up[e])), w_down[e])
        out.index_add_(0, tok, ye.float() * gates[tok, slot].unsqueeze(-1))
    return out.to(x.dtype)


def _route_reference(moe, g):
    """ids and gates per token from a plain sort (value descending, index ascending: gtron's
    tie order), fp32, for every row of g."""
    scores = moe.router(g).float()
    scores = torch.sigmoid(scores) if moe.sigmoid else torch.softmax(scores, dim=-1)
    ids, gates = [], []
    for row in scores.tolist():
        top = sorted(range(len(row)), key=lambda e: (-row[e], e))[:moe.k]
        vals = [row[e] for e in top]
        total = sum(vals) if moe.normalize else 1.0
        ids.append(top)
        gates.append([v / total for v in vals])
    return ids, gates


def _run(moe, forward, x, dtype, seed=7):
    """y = forward(x) under autocast `dtype` (None: none), then the backward of sum(y * w) for
    fixed normal w: y, dx and the gradient of every parameter of `moe`, in fp32."""
    moe.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    with torch.autocast(x.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        y = forward(x)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(y.device)
    (y.float() * w).sum().backward()
    out = {"y": y.detach().float(), "dx": x.grad.float()}
    for name, p in moe.named_parameters():
        out["d" + name] = p.grad.float()
    return out


def _compare(got, want, tol):
    """Max abs difference per output, relative to the reference's largest magnitude."""
    diffs = {}
    for key, ref in want.items():
        scale = ref.abs().max().item() or 1.0
        diffs[key] = (got[key] - ref).abs().max().item() / scale
    worst = max(diffs.values())
    return {"max_rel_diff": {k: float(f"{v:.3g}") for k, v in diffs.items()},
            "worst": float(f"{worst:.3g}"), "tol": tol, "ok": bool(worst <= tol)}


def _case(name, body):
    """{"case": name, ...body()}, or ok false with the error when body raises."""
    case = {"case": name}
    try:
        case.update(body())
    except Exception as e:  # noqa: BLE001 - reported in the JSON line; the check goes on
        case.update({"ok": False, "error": f"{type(e).__name__}: {e}"[:300]})
    return case


def _routing_ok(moe, x):
    """route() against _route_reference(): the same ids in the same slots, gates within 1e-6."""
    gates, ids, _ = moe.route(x)
    ref_ids, ref_gates = _route_reference(moe, x)
    worst = max(abs(a - b) for r, q in zip(gates.tolist(), ref_gates) for a, b in zip(r, q))
    return ids.tolist() == ref_ids and worst < 1e-6


def check(device=None, N=111, C=64, E=9, k=3, F_=48, shared=1, router="softmax", norm_topk=True,
          compile_check=True):
    """The --check mode: prints one JSON line; returns whether every case passed."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here (the bench allows TF32)
    torch.manual_seed(0)
    x = torch.randn(N, C, device=dev) + 1.0  # a positive mean: expert E-1 below is never picked

    def layer(align):
        torch.manual_seed(1)
        moe = MoE(C, E, k, F_, shared, router, norm_topk, std=0.2, resid_std=0.1, align=align)
        with torch.no_grad():
            moe.router.weight[E - 1] = -0.5
        return moe.to(dev)

    moe = layer(1)
    ids = moe.route(x)[1]
    result = {"check": "moe_grouped_mm", "device": str(dev), "torch": torch.__version__,
              "N": N, "C": C, "E": E, "top_k": k, "F": F_, "shared": shared, "router": router,
              "rows_per_expert": torch.bincount(ids.reshape(-1), minlength=E).tolist(),
              "routing_ok": _routing_ok(moe, x), "cases": []}
    dtypes = [("fp32", None, 1e-5)] + ([("bf16", torch.bfloat16, 3e-2)] if dev.type == "cuda"
                                       else [])
    align_ok = []  # the alignments whose case in the benchmark's dtype (the last) passed
    for align in (1, 8):
        moe = layer(align)
        for name, dtype, tol in dtypes:
            case = _case(f"{name} align{align}", lambda: _compare(
                _run(moe, moe, x, dtype),
                _run(moe, lambda t: moe(t, experts=loop_experts), x, dtype), tol))
            result["cases"].append(case)
        if result["routing_ok"] and case["ok"]:
            align_ok.append(align)
    result["align_ok"] = align_ok
    result["compile_ok"] = None
    if compile_check and dev.type == "cuda" and align_ok:
        moe = layer(align_ok[0])
        compiled = torch.compile(moe)
        case = _case(f"compile bf16 align{align_ok[0]}", lambda: _compare(
            _run(moe, compiled, x, torch.bfloat16), _run(moe, moe, x, torch.bfloat16), 3e-2))
        result["cases"].append(case)
        result["compile_ok"] = case["ok"]
    result["ok"] = (result["routing_ok"] and all(c["ok"] for c in result["cases"]) and
                    result["compile_ok"] is not False)
    print(json.dumps(result), flush=True)
    return result["ok"]


def moe_std(L):
    """gtron's init: std 0.02, the down projections' 0.02 / sqrt(2L) (the residual-scaled)."""
    return 0.02, 0.02 / math.sqrt(2 * L)
