// Tune mode, GTRON_GEMM_TUNE=1: cuBLASLt's heuristic candidates timed per GEMM problem, one
// "gemm-tune {json}" line per problem on stderr (Note [pinned GEMM algorithms] in gemm_table.h;
// scripts/tune_gemm.sh collects the lines). Internal to gemm.cu.
//
// Policy: the first GEMM of a problem (an eagerly issued one: never while its stream captures)
// requests kGemmTuneCandidates results, runs each twice to warm up and then kTuneTimedCalls times
// between CUDA events on the caller's stream, and takes the median. The choice is the fastest,
// but result 0 stays unless the fastest is at least 3% faster (noise must not move a choice that
// buys nothing). The candidates run in place (C = D, as the real call does) on a scratch copy of
// C, and GELU_AUX's aux goes to scratch too (cudaMalloc'd and freed around the timing, tune mode
// only), so the caller's memory is never written; the real call then runs once with the choice.
// Timing is noisy, so a tuned run may pick differently from the next: tune mode is a measurement,
// not a way to train.
#pragma once

#include <cublasLt.h>

#include <string>

#include "model/cuda/gemm.h"
#include "model/cuda/gemm_table.h"

namespace gtron::cuda {

constexpr int kTuneTimedCalls = 10;

// GTRON_GEMM_TUNE=1 (read at the first call; 0, empty or unset: off), unless
// set_gemm_tune_for_testing said otherwise. Throws UserError on another value.
bool gemm_tune_enabled();

// One GEMM as gemm.cu issues it, minus the algorithm and the output pointers.
struct TuneCall {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;  // its aux pointer is moved to scratch and back
  cublasLtMatrixLayout_t op1 = nullptr, op2 = nullptr, out = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};

// Times results[0, count) on g's operands and prints the problem's line; returns the chosen
// index (see the policy). `result0_is_default`: whether results[0] is the algorithm a plain run
// takes (it requests one result), printed so that us0 can be trusted as today's time.
// REQUIRES: call.stream is not capturing; count >= 1.
int tune_gemm(const TuneCall& call, const GemmArgs& g, const GemmKey& key,
              const std::string& device, const cublasLtMatmulHeuristicResult_t* results, int count,
              bool result0_is_default);

// Counts one GEMM of `key` (tune mode): at exit, one "gemm-tune-calls {json}" line per key.
void count_tuned_call(const GemmKey& key);

}  // namespace gtron::cuda
