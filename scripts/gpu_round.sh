#!/usr/bin/env bash
# One device command that checks the GPU work no GPU has run yet (FP8 and gtron's FP8 GEMM, the
# FlashAttention-3-structured kernels, MoE on CUDA, the IPC all_to_all and EP), as much of it as
# BUDGET seconds (default 560) allow:
#   1. the GPU tests, three lanes at once (correctness only: no timings while they share the
#      card), then the IPC tests alone; per test one "== NAME rc=.. Ns" line with gtest's
#      PASSED/FAILED counts and the first failure lines;
#   2. gtron bf16, fp8 and bf16 with --attention fa3 at the Llama-3.2-1B shape (bench_gpu);
#   3. bench_attention --variants plain,fa3,fa3pairs at HS 128/64, T 2048/8192.
# Here: GTRON_GPU_PACK=1 bash scripts/gpu_tests.sh fp8_cuda fp8_fused fp8_gemm flash_fa3
#   flash_attention attention_gqa moe_cuda moe_layer train_moe gpt_cuda train_documents
#   ipc_communicator ipc_ep norm_cuda swiglu_cuda gelu_cuda concat_cuda fused_mlp norm_linear
#   linear_cuda train_graphs
# There (the device tool, carrying .gpupack/gpubin.tar.xz and this script), from the repository
# root: BUDGET=540 bash scripts/gpu_round.sh. Every log goes to $OUT/logs.tgz ($OUT: the device
# tool's output folder; a new temporary folder elsewhere).
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
lane1() { run_test fp8_cuda_test 120; run_test fp8_fused_cuda_test 90; run_test fp8_gemm_cuda_test 90; run_test flash_fa3_cuda_test 150; run_test flash_fa3_bwd_cuda_test 60; run_test linear_cuda_test 60; run_test norm_linear_cuda_test 60; }
lane2() { run_test flash_attention_cuda_test 150; run_test attention_gqa_cuda_test 90; run_test train_documents_cuda_test 90; run_test norm_cuda_test 60; run_test swiglu_cuda_test 60; run_test gelu_cuda_test 60; }
lane3() { run_test moe_cuda_test 90; run_test moe_layer_cuda_test 90; run_test train_moe_cuda_test 120; run_test gpt_cuda_test 150; run_test concat_cuda_test 60; run_test fused_mlp_cuda_test 60; run_test train_graphs_cuda_test 120; }
lane1 & lane2 & lane3 & wait
for f in fp8_cuda_test fp8_fused_cuda_test fp8_gemm_cuda_test flash_fa3_cuda_test flash_fa3_bwd_cuda_test linear_cuda_test norm_linear_cuda_test flash_attention_cuda_test attention_gqa_cuda_test train_documents_cuda_test norm_cuda_test swiglu_cuda_test gelu_cuda_test moe_cuda_test moe_layer_cuda_test train_moe_cuda_test gpt_cuda_test concat_cuda_test fused_mlp_cuda_test train_graphs_cuda_test; do
  cat $OUT/$f.sum 2>/dev/null || echo "== $f no summary"
done
grep '^{' $OUT/fp8_cuda_test.log | head -5
echo "== ipc ($(left)s left)"
run_test ipc_communicator_test 90 --gtest_filter='*AllToAll*'; cat $OUT/ipc_communicator_test.sum
run_test ipc_ep_cuda_test 150; cat $OUT/ipc_ep_cuda_test.sum
# Time left: gtron bf16 against fp8 (and fa3 attention) at the Llama-3.2-1B shape, then the sweep.
L1B=(--arch llama --L 16 --C 2048 --NH 32 --NKV 8 --HS 64 --F 8192 --V 50304 --T 1024 --B 8 --steps 20 --warmup 5)
gt() {
  [[ $(left) -lt 45 ]] && { echo "== gtron $* skipped (time)"; return; }
  echo "== gtron $* ($(left)s left)"
  timeout 80 .gpubin/bench_gpu "${L1B[@]}" --graphs full --D 0 "$@" > $OUT/bench.log 2>&1
  echo "rc=$?"; tail -1 $OUT/bench.log; cat $OUT/bench.log >> $OUT/bench_all.log
}
gt --precision bf16; gt --precision fp8; gt --precision bf16 --attention fa3; gt --precision fp8 --attention fa3
if [[ $(left) -gt 60 ]]; then
  echo "== bench_attention plain,fa3 ($(left)s left)"
  timeout $(( $(left) - 10 )) .gpubin/bench_attention --variants plain,fa3,fa3pairs --hs 128,64 --T 2048,8192 --modes mha --repeats 20 > $OUT/attn.jsonl 2>$OUT/attn.err
  echo "rc=$?"; tail -2 $OUT/attn.err
  python3 -c '
import json,sys
for l in open(sys.argv[1]):
    if l.startswith("{"): print(l.strip()[:400])
' $OUT/attn.jsonl | head -12
fi
echo "total $(( $(date +%s) - T0 ))s"
cd $OUT && tar czf logs.tgz *.log *.jsonl *.err 2>/dev/null; rm -f *.log *.sum
