#!/usr/bin/env bash
# One device command for the GPU work no GPU has run yet, and the speed lines issue 48 still needs,
# as much of it as BUDGET seconds (default 560) allow, most important first:
#   1. the tests of the unverified CUDA code, three lanes at once (correctness only):
#      fp8_fused_cuda_test (SwiGLU's backward writing its gradient's FP8 codes), fp8_cuda_test,
#      train_moe_cuda_test (a graph of 64 experts), gpt_cuda_test, train_graphs_cuda_test;
#      per test one "== NAME rc=.. Ns" line with gtest's counts and the first failure lines;
#   2. gtron fp8 against torch.compile bf16 at the Llama-3.2-1B shape, alternating, D=0 then D=1;
#   3. the FP8 GEMM tune (scripts/tune_gemm.sh --only-llama --precision fp8 --sustain 50), then
#      gtron fp8 with the tuned table (GTRON_GEMM_TABLE_FILE) against without, at the same shape;
#   4. Qwen3-0.6B and GPT-2 1.5B shapes: gtron fp8 against torch.compile bf16 (GPT-2 1.5B with
#      GTRON_FP8_UNTILED=1: its C = 1600 has tail tiles, Note [fp8 untiled sizes]);
#   5. bench_gpu at the Qwen3-MoE shape with graphs full (the instantiation error, if it fails,
#      says what the graph held), and with GTRON_CAPTURE_MEMSETS=keep;
#   6. scripts/bench_fp8.sh's IPC layouts (fp8 GTP=2, TP=2 x GTP=2 against one process, with the
#      bound from one process's fp8 against bf16) and the gathered bytes a step.
# Here: GTRON_GPU_PACK=1 bash scripts/gpu_tests.sh fp8 train_moe gpt_cuda train_graphs
# There (the device tool, carrying .gpupack/gpubin.tar.xz), from the repository root:
#   BUDGET=560 bash scripts/gpu_round.sh
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
lane1() { run_test fp8_fused_cuda_test 90; run_test fp8_cuda_test 100 --gtest_filter=-*LlamaShapesTimed*; }
lane2() { run_test train_moe_cuda_test 150; }
lane3() { run_test gpt_cuda_test 150; run_test train_graphs_cuda_test 80; }
lane1 & lane2 & lane3 & wait
for f in fp8_fused_cuda_test fp8_cuda_test train_moe_cuda_test gpt_cuda_test train_graphs_cuda_test; do
  cat $OUT/$f.sum 2>/dev/null || echo "== $f no summary"
done
L1B=(--arch llama --L 16 --C 2048 --NH 32 --NKV 8 --HS 64 --F 8192 --V 50304 --T 1024 --B 8 --steps 20 --warmup 5)
QWEN=(--arch llama --L 28 --C 1024 --NH 16 --NKV 8 --HS 128 --F 3072 --qk-norm 1 --rope-theta 1000000 --V 50304 --T 1024 --B 8 --steps 20 --warmup 5)
GPT15=(--arch gpt2 --L 48 --C 1600 --NH 25 --V 50304 --T 1024 --B 8 --steps 10 --warmup 3)
gt() {  # NAME ENV... -- FLAGS...: one bench_gpu line
  local name=$1; shift
  local envs=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do envs+=("$1"); shift; done
  shift
  [[ $(left) -lt 45 ]] && { echo "== $name skipped (time)"; return; }
  echo "== gtron $name ($(left)s left)"
  env "${envs[@]}" timeout 90 .gpubin/bench_gpu --graphs full "$@" 2>&1 | tail -1 | cut -c1-300
}
tc() {  # NAME FLAGS...: one torch.compile bf16 line
  local name=$1; shift
  [[ $(left) -lt 120 ]] && { echo "== torch $name skipped (time)"; return; }
  echo "== torch.compile $name ($(left)s left)"
  timeout 200 python3 scripts/bench_torch.py --mode compile "$@" 2>&1 | tail -1 | cut -c1-260
}
for d in 0 1; do
  gt "l1b fp8 D=$d" -- "${L1B[@]}" --precision fp8 --D $d
  tc "l1b bf16 D=$d" "${L1B[@]}" --D $d
done
if [[ $(left) -gt 200 ]]; then
  echo "== tune fp8 GEMMs ($(left)s left)"
  timeout 150 bash scripts/tune_gemm.sh --only-llama --precision fp8 --sustain 50 \
    --table-out $OUT/fp8_table.txt > $OUT/tune.log 2>&1
  echo "rc=$?"; grep tune_summary $OUT/tune.log | cut -c1-400
  gt "l1b fp8 tuned" GTRON_GEMM_TABLE_FILE=$OUT/fp8_table.txt -- "${L1B[@]}" --precision fp8 --D 0
  gt "l1b fp8 untuned" -- "${L1B[@]}" --precision fp8 --D 0
fi
gt "qwen fp8" -- "${QWEN[@]}" --precision fp8 --D 0
tc "qwen bf16" "${QWEN[@]}" --D 0
gt "gpt2-1.5b fp8 (untiled sizes)" GTRON_FP8_UNTILED=1 -- "${GPT15[@]}" --precision fp8 --D 0
tc "gpt2-1.5b bf16" "${GPT15[@]}" --D 0
MOE=(--arch llama --L 12 --C 2048 --NH 16 --NKV 4 --HS 128 --F 6144 --qk-norm 1 --rope-theta 1000000
  --tied 1 --V 50304 --T 1024 --B 4 --moe-experts 64 --moe-top-k 8 --moe-width 768
  --moe-router softmax --moe-norm-topk 1 --steps 10 --warmup 3 --D 1)
gt "moe graphs full" -- "${MOE[@]}"
gt "moe graphs full, memsets kept" GTRON_CAPTURE_MEMSETS=keep -- "${MOE[@]}"
if [[ $(left) -gt 60 ]]; then
  echo "== fp8 over IPC ($(left)s left)"
  sed -n '/^S=(/,/^PY$/p' scripts/bench_fp8.sh > $OUT/ipc.sh
  timeout $(( $(left) - 5 )) bash -c "bin=.gpubin; $(cat $OUT/ipc.sh)"
fi
echo "total $(( $(date +%s) - T0 ))s"
cd $OUT && tar czf logs.tgz *.log *.txt 2>/dev/null; rm -f *.log *.sum
