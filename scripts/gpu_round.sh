#!/usr/bin/env bash
# Device commands (PART=1, 2, 3) for the GPU work that waits, each as much of it as BUDGET
# seconds (default 560) allow, in this order:
# PART=1
#   1. the tests of the code no GPU has run yet, three lanes at once (correctness only):
#      packed_masters_cuda_test, optim_cuda_test, train_resume_cuda_test (Note [packed masters],
#      Note [fp8 codes from the update]), fp8_cuda_test (the quantizer's tail in fp8_blocks.cuh),
#      moe_cuda_test
#      (GatheredRowsEqualDispatchThenGrouped: Note [regathered expert rows]),
#      train_moe_cuda_test, cuda_graph_test, train_graphs_cuda_test, gpt_cuda_test; per test one
#      "== NAME rc=.. Ns" line with gtest's counts and the first failure lines;
#   2. scripts/bench_moe.sh at D=1, two rounds, packed (issue 50's acceptance 3: speed and peak
#      against torch.compile); then the Qwen3-MoE step (D=1) with packed masters: graphs full,
#      graphs none (the same loss), and full with GTRON_MOE_REGATHER (the same loss, its peak);
#      last, if time is left, ncu of the grouped wgmma kernels.
# PART=3 (after the first two of the thirteenth session): the fixed tests (packed masters, the
#   ordered-dQ launch, SwiGLU's codes-only backward, swiglu_linear_fp8), the Llama-3.2-1B fp8
#   step with and without GTRON_FP8_SWIGLU_DOWN beside torch.compile bf16, bench_fp8_gemm with 32
#   algorithms, then bench_attention's fa3dq beside fa3pairs. Pack: GTRON_GPU_PACK=1 bash
#   scripts/gpu_tests.sh fp8_fused packed_masters optim_cuda flash_fa3_bwd train_resume fp8_cuda.
#   After it, PART=2's parity (seeds 7-9, carry .gpupack/parity2) and ncu of the FA3 kernels,
#   which the thirteenth session's PART=2 ran out of time for.
# PART=2
#   3. issue 49: flash_fa3_bwd_cuda_test (the ordered-dQ backward, flash_fa3_backward_dq, against
#      the fp32 reference and flash_fa3_backward) and bench_attention's fa3dq beside fa3pairs;
#      issue 48's second comparison, not rerun since the ninth session: gtron fp8 against
#      torch.compile bf16 and PyTorch FP8 rowwise at the Llama-3.2-1B shape, D=0 and D=1;
#   3b. issue 48: the Llama-3.2-1B fp8 step traced (scripts/trace_gpu.sh), where its time goes;
#   4. issue 49: ncu of the FA3 forward, key and query kernels at T=8192, head sizes 128 and 64;
#   5. FP8 parity at batch 32, the windows fixed (data.seed 7), seeds 7-9 (carry .gpupack/parity2).
# Here: GTRON_GPU_PACK=1 bash scripts/gpu_tests.sh moe_cuda train_moe cuda_graph train_graphs gpt_cuda \
#   flash_fa3_bwd packed_masters optim_cuda train_resume fp8_cuda
# There (the device tool, carrying .gpupack/gpubin.tar.xz), from the repository root:
#   PART=1 BUDGET=560 bash scripts/gpu_round.sh
# Every log goes to $OUT/logs.tgz ($OUT: the device tool's output folder; a new temporary folder
# elsewhere).
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
T0=$(date +%s)
tar xJf .gpupack/gpubin.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpubin/lib
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T0) )); }
run_test() {
  local t=$1 lim=$2; shift 2
  [[ -x .gpubin/$t ]] || { echo "== $t missing"; return; }
  [[ $(left) -lt 15 ]] && { echo "== $t skipped (time)"; return; }
  (( lim > $(left) )) && lim=$(left)
  local s=$(date +%s)
  timeout $lim .gpubin/$t "$@" > $OUT/$t.log 2>&1
  local rc=$?
  { echo "== $t rc=$rc $(( $(date +%s) - s ))s $(grep -E '^\[  PASSED|^\[  SKIPPED \] [0-9]+|^\[  FAILED  \] [0-9]+ test' $OUT/$t.log | tr '\n' ' ')"
    grep -E "^\[  FAILED  \] [A-Z]|Failure|Expected|Which is|actual|rror" $OUT/$t.log | head -20; } > $OUT/$t.sum
}
PART=${PART:-1}
if [[ $PART == 1 ]]; then
  lane1() { run_test packed_masters_cuda_test 60; run_test moe_cuda_test 90; run_test cuda_graph_test 60; }
  lane2() { run_test optim_cuda_test 60; run_test fp8_cuda_test 60; run_test train_moe_cuda_test 150; }
  lane3() { run_test gpt_cuda_test 150; run_test train_graphs_cuda_test 80; run_test train_resume_cuda_test 90; }
  lane1 & lane2 & lane3 & wait
  for f in packed_masters_cuda_test optim_cuda_test fp8_cuda_test moe_cuda_test cuda_graph_test \
    train_moe_cuda_test gpt_cuda_test train_graphs_cuda_test train_resume_cuda_test; do
    cat $OUT/$f.sum 2>/dev/null || echo "== $f no summary"
  done
fi
L1B=(--arch llama --L 16 --C 2048 --NH 32 --NKV 8 --HS 64 --F 8192 --V 50304 --T 1024 --B 8 --steps 20 --warmup 5)
MOE=(--arch llama --L 12 --C 2048 --NH 16 --NKV 4 --HS 128 --F 6144 --qk-norm 1 --rope-theta 1000000
  --tied 1 --V 50304 --T 1024 --B 4 --moe-experts 64 --moe-top-k 8 --moe-width 768
  --moe-router softmax --moe-norm-topk 1 --steps 10 --warmup 3 --D 1)
gt() {  # NAME ENV... -- FLAGS...: one bench_gpu line (graphs full unless FLAGS say otherwise)
  local name=$1; shift
  local envs=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do envs+=("$1"); shift; done
  shift
  [[ $(left) -lt 45 ]] && { echo "== $name skipped (time)"; return; }
  echo "== gtron $name ($(left)s left)"
  env "${envs[@]}" timeout 90 .gpubin/bench_gpu --graphs full "$@" 2>&1 | tail -1 | cut -c1-520
}
tc() {  # NAME FLAGS...: one torch.compile bf16 line
  local name=$1; shift
  [[ $(left) -lt 120 ]] && { echo "== torch $name skipped (time)"; return; }
  echo "== torch.compile $name ($(left)s left)"
  timeout 200 python3 scripts/bench_torch.py --mode compile "$@" 2>&1 | tail -1 | cut -c1-260
}
if [[ $PART == 3 ]]; then  # the fixes after PART 1 and 2 of 2026-12-07 (thirteenth session)
  lane1() { run_test packed_masters_cuda_test 60; run_test optim_cuda_test 60; run_test fp8_cuda_test 60; }
  lane2() { run_test fp8_fused_cuda_test 120; run_test train_resume_cuda_test 90; }
  lane3() { run_test flash_fa3_bwd_cuda_test 120; }
  lane1 & lane2 & lane3 & wait
  for f in packed_masters_cuda_test optim_cuda_test fp8_cuda_test fp8_fused_cuda_test \
    train_resume_cuda_test flash_fa3_bwd_cuda_test; do
    cat $OUT/$f.sum 2>/dev/null || echo "== $f no summary"
  done
  gt "l1b fp8 D=0" -- "${L1B[@]}" --precision fp8 --D 0
  gt "l1b fp8 D=0, GTRON_FP8_SWIGLU_DOWN=0" GTRON_FP8_SWIGLU_DOWN=0 -- "${L1B[@]}" --precision fp8 --D 0
  tc "l1b bf16 D=0" "${L1B[@]}" --D 0
  gt "l1b fp8 D=0" -- "${L1B[@]}" --precision fp8 --D 0
  if [[ -x .gpubin/bench_fp8_gemm && $(left) -gt 60 ]]; then  # more of the heuristic's algorithms
    echo "== bench_fp8_gemm --algos 32, the llama products ($(left)s left)"
    timeout 50 .gpubin/bench_fp8_gemm --algos 32 --reps 10 > $OUT/bench_fp8_gemm32.log 2>&1
    python3 - $OUT/bench_fp8_gemm32.log <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith('{"model": "llama1b"'):
        j = json.loads(line)
        if j["mode"] in ("block", "block_b", "vec128", "rowwise") and not j.get("fast_accum"):
            print(j["linear"], j["product"], j["mode"], "algos", j.get("algos"),
                  "first", j.get("tflops_first"), "best", j.get("tflops_best"))
PY
  fi
  if [[ -x .gpubin/bench_attention && $(left) -gt 100 ]]; then
    echo "== bench_attention fa3pairs, fa3dq ($(left)s left)"
    timeout $(( $(left) - 10 )) .gpubin/bench_attention --variants fa3pairs,fa3dq --hs 128,64 \
      --T 1024,2048,8192 --modes mha,gqa --repeats 10 --warmup 3 2>&1 | cut -c1-300
  fi
fi
if [[ $PART == 1 ]]; then
  if [[ $(left) -gt 230 ]]; then  # issue 50's acceptance 3, alternating with torch.compile
    echo "== bench_moe.sh, D=1, two rounds, packed masters ($(left)s left)"
    GTRON_MOE_PACKED=1 GTRON_MOE_ROUNDS=2 GTRON_MOE_D=1 GTRON_MOE_CHECK=${GTRON_MOE_CHECK:-1} \
      timeout $(( $(left) - 15 )) bash scripts/bench_moe.sh 2>&1 | tee $OUT/bench_moe.log |
      grep -v '^{"system"' | tail -12 | cut -c1-700
  fi
  gt "moe graphs full, packed" -- "${MOE[@]}" --packed-masters 1
  gt "moe graphs none, packed" -- "${MOE[@]}" --packed-masters 1 --graphs none
  gt "moe graphs full, packed, regather" GTRON_MOE_REGATHER=1 -- "${MOE[@]}" --packed-masters 1
  if [[ -x .gpubin/bench_grouped && $(left) -gt 110 ]]; then  # what bounds the grouped kernels
    echo "== ncu of the grouped wgmma kernels ($(left)s left)"
    timeout 100 ncu --clock-control none --kernel-name regex:grouped_wgmma --launch-skip 0 \
      --launch-count 20 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section Occupancy --section WarpStateStats --section LaunchStats \
      .gpubin/bench_grouped --reps 1 > $OUT/ncu_grouped.txt 2>&1
    grep -E "grouped_wgmma_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued" \
      $OUT/ncu_grouped.txt | cut -c1-150 | head -160
  fi
elif [[ $PART == 2 ]]; then
  run_test flash_fa3_bwd_cuda_test 200
  cat $OUT/flash_fa3_bwd_cuda_test.sum 2>/dev/null
  if [[ -x .gpubin/bench_attention && $(left) -gt 300 ]]; then  # issue 49: fa3dq against fa3pairs
    echo "== bench_attention fa3pairs, fa3dq ($(left)s left)"
    timeout 150 .gpubin/bench_attention --variants fa3pairs,fa3dq --hs 128,64 --T 1024,2048,8192 \
      --modes mha,gqa --repeats 10 --warmup 3 2>&1 | cut -c1-260
  fi
  if [[ -x .gpubin/bench_fp8_gemm && $(left) -gt 300 ]]; then  # issue 48: fast accumulation?
    echo "== bench_fp8_gemm, block / vec128 with and without fast accumulation ($(left)s left)"
    timeout 120 .gpubin/bench_fp8_gemm --algos 4 --reps 10 > $OUT/bench_fp8_gemm.log 2>&1
    python3 - $OUT/bench_fp8_gemm.log <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith('{"model"'):
        continue
    j = json.loads(line)
    key = (j["model"], j["linear"], j["product"])
    name = j.get("mode", "?") + ("+f" if j.get("fast_accum") else "")
    rows.setdefault(key, {})[name] = j.get("tflops_best", 0.0) if j.get("algos") else 0.0
for key, r in rows.items():
    print(" ".join(key), " ".join(f"{k} {v:.0f}" for k, v in sorted(r.items())))
PY
  fi
  for D in 0 1; do
    gt "l1b fp8 D=$D" -- "${L1B[@]}" --precision fp8 --D $D
    tc "l1b bf16 D=$D" "${L1B[@]}" --D $D
    tc "l1b fp8 rowwise D=$D" "${L1B[@]}" --D $D --fp8 rowwise
  done
  if [[ $(left) -gt 80 ]]; then  # issue 48: where the fp8 step's time goes now
    echo "== trace of the l1b fp8 step, D=0 ($(left)s left)"
    GTRON_TRACE_OUT=$OUT/trace_l1b_fp8.tsv timeout 70 bash scripts/trace_gpu.sh "${L1B[@]}" \
      --precision fp8 --D 0 2>&1 | grep -v '^{"system"' | tail -45 | cut -c1-200
    rm -f $OUT/trace_l1b_fp8.tsv
  fi
  if [[ -x .gpubin/bench_attention && $(left) -gt 250 ]]; then  # issue 49: what bounds the backward
    echo "== ncu of the FA3 attention kernels, T=8192 ($(left)s left)"
    timeout 120 ncu --clock-control none --kernel-name regex:"fa3_backward_kv|wg_backward_q|fa3_forward" \
      --launch-count 6 --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section ComputeWorkloadAnalysis .gpubin/bench_attention --variants fa3pairs --hs 128,64 \
      --T 8192 --modes mha --repeats 1 --warmup 1 > $OUT/ncu_attention.txt 2>&1
    grep -E "fa3_|wg_backward|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Executed Ipc|Stall|Warp Cycles Per Issued" \
      $OUT/ncu_attention.txt | cut -c1-150 | head -90
  fi
  if [[ -d .gpupack/parity2 && $(left) -gt 150 ]]; then
    echo "== fp8 parity, batch 32, data.seed 7, seeds 7-9 ($(left)s left)"
    timeout $(( $(left) - 10 )) env GTRON=.gpubin/gtron bash scripts/fp8_parity.sh .gpupack/parity2 \
      --jobs 6 --batch 32 --data-seed 7 --seeds "7 8 9" --out $OUT/parity 2>&1 | tail -25 | cut -c1-400
    (cd $OUT && tar czf parity.tgz parity/*.log parity/*/metrics.jsonl 2>/dev/null; rm -rf parity)
  fi
fi
echo "total $(( $(date +%s) - T0 ))s"
cd $OUT && tar czf logs.tgz *.log *.txt 2>/dev/null; rm -f *.log *.sum
