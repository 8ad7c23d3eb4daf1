#!/usr/bin/env python3
"""PyTorch's attention on bench_attention's cells (issue 49), timed the way it times gtron's.

The cells are bench_attention's (Note [attention sweep cells] in tests/model/attention_sweep.h):
head sizes 64 and 128, MHA and GQA (NKV = NH / --group), T in 512 .. 8192 at --tokens (16384)
tokens a batch, NH = --width (2048) / HS; the same flags build the same list, and --list prints it
in the same format (tests/model:bench_attention_list_test compares the two).

Each cell runs torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) in bf16
under torch.nn.attention.sdpa_kernel with one backend at a time:
  cudnn  SDPBackend.CUDNN_ATTENTION (cuDNN's fused attention)
  fa2    SDPBackend.FLASH_ATTENTION (FlashAttention-2 as built into PyTorch)
q, k, v are [B, T, H, HS] token-major buffers viewed as [B, H, T, HS] (transpose(1, 2)), as a
model's projections give them and as gtron reads its packed qkv rows. GQA passes the NKV k/v heads
with enable_gqa=True; a backend that refuses that gets k and v expanded by repeat_interleave
inside the timed call (forward and backward then include the copy and the sum over the group):
"gqa" in the line says which ("native" or "repeat"). A backend that refuses a cell either way
prints {"kernel": ..., "error": ...} for it.

Method, as bench_attention's: random normal inputs in --rotate sets; a check of set 0's output
and gradients against the math backend in fp32 on the same bf16 values, on sequences 0 and B - 1
(normwise relative error of out, dq, dk, dv; "rel_err" is the largest; NaN fails); then --warmup
calls and --repeats calls each between two torch.cuda.Events, the inputs rotating, the median.
Forward: the call with inputs that require grad (what training runs, log-sum-exp kept); backward:
torch.autograd.grad of the output with a random dout (retain_graph, so one forward serves every
backward of a set). FLOPs: forward 4*B*nh*T^2*hs/2, backward 2.5x forward (FlashAttention's count).
A failed check prints "check": "fail" and the script exits 1 after the last cell.

--table FILE...: bench_attention's and this script's JSON lines side by side (gtron vs cudnn vs
fa2 TFLOP/s forward and backward, gtron / cudnn), no PyTorch needed; scripts/bench_attention.sh
runs both and then this.

Runs on the GPU machine (PyTorch is there; --list, --help and --table run anywhere):
  python3 scripts/bench_attention.py [--hs 64,128] [--T 512,...] [--backends cudnn,fa2]
"""
import argparse
import json
import math
import sys

BACKENDS = ("cudnn", "fa2")
FLOP_CONVENTION = ("causal: forward 4*B*nh*T^2*hs/2, backward 2.5x forward (FlashAttention's "
                   "count; gqa cells counted per query head)")


def fail(msg):
    print(f"bench_attention.py: {msg} (--help lists the flags)", file=sys.stderr)
    sys.exit(2)


def int_list(flag, text):
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        vals = []
    if not vals or any(v <= 0 for v in vals):
        fail(f"--{flag}: got '{text}', expected a comma-separated list of positive integers")
    return vals


def word_list(flag, text, allowed):
    vals = text.split(",")
    if not vals or any(v not in allowed for v in vals):
        fail(f"--{flag}: got '{text}', expected a comma-separated list of {','.join(allowed)}")
    return vals


def parse(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Cells, method and FLOP convention: the module docstring and docs/gpu-kernels.md.")
    p.add_argument("--hs", default="64,128", help="head sizes (64 and 128 only)")
    p.add_argument("--modes", default="mha,gqa", help="mha: NKV = NH; gqa: NKV = NH / group")
    p.add_argument("--T", default="512,1024,2048,4096,8192", help="lengths, each dividing --tokens")
    p.add_argument("--tokens", type=int, default=16384, help="B*T of every cell")
    p.add_argument("--width", type=int, default=2048, help="NH*HS")
    p.add_argument("--group", type=int, default=4, help="query heads per k/v head in gqa cells")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls")
    p.add_argument("--repeats", type=int, default=50, help="timed calls (the median is reported)")
    p.add_argument("--rotate", type=int, default=3, help="input sets the calls rotate among")
    p.add_argument("--tol", type=float, default=1e-2, help="normwise relative error bound")
    p.add_argument("--seed", type=int, default=1, help="of the random inputs")
    p.add_argument("--backends", default="cudnn,fa2", help="cudnn, fa2")
    p.add_argument("--list", action="store_true", help="print the cells and exit (no GPU needed)")
    p.add_argument("--table", nargs="+", metavar="FILE",
                   help="print the comparison table of these JSON-line files and exit")
    a = p.parse_args(argv)
    a.hs = int_list("hs", a.hs)
    a.T = int_list("T", a.T)
    a.modes = word_list("modes", a.modes, ("mha", "gqa"))
    a.backends = word_list("backends", a.backends, BACKENDS)
    for name, lo in (("tokens", 1), ("width", 1), ("group", 1), ("warmup", 0), ("repeats", 1),
                     ("rotate", 1), ("seed", 0)):
        if getattr(a, name) < lo:
            fail(f"--{name}: got '{getattr(a, name)}', expected an integer >= {lo}")
    if not a.tol > 0:
        fail(f"--tol: got '{a.tol}', expected a number > 0")
    # The shape rules of bench_attention (tests/model/attention_sweep.cc check_shapes).
    for hs in a.hs:
        if hs not in (64, 128):
            fail(f"--hs: got '{hs}', expected 64 or 128 (the flash kernels' head sizes)")
        if a.width % hs:
            fail(f"--width {a.width} is not a multiple of head size {hs} (NH = width / HS)")
        if "gqa" in a.modes and (a.width // hs) % a.group:
            fail(f"--group {a.group} does not divide the {a.width // hs} query heads of head size "
                 f"{hs} (NKV = NH / group)")
    for t in a.T:
        if a.tokens % t:
            fail(f"--T {t} does not divide --tokens {a.tokens} (B = tokens / T)")
    return a


def cells(a):
    """Note [attention sweep cells]: head size, then mode, then length."""
    out = []
    for hs in a.hs:
        for mode in a.modes:
            for t in a.T:
                nh = a.width // hs
                out.append({"hs": hs, "T": t, "B": a.tokens // t, "nh": nh,
                            "nkv": nh // a.group if mode == "gqa" else nh})
    return out


def forward_flops(c):
    return 4.0 * c["B"] * c["nh"] * c["T"] * c["T"] * c["hs"] / 2.0


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


# ------------------------------------------------------------------------------------------------
# The sweep (PyTorch imported here only: --list and --table run without it).

def sweep(a):
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"bench_attention.py: the sweep needs PyTorch ({e}); --list and --table do not",
              file=sys.stderr)
        sys.exit(2)

    if not torch.cuda.is_available():
        print("bench_attention.py: no CUDA device: the sweep times PyTorch's attention on a GPU "
              "(--list prints its cells without one)", file=sys.stderr)
        sys.exit(2)
    backend_of = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}
    card = torch.cuda.get_device_name(0)
    print(json.dumps({"bench": "bench_attention.py", "flops": FLOP_CONVENTION,
                      "timing": f"torch.cuda.Event, median of {a.repeats} calls after "
                                f"{a.warmup}, inputs rotating among {a.rotate} sets",
                      "tol": a.tol, "torch": torch.__version__,
                      "cudnn": torch.backends.cudnn.version(), "card": card}), flush=True)

    def attend(q, k, v, gqa):
        """SDPA on [B, H, T, HS] views; gqa: "native" (enable_gqa) or "repeat" or None (MHA)."""
        if gqa == "native":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if gqa == "repeat":
            g = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def inputs(c, gen):
        """q, k, v ([B, H, T, HS] views of token-major buffers, requiring grad) and dout."""
        def rnd(h):
            x = torch.randn(c["B"], c["T"], h, c["hs"], generator=gen, device="cuda",
                            dtype=torch.bfloat16)
            return x.transpose(1, 2)
        q, k, v = rnd(c["nh"]), rnd(c["nkv"]), rnd(c["nkv"])
        dout = rnd(c["nh"])
        return [t.requires_grad_() for t in (q, k, v)], dout

    def check(c, qkv, dout, out, grads):
        """Normwise errors of out, dq, dk, dv against the fp32 math backend on sequences 0 and
        B - 1, a few k/v heads at a time (the math backend holds [heads, T, T] fp32 scores)."""
        g = c["nh"] // c["nkv"]
        kv_step = max(1, (1 << 31) // (4 * c["T"] * c["T"] * g))  # about 2 GiB of scores
        sums = {k: [0.0, 0.0] for k in ("out", "dq", "dk", "dv")}
        for b in sorted({0, c["B"] - 1}):
            for k0 in range(0, c["nkv"], kv_step):
                k1 = min(c["nkv"], k0 + kv_step)
                qs, ks = slice(k0 * g, k1 * g), slice(k0, k1)
                part = [qkv[0][b:b + 1, qs], qkv[1][b:b + 1, ks], qkv[2][b:b + 1, ks]]
                ref_in = [t.detach().float().requires_grad_() for t in part]
                with sdpa_kernel(SDPBackend.MATH):
                    ref_out = attend(*ref_in, "native" if g > 1 else None)
                ref_grads = torch.autograd.grad(ref_out, ref_in, dout[b:b + 1, qs].float())
                got = [out[b:b + 1, qs], grads[0][b:b + 1, qs], grads[1][b:b + 1, ks],
                       grads[2][b:b + 1, ks]]
                for name, x, r in zip(sums, got, (ref_out,) + tuple(ref_grads)):
                    sums[name][0] += ((x.double() - r.double()) ** 2).sum().item()
                    sums[name][1] += (r.double() ** 2).sum().item()
                del ref_in, ref_out, ref_grads
        return {k: math.sqrt(d2 / max(r2, 1e-300)) for k, (d2, r2) in sums.items()}

    def time_ms(call):
        for i in range(a.warmup):
            call(i % a.rotate)
        # The GPU sleeps (~50 ms at 2 GHz) while the host queues the timed calls, so Python's
        # per-call overhead never leaves the GPU idle between two events.
        torch.cuda.synchronize()
        torch.cuda._sleep(100_000_000)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(a.repeats)]
        for i, (s, e) in enumerate(ev):
            s.record()
            call((a.warmup + i) % a.rotate)
            e.record()
        torch.cuda.synchronize()
        return median([s.elapsed_time(e) for s, e in ev])

    def run(c, name, seed):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        sets = [inputs(c, gen) for _ in range(a.rotate)]
        modes = ["native", "repeat"] if c["nkv"] != c["nh"] else [None]
        last = None
        with sdpa_kernel(backend_of[name]):
            for gqa in modes:
                try:
                    qkv, dout = sets[0]
                    out = attend(*qkv, gqa)
                    grads = torch.autograd.grad(out, qkv, dout)
                    torch.cuda.synchronize()
                    break
                except RuntimeError as e:
                    last = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            else:
                return {"error": last}
            errs = check(c, qkv, dout, out, grads)
            del out, grads
            fwd = time_ms(lambda i: attend(*sets[i][0], gqa))
            outs = [attend(*s[0], gqa) for s in sets]
            bwd = time_ms(lambda i: torch.autograd.grad(outs[i], sets[i][0], sets[i][1],
                                                        retain_graph=True))
        return {"gqa": gqa or "mha", "fwd_ms": fwd, "bwd_ms": bwd, "errs": errs}

    failed = 0
    for ci, c in enumerate(cells(a)):
        for bi, name in enumerate(a.backends):
            line = {"kernel": name, "variant": "sdpa"}
            line.update(c)
            try:
                r = run(c, name, (a.seed * 1009 + ci) * 1009 + bi)
            except torch.cuda.OutOfMemoryError as e:
                r = {"error": f"OutOfMemoryError: {str(e).splitlines()[0]}"}
            torch.cuda.empty_cache()
            if "error" in r:
                line.update({"error": r["error"], "card": card})
                print(json.dumps(line), flush=True)
                continue
            f = forward_flops(c)
            worst = max(r["errs"].values(), key=lambda x: math.inf if math.isnan(x) else x)
            ok = worst < a.tol
            failed += not ok
            line.update({"gqa": r["gqa"], "fwd_ms": round(r["fwd_ms"], 4),
                         "bwd_ms": round(r["bwd_ms"], 4),
                         "fwd_tflops": round(f / (r["fwd_ms"] * 1e-3) / 1e12, 1),
                         "bwd_tflops": round(2.5 * f / (r["bwd_ms"] * 1e-3) / 1e12, 1),
                         "rel_err": float(f"{worst:.3e}")})
            line.update({f"err_{k}": float(f"{v:.3e}") for k, v in r["errs"].items()})
            line.update({"tol": a.tol, "check": "pass" if ok else "fail", "card": card})
            print(json.dumps(line), flush=True)
    if failed:
        print(f"bench_attention.py: {failed} cell(s) failed the check (\"check\": \"fail\")",
              file=sys.stderr)
        sys.exit(1)


# ------------------------------------------------------------------------------------------------
# The table (standard library only).

def read_lines(paths):
    """Result lines keyed by (kernel, variant, hs, T, nh, nkv); the header lines' cards."""
    res, cards = {}, set()
    for path in paths:
        try:
            text = open(path).read()
        except OSError as e:
            fail(f"--table: cannot read {path}: {e.strerror}")
        for n, raw in enumerate(text.splitlines(), 1):
            raw = raw.strip()
            if not raw.startswith("{"):
                continue  # a log line
            try:
                d = json.loads(raw)
            except ValueError:
                fail(f"--table: {path}:{n}: not a JSON line: {raw[:80]!r}")
            if "card" in d:
                cards.add(d["card"])
            if "kernel" in d:
                res[(d["kernel"], d.get("variant", ""), d["hs"], d["T"], d["nh"], d["nkv"])] = d
    return res, cards


def table(paths):
    res, cards = read_lines(paths)
    keys = sorted({k[2:] for k in res}, key=lambda k: (k[0], k[3] != k[2], k[1]))

    def get(kernel, variant, key, field):
        d = res.get((kernel, variant) + key)
        if d is None:
            return None, "-"
        if "error" in d:
            return None, "refused"
        v = d.get(field)
        flag = "" if d.get("check", "pass") == "pass" else "!"
        return v, (f"{v:.0f}" if isinstance(v, (int, float)) else "-") + flag

    def ratio(x, y):
        return f"{x / y:.2f}" if x is not None and y else "-"

    print(f"card: {', '.join(sorted(cards)) or '?'}; TFLOP/s, {FLOP_CONVENTION}; "
          "'!' marks a failed check, 'refused' a backend that cannot run the cell")
    head = ("hs", "T", "B", "nh", "nkv", "fwd gtron", "cudnn", "fa2", "g/cudnn",
            "bwd gtron", "cudnn", "fa2", "g/cudnn", "gtron err")
    rows = [head]
    for key in keys:
        hs, t, nh, nkv = key
        b = next(d["B"] for k, d in res.items() if k[2:] == key)
        row = [str(hs), str(t), str(b), str(nh), str(nkv)]
        for field in ("fwd_tflops", "bwd_tflops"):
            g, gs = get("gtron", "plain", key, field)
            c, cs = get("cudnn", "sdpa", key, field)
            _, fs = get("fa2", "sdpa", key, field)
            row += [gs, cs, fs, ratio(g, c)]
        e, _ = get("gtron", "plain", key, "rel_err")
        row.append(f"{e:.1e}" if isinstance(e, (int, float)) else "-")
        rows.append(row)
    print_rows(rows)
    variants = sorted({k[1] for k in res if k[0] == "gtron"} - {"plain"})
    if variants:
        print("gtron's variants (Note [attention sweep variants]): TFLOP/s forward / backward")
        rows = [("hs", "T", "nh", "nkv", "plain") + tuple(variants)]
        for key in keys:
            row = [str(x) for x in (key[0], key[1], key[2], key[3])]
            for v in ("plain",) + tuple(variants):
                _, fs = get("gtron", v, key, "fwd_tflops")
                _, bs = get("gtron", v, key, "bwd_tflops")
                row.append(f"{fs}/{bs}")
            rows.append(row)
        print_rows(rows)


def print_rows(rows):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(x).rjust(w) for x, w in zip(r, widths)))


def main(argv):
    a = parse(argv)
    if a.table:
        table(a.table)
    elif a.list:
        for c in cells(a):
            print(json.dumps(c))
    else:
        sweep(a)


if __name__ == "__main__":
    main(sys.argv[1:])
