// Matrix products on CUDA through cuBLASLt, stated in row-major terms (no CUDA headers here).
//
// Semantics (every matrix row-major and contiguous: its leading dimension is its column count):
//   C[M, N] = alpha · op(A) · op(B) + beta · C   (+ bias[N] added to every row, when given)
// (written into D instead when D is given: D = alpha · op(A) · op(B) + beta · C (+ bias), C only
// read, e.g. a residual added in the epilogue)
// op(A) is A[M, K], or A stored as [K, M] when trans_a; op(B) is B[K, N], or B stored as [N, K]
// when trans_b. With batch > 1, matrix i of each operand starts stride_* elements after matrix
// i − 1 (the bias is shared by the whole batch).
//
// Precision: A and B share one type `ab`.
// - ab = f32: C is f32 and the products run in true fp32 (CUBLAS_COMPUTE_32F; TF32 is never used,
//   so results match a CPU fp32 GEMM to rounding).
// - ab = bf16: C is bf16 or f32; products accumulate in fp32, beta·C is read in C's type and
//   added in fp32, the result is rounded once into C's type. f32 C with beta = 1 is the weight-
//   gradient case: bf16 activations accumulating into an fp32 main_grad.
// The bias has C's type, or is f32 with a bf16 C (bias_type; added to the fp32 accumulator before
// the one rounding into C). try_gemm reports a problem cuBLASLt has no algorithm for.
// - fp8 (GemmArgs::fp8 set; `ab` is then unused): A and B are e4m3 codes with fp32 block scales
//   (Note [fp8 recipe] and [fp8 layouts] in model/ops/fp8.h); A is [M, K] and B is stored [N, K]
//   (trans_a false, trans_b true: the reduction contiguous in both, as Hopper's FP8 products need);
//   A's scales are 1x128 tiles along K, B's 1x128 tiles or 128x128 blocks; C is bf16 or f32; no
//   epilogue, no batch. A bias is passed to cuBLASLt like any other, but whether it offers it with
//   block scales is its choice: try_gemm says (the FP8 linear adds the bias after where not).
//
// Resources: one cuBLASLt handle per device and one workspace per (device, stream), made on the
// first GEMM that needs them and kept for the life of the process; the chosen algorithm is cached
// per problem (shape, types, transposes, bias, pointer alignments). So: capture a CUDA graph only
// after an eager warm-up has run each GEMM shape on that stream once.
// Determinism: one algorithm per problem, fixed by the cache, on a private per-stream workspace:
// the same inputs give the same bits on every call. The algorithm is cuBLASLt's first heuristic
// result, or the one a committed table pins for this device and cuBLASLt version; tune mode
// (GTRON_GEMM_TUNE=1) times the candidates instead (Note [pinned GEMM algorithms] in
// gemm_table.h).
// Thread safety: gemm() may be called from several threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/dtype.h"

namespace gtron::cuda {

// Elementwise work riding in the GEMM's epilogue (bf16 C only), with aux [M, N] row-major (leading
// dimension aux_ld elements) in C's type:
//   kGeluAux: aux = acc (+ bias), C = gelu_tanh(aux)      (the MLP's up projection)
//   kDGelu:   C = acc ⊙ gelu_tanh'(aux)                   (its backward, through the down
//   projection)
enum class Epilogue { kNone, kGeluAux, kDGelu };

// FP8 operands' scale layouts (Note [fp8 layouts] in model/ops/fp8.h).
enum class Fp8Scales { kRows, kBlocks };

struct GemmArgs {
  const void* a = nullptr;  // op(A): [M, K]
  bool trans_a = false;
  const void* b = nullptr;  // op(B): [K, N]
  bool trans_b = false;
  void* c = nullptr;  // [M, N], read when beta != 0
  void* d = nullptr;  // [M, N]: where the result goes when it is not C (null: into C)
  int64_t m = 0, n = 0, k = 0;
  DType ab = DType::kF32;      // element type of A and B: f32 or bf16
  DType c_type = DType::kF32;  // f32, or bf16 when ab is bf16
  float alpha = 1.0f;
  float beta = 0.0f;
  const void* bias = nullptr;     // [N] in bias_type, or null
  DType bias_type = DType::kF32;  // c_type, or f32 with a bf16 C
  Epilogue epilogue = Epilogue::kNone;
  void* aux = nullptr;
  int64_t aux_ld = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch matrices
  // FP8 products: A and B hold e4m3 codes; scale_a (rows layout) and scale_b (b_scales layout)
  // their fp32 scales.
  bool fp8 = false;
  const float* scale_a = nullptr;
  const float* scale_b = nullptr;
  Fp8Scales b_scales = Fp8Scales::kRows;
};

// Runs the product on `stream` (a cudaStream_t) of the current device. REQUIRES: every operand
// lives on that device; k > 0 unless beta = 1 and there is no bias (then it is a no-op).
void gemm(const GemmArgs& g, void* stream);
// As gemm(), but returns false (and does nothing) when cuBLASLt offers no algorithm for the
// problem; the answer is cached per problem like the algorithm.
bool try_gemm(const GemmArgs& g, void* stream);

// The index among cuBLASLt's heuristic results that g's problem runs with on the current device;
// -1 before its first GEMM there or when cuBLASLt has no algorithm for it.
int gemm_algo_index(const GemmArgs& g);

// What a CUDA graph capture does with the small memset nodes cuBLASLt records before its GEMMs
// (Note [small memsets as kernels] in graphs/cuda_graph.h): kHoist, except where
// GTRON_CAPTURE_MEMSETS names another (read at the first use; a bad value is a UserError there)
// or a test calls set_capture_memsets_for_testing(kKeep or kKernels), the references the hoisting
// is checked against, for the process. Thread-safe (an atomic); the GEMMs issued into a capture and
// the capture's end both read it, so a test sets it outside captures.
enum class CaptureMemsets { kKeep, kKernels, kHoist, kAll };
CaptureMemsets capture_memsets_mode();
void set_capture_memsets_for_testing(CaptureMemsets mode);

// Note [private capture workspaces]
// Under kHoist a GEMM issued into a stream capture runs with a workspace of its own, exactly the
// size its algorithm asks for (at least 256 bytes, at most 1 MiB; a larger ask, or one past the
// device's 256 MiB budget for them, takes the shared workspace), carved from chunks that live as
// long as the process (a capture happens once per graph; nothing is reused, since the graph
// replays it). So the word cuBLASLt zeroes before that GEMM belongs to that GEMM alone, and the
// capture can zero it once at the start of each replay instead. The capture takes the ranges
// handed out under its capture id (cudaStreamGetCaptureInfo) when it ends.
struct WorkspaceRange {
  const void* ptr = nullptr;
  size_t bytes = 0;
};
std::vector<WorkspaceRange> take_capture_workspaces(unsigned long long capture_id);

// How many heuristic results tune mode (GTRON_GEMM_TUNE=1) requests and times per problem.
constexpr int kGemmTuneCandidates = 16;

// Test hooks (not for production code).
// Pins g's problem, on the current device and cuBLASLt version, to heuristic result `index` of
// `requested`, as a committed table entry would. REQUIRES: 0 <= index < requested; no GEMM of
// that problem has run on this device since the last reset (a choice is made once).
void pin_gemm_algo_for_testing(const GemmArgs& g, int index, int requested);
// Forgets every cached choice on every device and every entry pinned at run time.
void reset_gemm_algos_for_testing();
// Turns tune mode on or off for the problems met from now on, whatever GTRON_GEMM_TUNE says.
void set_gemm_tune_for_testing(bool on);

}  // namespace gtron::cuda
