// Helpers of the flash attention GPU tests (flash_attention_cuda_test, flash_fa3_cuda_test,
// flash_fa3_bwd_cuda_test): bf16-rounded inputs held as doubles, copies to and from cuda:0, the
// problem a test runs, the flash kernels' arguments for it, the reference CUDA kernels on it and
// the normwise comparison over column ranges. Every function that touches the GPU runs on cuda:0's
// current stream; the ones returning host values synchronize it.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "model/ops/attention.h"
#include "model/ops/flash_fa3.h"
#include "model/tensor.h"
#include "tests/model/cuda_op_check.h"

// Skips the calling test without a GPU or where the FlashAttention-3-structured kernels cannot run
// at head size HS (they need compute capability 9.0).
#define GTRON_REQUIRE_FA3(HS)                                                \
  GTRON_REQUIRE_GPU();                                                       \
  if (!::gtron::cuda::flash_fa3_usable(HS)) {                                \
    GTEST_SKIP() << "flash_fa3 needs a compute-capability 9.0 GPU: skipped"; \
  }

namespace gtron::testing {

// The poison of outputs a kernel must write (and of padding it must not read).
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// n normal draws of standard deviation `stddev` from `seed`, rounded to bf16, held as doubles
// (what every side computes on).
std::vector<double> bf16_values(int64_t n, uint64_t seed, double stddev = 1.0);

// t's values, on the host, as doubles.
std::vector<double> to_host(const Tensor& t);

// v as a `dtype` tensor of `shape` on cuda:0.
Tensor to_gpu(const std::vector<double>& v, const Shape& shape, DType dtype = DType::kBF16);

// One causal self-attention problem on packed rows qkv [B, T, W]: NH query heads at column 0, then
// kv() k heads, then kv() v heads, each HS wide.
struct FlashProblem {
  int64_t B, T, NH, HS;
  int64_t NKV = 0;  // k/v heads; 0: NH (handed to the kernels' arguments as it is)
  // Document masking: [B, T] segment ids (Note [document masking] in model/ops/segments.h); empty:
  // none. Only run_reference and the callers that pass segment_ids(p) on honour it.
  std::vector<int32_t> seg;
  int64_t kv() const { return NKV > 0 ? NKV : NH; }
  int64_t C() const { return NH * HS; }               // q and output width
  int64_t KV() const { return kv() * HS; }            // k or v width
  int64_t W() const { return (NH + 2 * kv()) * HS; }  // packed qkv width
};

// "B 2 T 7 NH 2 NKV 2 HS 64" (and ", 5 documents" with segments): the problem, for failure
// messages.
std::string describe(const FlashProblem& p);

// p's segment ids on cuda:0 (int32 [B, T]); an undefined tensor without.
Tensor segment_ids(const FlashProblem& p);

// Segment ids [B, T] of documents whose lengths cycle through `lengths` (the last one cut at T),
// the same for every sequence but started `shift` positions further into the first document per
// sequence, so the boundaries fall at different places within the tiles (Note [document masking
// in the flash kernels]). Sequence 0 starts a document at 0 (shift 0 for it).
std::vector<int32_t> cycled_segments(int64_t B, int64_t T, const std::vector<int>& lengths,
                                     int shift);

// Document lengths for cycled_segments in the FlashAttention-3 kernels' tests: a boundary exactly
// on a 128-key tile edge (128, 256 and, cycled, multiples of 128), one-token documents (also two
// in a row), boundaries inside tiles, and documents longer than a tile.
std::vector<std::vector<int>> fa3_document_lengths();

// The document-masking cases the FlashAttention-3 forward and backward tests share, at head size
// HS: T 63, 1000 and 2048, each of fa3_document_lengths(), as MHA (B 2, NH 2), GQA 4:1 (B 2,
// NH 8, NKV 2) with the boundaries shifted by 37, and MQA (B 1, NH 4, NKV 1) unshifted:
// fn(problem, lengths, shift) for each.
void for_each_fa3_masked_case(
    int64_t HS, const std::function<void(const FlashProblem&, const std::vector<int>&, int)>& fn);

// The flash forward's arguments for p: q, k and v from the packed rows at `qkv` (qkv_ld wide; 0:
// W), the output rows at `out` (o_ld wide; 0: C), lse [B, NH, T]; Tq = Tk = T, scale 1/√HS. No
// segments: callers set seg and seg_batch, and change q, q_ld, q_batch or Tq for a separate q.
cuda::FlashForwardArgs flash_forward_args(const FlashProblem& p, const void* qkv, void* out,
                                          float* lse, int64_t qkv_ld = 0, int64_t o_ld = 0);

// The flash backward's arguments for p: qkv and dqkv rows qkv_ld wide (0: W), out and dout rows
// o_ld wide (0: C), the forward's lse; scale 1/√HS. accumulate, RoPE, column partials and
// segments stay at FlashBackwardArgs's defaults.
cuda::FlashBackwardArgs flash_backward_args(const FlashProblem& p, const void* qkv, const void* out,
                                            const void* dout, const float* lse, void* dqkv,
                                            int64_t qkv_ld = 0, int64_t o_ld = 0);

// What one attention run gave, as doubles: out [B, T, C], lse [B, NH, T], dqkv [B, T, W] (empty
// where no backward ran).
struct FlashResult {
  std::vector<double> out, lse, dqkv;
};

// The reference CUDA kernels (cuda::attention_gqa_forward/backward: batched GEMMs and row kernels)
// in `act` on qkv [B, T, W], with p's segments. kF32 on bf16-rounded values is the fp32 reference.
// With dout [B, T, C] the backward runs too, its gradient added to dqkv0 ([B, T, W]; empty: zeros).
FlashResult run_reference(const FlashProblem& p, DType act, const std::vector<double>& qkv,
                          const std::vector<double>& dout = {},
                          const std::vector<double>& dqkv0 = {});

// Normwise ‖got − ref‖ / ‖ref‖ over columns [c0, c1) of got's rows (got_ld wide) against ref's
// (ref_ld wide), as many rows as ref holds; NaN when got holds one there.
double rel_err(const std::vector<double>& got, int64_t got_ld, const std::vector<double>& ref,
               int64_t ref_ld, int64_t c0, int64_t c1);

// The same over every element. REQUIRES: got holds at least as many values as ref.
double rel_err(const std::vector<double>& got, const std::vector<double>& ref);

// The column ranges of q, k and v in the packed rows, named for their gradients (dq, dk, dv).
struct QkvPart {
  const char* name;
  int64_t c0, c1;
};
std::vector<QkvPart> qkv_parts(const FlashProblem& p);

}  // namespace gtron::testing
