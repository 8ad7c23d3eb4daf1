#!/usr/bin/env python3
"""Multi-GPU measurements (issue: multi-GPU runs on 2-8 H200s), one JSON line per run, then a
summary JSON per section. Run on a machine with N GPUs, from the repository root:

    python3 scripts/bench_multigpu.py --nproc 8            # every section
    python3 scripts/bench_multigpu.py --nproc 4 --only 2   # one section
    python3 scripts/bench_multigpu.py --cpu-smoke          # the script itself, tiny, on CPU/Gloo

Sections:
  1 correctness: GPT-2 124M shape with MTP D=1, 50 steps: DP=N, GTP=N, DP=2 x GTP=N/2, each with
    graphs none and layers; worst relative loss difference against DP=N (bf16 tolerance 2e-2).
  2 memory: peak memory and fp32 weight MiB per GPU at GTP = 1, 2, 4, 8 (<= N), DP = N/GTP.
  3 repeated-backward reuse at scale: output head 131072 x 4096 fp32 (2 GiB per send buffer),
    MTP D=2, GTP=N: send-pool bytes, peak memory and tokens/s with the reuse on and off.
  4 symmetric vs plain send buffers: parallel.gtp_symmetric_memory on/off, GTP=N: step time and
    reduce-scatter ms per step.
  5 throughput: GPT-2 350M shape (L=24, C=1024, NH=16), tokens/s per GPU at GTP=N vs DP=N, with
    all-gather/reduce-scatter/all-reduce ms per step and the hidden fraction 1 - exposed/busy.
GPU runs set log.comm_timing=true (CUDA event pairs around collectives and waits).
Every run goes through scripts/gtronrun and `gtron train` with NCCL_NVLS_ENABLE=0 (and the other
no-multicast variables the GPU machines require) in its environment. Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


def default_gtron():
    for cand in (os.path.join(ROOT, ".gpubin", "gtron"),
                 os.path.join(ROOT, "bazel-bin", "trainer", "gtron")):
        if os.access(cand, os.X_OK):
            return cand
    return None


class Bench:
    def __init__(self, args):
        self.args = args
        self.n = args.nproc
        self.work = args.work
        self.env = dict(os.environ, **NO_MULTICAST)
        lib = os.path.join(ROOT, ".gpubin", "lib")
        if os.path.isdir(lib):
            self.env["LD_LIBRARY_PATH"] = lib + ":" + self.env.get("LD_LIBRARY_PATH", "")

    def tokens_per_step(self):
        micro = 2 if self.args.cpu_smoke else self.args.micro
        return micro * self.n * (32 if self.args.cpu_smoke else 1024)

    def base(self):
        if self.args.cpu_smoke:
            return ["model.vocab_size=64", "model.context_length=32", "model.n_layer=2",
                    "model.n_head=2", "model.n_embd=32", "train.seq_len=32",
                    "train.device=cpu", "train.precision=fp32", "data.synthetic.tokens=50000",
                    "data.synthetic.val_tokens=5000", "train.eval_every=0"]
        return ["train.device=cuda", "train.precision=bf16", "train.eval_every=0", "log.comm_timing=true",
                "data.synthetic.tokens=4000000", "data.synthetic.val_tokens=65536"]

    def run(self, name, sets, steps):
        out = os.path.join(self.work, name)
        micro = 2 if self.args.cpu_smoke else self.args.micro
        cmd = [sys.executable, os.path.join(ROOT, "scripts", "gtronrun"), "--standalone",
               "--nproc-per-node", str(self.n), "--", self.args.gtron, "train", "--config",
               os.path.join(ROOT, "configs", "gpt2_124m.json"), "--out", out]
        sets = self.base() + [f"train.steps={steps}", f"train.micro_batch={micro}",
                              f"train.global_batch={micro * self.n}", "log.every=1",
                              "checkpoint.every=0", f"schedule.warmup_steps={min(5, steps)}"] + sets
        for s in sets:
            cmd += ["--set", s]
        t0 = time.time()
        p = subprocess.run(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        rows = []
        path = os.path.join(out, "metrics.jsonl")
        if os.path.exists(path):
            rows = [json.loads(l) for l in open(path) if l.strip()]
        rec = {"run": name, "exit": p.returncode, "seconds": round(time.time() - t0, 1),
               "set": sets[len(self.base()):]}
        if p.returncode != 0 or not rows:
            rec["error"] = p.stdout.strip().splitlines()[-3:] if p.stdout.strip() else []
        else:
            tail = rows[len(rows) // 2:] or rows  # steady state: the second half
            tps = sorted(r["tokens_per_s"] for r in tail)[len(tail) // 2]
            last = rows[-1]
            rec.update({
                "losses": [r["loss"] for r in rows],
                "tokens_per_s": tps, "tokens_per_s_per_gpu": tps / self.n,
                "peak_mem_gib": max(r.get("peak_mem_gib", 0) for r in rows),
                "param_mib_per_gpu": last.get("param_mib"),
                "send_pool_bytes": last.get("send_pool_bytes"),
            })
            for k in ("comm_ag_ms", "comm_rs_ms", "comm_ar_ms", "comm_exposed_ms", "comm_hidden_frac"):
                vals = sorted(r[k] for r in tail if k in r)
                if vals:
                    rec[k] = vals[len(vals) // 2]
        print(json.dumps({k: v for k, v in rec.items() if k != "losses"}), flush=True)
        return rec

    def section1(self):
        steps = 8 if self.args.cpu_smoke else 50
        layouts = [("dp", 1), ("gtp", self.n)]
        if self.n >= 4:
            layouts.append(("dp2xgtp", self.n // 2))
        runs = {}
        for lname, g in layouts:
            for scope in ("none", "layers"):
                name = f"s1_{lname}{g}_{scope}"
                runs[name] = self.run(name, ["mtp.depth=1", f"parallel.gtp={g}",
                                             f"graphs.scope={scope}",
                                             "parallel.distributed_optimizer=true"], steps)
        ref = runs[f"s1_dp1_none"]
        summary = {"section": 1, "reference": "s1_dp1_none", "tolerance": 2e-2}
        for name, r in runs.items():
            if "losses" in r and "losses" in ref:
                worst = max(abs(a - b) / abs(a) for a, b in zip(ref["losses"], r["losses"]))
                summary[name] = {"worst_rel_diff": worst, "ok": worst < 2e-2}
            else:
                summary[name] = {"ok": False, "error": r.get("error")}
        print(json.dumps(summary), flush=True)

    def section2(self):
        summary = {"section": 2}
        g = 1
        while g <= min(self.n, 8):
            r = self.run(f"s2_gtp{g}", [f"parallel.gtp={g}", "parallel.distributed_optimizer=true"],
                         4 if self.args.cpu_smoke else 20)
            summary[f"gtp{g}"] = {k: r.get(k) for k in ("peak_mem_gib", "param_mib_per_gpu")}
            g *= 2
        print(json.dumps(summary), flush=True)

    def section3(self):
        shape = (["model.vocab_size=500", "model.n_embd=64", "model.n_head=2"]
                 if self.args.cpu_smoke else
                 ["model.vocab_size=131072", "model.n_embd=4096", "model.n_head=32",
                  "model.n_layer=2", "model.context_length=256", "train.seq_len=256",
                  "train.precision=fp32"])
        summary = {"section": 3}
        for reuse in ("true", "false"):
            r = self.run(f"s3_reuse_{reuse}", shape + [
                "mtp.depth=2", "model.tied_embeddings=false", f"parallel.gtp={self.n}",
                f"parallel.gtp_reuse_repeated_send_buffer={reuse}"], 4 if self.args.cpu_smoke else 10)
            summary[f"reuse_{reuse}"] = {k: r.get(k) for k in
                                         ("send_pool_bytes", "peak_mem_gib", "tokens_per_s")}
        print(json.dumps(summary), flush=True)

    def section4(self):
        summary = {"section": 4}
        for sym in ("true", "false"):
            r = self.run(f"s4_symmetric_{sym}", [f"parallel.gtp={self.n}",
                                                  f"parallel.gtp_symmetric_memory={sym}"],
                         4 if self.args.cpu_smoke else 30)
            tps = r.get("tokens_per_s")
            summary[f"symmetric_{sym}"] = {
                "tokens_per_s": tps, "reduce_scatter_ms_per_step": r.get("comm_rs_ms"),
                "ms_per_step": (1e3 * self.tokens_per_step() / tps) if tps else None}
        print(json.dumps(summary), flush=True)

    def section5(self):
        shape = ([] if self.args.cpu_smoke else
                 ["model.n_layer=24", "model.n_embd=1024", "model.n_head=16"])
        summary = {"section": 5}
        for name, g in (("dp", 1), ("gtp", self.n)):
            r = self.run(f"s5_{name}{g}", shape + [f"parallel.gtp={g}",
                                                   "parallel.distributed_optimizer=true"],
                         4 if self.args.cpu_smoke else 30)
            summary[f"{name}{g}"] = {k: r.get(k) for k in (
                "tokens_per_s_per_gpu", "comm_ag_ms", "comm_rs_ms", "comm_ar_ms",
                "comm_exposed_ms", "comm_hidden_frac")}
        print(json.dumps(summary), flush=True)


def main():
    ap = argparse.ArgumentParser(description="gtron multi-GPU measurements")
    ap.add_argument("--nproc", type=int, default=None, help="GPUs (processes); default: all")
    ap.add_argument("--gtron", default=default_gtron())
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "bench_multigpu"))
    ap.add_argument("--micro", type=int, default=8, help="sequences per GPU per step")
    ap.add_argument("--only", type=int, choices=range(1, 6), default=None)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU/Gloo, 2 ranks")
    args = ap.parse_args()
    if args.gtron is None or not os.access(args.gtron, os.X_OK):
        sys.exit("bench_multigpu: no gtron binary (bazel build //trainer:gtron, or "
                 "scripts/gpu_tests.sh for .gpubin/gtron)")
    if args.cpu_smoke:
        args.nproc = args.nproc or 2
    if args.nproc is None:
        out = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, text=True).stdout
        args.nproc = max(1, len([l for l in out.splitlines() if l.startswith("GPU ")]))
    if args.nproc < 2:
        sys.exit(f"bench_multigpu: needs at least 2 GPUs (got {args.nproc})")
    os.makedirs(args.work, exist_ok=True)
    bench = Bench(args)
    for k in range(1, 6):
        if args.only in (None, k):
            getattr(bench, f"section{k}")()
    return 0


if __name__ == "__main__":
    sys.exit(main())
