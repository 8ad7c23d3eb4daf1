// Flash attention (model/ops/flash_attention_cuda.cu) against the CPU kernel in f64 and against
// the reference CUDA path, at odd lengths and head sizes 64 and 128, with as many k/v heads as
// query heads (GPT-2) and with fewer (grouped-query, multi-query); key length above query length;
// bit-identical reruns; no O(T²) memory; document masking (segment ids: against the CPU and the
// reference, packed documents against each document alone, one segment against the unmasked
// kernels bit for bit) (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "model/ops/attention.h"
#include "model/ops/device_util.h"
#include "model/stream.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/flash_test_util.h"

namespace gtron {
namespace {

using Problem = testing::FlashProblem;
using Result = testing::FlashResult;
using testing::bf16_values;
using testing::qkv_parts;
using testing::QkvPart;
using testing::rel_err;
using testing::to_gpu;
using testing::to_host;

const int32_t* segments_on_host(const Problem& p) { return p.seg.empty() ? nullptr : p.seg.data(); }

// Flash forward + backward on the GPU; dqkv starts from `dqkv0` (the accumulate contract).
Result run_flash(const Problem& p, const std::vector<double>& qkv, const std::vector<double>& dout,
                 const std::vector<double>& dqkv0) {
  const int64_t C = p.C(), W = p.W();
  Stream& s = current_stream(Device::cuda(0));
  Tensor tq = to_gpu(qkv, {p.B, p.T, W});
  Tensor tdo = to_gpu(dout, {p.B, p.T, C});
  Tensor tdq = to_gpu(dqkv0, {p.B, p.T, W});
  Tensor out = Tensor::empty({p.B, p.T, C}, DType::kBF16, Device::cuda(0), &s);
  Tensor lse = Tensor::empty({p.B, p.NH, p.T}, DType::kF32, Device::cuda(0), &s);
  Tensor seg = testing::segment_ids(p);
  cuda::FlashForwardArgs fa =
      testing::flash_forward_args(p, tq.raw(), out.raw(), lse.data<float>());
  fa.seg = seg.defined() ? seg.data<int32_t>() : nullptr;
  fa.seg_batch = p.T;
  cuda::flash_attention_forward(fa, s.native());
  cuda::FlashBackwardArgs b =
      testing::flash_backward_args(p, tq.raw(), out.raw(), tdo.raw(), lse.data<float>(), tdq.raw());
  b.seg = fa.seg;
  b.seg_batch = p.T;
  Tensor scratch = scratch_floats(cuda::flash_attention_backward_scratch_floats(p.B, p.T, p.NH), s);
  cuda::flash_attention_backward(b, scratch.data<float>(), s.native());
  return {to_host(out), to_host(lse), to_host(tdq)};
}

// The CPU kernel in f64 on the same (bf16-rounded) values.
Result run_cpu_f64(const Problem& p, const std::vector<double>& qkv,
                   const std::vector<double>& dout, const std::vector<double>& dqkv0) {
  Result r;
  r.out.assign(p.B * p.T * p.C(), 0.0);
  r.lse.assign(p.B * p.NH * p.T, 0.0);
  r.dqkv = dqkv0;
  cpu::attention_gqa_forward<double>(qkv.data(), r.out.data(), r.lse.data(), p.B, p.T, p.NH, p.kv(),
                                     p.HS, segments_on_host(p));
  cpu::attention_gqa_backward<double>(qkv.data(), r.lse.data(), dout.data(), r.dqkv.data(), p.B,
                                      p.T, p.NH, p.kv(), p.HS, segments_on_host(p));
  return r;
}

void expect_close(const Result& got, const Result& ref, const Problem& p, double tol,
                  const char* what) {
  const int64_t W = p.W();
  EXPECT_LT(rel_err(got.out, ref.out), tol)
      << what << " out, T = " << p.T << " HS = " << p.HS << " NKV = " << p.kv();
  double lse_err = 0;
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    lse_err = std::max(lse_err, std::abs(got.lse[i] - ref.lse[i]));
  }
  EXPECT_LT(lse_err, 1e-3) << what << " lse, T = " << p.T << " HS = " << p.HS;
  for (const QkvPart& part : qkv_parts(p)) {
    EXPECT_LT(rel_err(got.dqkv, W, ref.dqkv, W, part.c0, part.c1), tol)
        << what << " " << part.name << ", T = " << p.T << " HS = " << p.HS << " NKV = " << p.kv();
  }
}

// The gradient slot starts from small values, so the check sees the accumulated gradient itself.
std::vector<double> grad_init(const Problem& p) { return bf16_values(p.B * p.T * p.W(), 99, 1e-3); }

// Flash forward + backward against the f64 CPU kernel and the reference CUDA path.
void expect_flash_matches(const Problem& p) {
  const auto qkv = bf16_values(p.B * p.T * p.W(), 1 + p.T + p.HS + 7 * p.kv());
  const auto dout = bf16_values(p.B * p.T * p.C(), 2 + p.T + p.HS);
  const auto g0 = grad_init(p);
  const Result flash = run_flash(p, qkv, dout, g0);
  expect_close(flash, run_cpu_f64(p, qkv, dout, g0), p, testing::kBF16Tol, "vs cpu f64");
  expect_close(flash, testing::run_reference(p, DType::kBF16, qkv, dout, g0), p, testing::kBF16Tol,
               "vs reference cuda");
}

TEST(FlashAttentionCuda, MatchesCpuF64AndReferenceAtOddLengths) {
  GTRON_REQUIRE_GPU();
  for (int64_t HS : {64, 128}) {
    for (int64_t T : {1, 7, 63, 129, 1000, 2048}) expect_flash_matches(Problem{2, T, 2, HS});
  }
}

// Grouped-query attention (Note [grouped-query flash attention]): 4 query heads per k/v head,
// and multi-query (one k/v head for all 4).
TEST(FlashAttentionCuda, GroupedQueryMatchesCpuF64AndReference) {
  GTRON_REQUIRE_GPU();
  for (int64_t HS : {64, 128}) {
    for (int64_t T : {1, 7, 129, 1000}) {
      expect_flash_matches(Problem{2, T, 8, HS, 2});
      expect_flash_matches(Problem{1, T, 4, HS, 1});
    }
  }
}

TEST(FlashAttentionCuda, RerunsAreBitIdentical) {
  GTRON_REQUIRE_GPU();
  for (int64_t HS : {64, 128}) {
    for (int64_t NKV : {4, 2, 1}) {
      const Problem p{3, 333, 4, HS, NKV};
      const auto qkv = bf16_values(p.B * p.T * p.W(), 5);
      const auto dout = bf16_values(p.B * p.T * p.C(), 6);
      const auto g0 = grad_init(p);
      const Result a = run_flash(p, qkv, dout, g0);
      const Result b = run_flash(p, qkv, dout, g0);
      EXPECT_EQ(a.out, b.out);
      EXPECT_EQ(a.lse, b.lse);
      EXPECT_EQ(a.dqkv, b.dqkv);
    }
  }
}

TEST(FlashAttentionCuda, KeyLengthAboveQueryLengthAlignsToTheLastQuery) {
  // The last Tq queries of a Tk-long causal attention, with q given separately from k and v;
  // with as many k/v heads as query heads, and with one for all three.
  GTRON_REQUIRE_GPU();
  for (int64_t HS : {64, 128}) {
    for (int64_t NKV : {3, 1}) {
      for (int64_t Tq : {1, 5, 70}) {
        const Problem full{2, 200, 3, HS, NKV};
        const int64_t C = full.C(), W = full.W();
        const auto qkv = bf16_values(full.B * full.T * W, 7 + Tq);
        const Result ref = run_cpu_f64(full, qkv, std::vector<double>(full.B * full.T * C, 0.0),
                                       std::vector<double>(full.B * full.T * W, 0.0));
        // q: its own [B, Tq, C] tensor; k, v: the packed rows of the whole sequence.
        std::vector<double> q(full.B * Tq * C);
        for (int64_t b = 0; b < full.B; ++b)
          for (int64_t t = 0; t < Tq; ++t)
            for (int64_t c = 0; c < C; ++c)
              q[(b * Tq + t) * C + c] = qkv[(b * full.T + full.T - Tq + t) * W + c];
        Stream& s = current_stream(Device::cuda(0));
        Tensor tq = to_gpu(q, {full.B, Tq, C});
        Tensor tkv = to_gpu(qkv, {full.B, full.T, W});
        Tensor out = Tensor::empty({full.B, Tq, C}, DType::kBF16, Device::cuda(0), &s);
        Tensor lse = Tensor::empty({full.B, full.NH, Tq}, DType::kF32, Device::cuda(0), &s);
        cuda::FlashForwardArgs a =
            testing::flash_forward_args(full, tkv.raw(), out.raw(), lse.data<float>());
        a.q = tq.raw();
        a.q_ld = C;
        a.q_batch = Tq * C;
        a.o_batch = Tq * C;
        a.Tq = static_cast<int>(Tq);
        cuda::flash_attention_forward(a, s.native());
        const auto got = to_host(out);
        const auto got_lse = to_host(lse);
        std::vector<double> want(got.size());
        for (int64_t b = 0; b < full.B; ++b)
          for (int64_t t = 0; t < Tq; ++t)
            for (int64_t c = 0; c < C; ++c)
              want[(b * Tq + t) * C + c] = ref.out[(b * full.T + full.T - Tq + t) * C + c];
        EXPECT_LT(rel_err(got, want), testing::kBF16Tol)
            << "Tq = " << Tq << " HS = " << HS << " NKV = " << NKV;
        for (int64_t bh = 0; bh < full.B * full.NH; ++bh)
          for (int64_t t = 0; t < Tq; ++t)
            EXPECT_NEAR(got_lse[bh * Tq + t], ref.lse[bh * full.T + full.T - Tq + t], 1e-3);
      }
    }
  }
}

TEST(FlashAttentionCuda, CausalAttentionHoldsNoQuadraticBuffer) {
  // causal_attention (which takes the flash path for bf16 at head sizes 64 and 128) forward +
  // backward at T = 4096 (8192 at head size 128, so the O(T) tensors stay as far under the
  // bound): a [T, T] fp32 score matrix alone would be 64 MiB per head at 4096; the peak stays
  // within a few copies of the O(T) tensors.
  GTRON_REQUIRE_GPU();
  for (int64_t HS : {64, 128}) {
    const int64_t B = 1, T = HS == 64 ? 4096 : 8192, NH = 2, C = NH * HS;
    ASSERT_TRUE(cuda::flash_attention_supported(HS, DType::kBF16));
    Var qkv = Var::leaf(to_gpu(bf16_values(B * T * 3 * C, 8), {B, T, 3 * C}));
    Tensor dy = to_gpu(bf16_values(B * T * C, 9), {B, T, C});
    Stream& s = current_stream(Device::cuda(0));
    auto& alloc = allocator_for(Device::cuda(0));
    s.synchronize();
    const size_t before = alloc.stats().allocated;
    alloc.reset_peak();
    {
      Var y = causal_attention(qkv, static_cast<int>(NH));
      backward_with(y, dy);
      s.synchronize();
    }
    const size_t peak = alloc.stats().peak_allocated - before;
    const size_t linear = static_cast<size_t>(B * T * 3 * C) * 2;  // one qkv-sized bf16 tensor
    EXPECT_LT(peak, 8 * linear) << "peak " << peak << " bytes for T = " << T << " HS = " << HS;
    EXPECT_LT(peak, static_cast<size_t>(T) * T * 4 / 4)  // far under one [T, T] fp32 head
        << "HS = " << HS;
  }
}

// Note [qkv bias partials] and Note [gradient column partials]: asked for, the backward leaves
// fixed-chunk column partials of the dqkv it wrote (one chunk per 64-row tile of each sequence);
// their sums equal Σ_rows dqkv; a later access of the gradient drops them; not asked for, none.
TEST(FlashAttentionCuda, BackwardLeavesColumnPartialsOfDqkv) {
  GTRON_REQUIRE_GPU();
  for (int64_t HS : {64, 128}) {
    for (int64_t T : {1, 63, 129, 1000}) {
      const int64_t B = 2, NH = 2, C = NH * HS;
      ASSERT_TRUE(cuda::flash_attention_supported(HS, DType::kBF16));
      Var qkv = Var::leaf(to_gpu(bf16_values(B * T * 3 * C, 20 + T), {B, T, 3 * C}));
      qkv.request_col_partials();
      Tensor dy = to_gpu(bf16_values(B * T * C, 30 + T), {B, T, C});
      backward_with(causal_attention(qkv, static_cast<int>(NH)), dy);
      int64_t chunks = 0;
      Tensor parts = qkv.take_col_partials(&chunks);
      ASSERT_TRUE(parts.defined()) << "HS " << HS << " T " << T;
      ASSERT_EQ(chunks, B * ((T + 63) / 64));
      const std::vector<double> p = parts.to_vector();
      ASSERT_GE(static_cast<int64_t>(p.size()), chunks * 3 * C);
      const std::vector<double> g = to_host(qkv.grad());  // also drops nothing left: taken
      for (int64_t c = 0; c < 3 * C; ++c) {
        double from_parts = 0, direct = 0, mag = 0;
        for (int64_t j = 0; j < chunks; ++j) from_parts += p[j * 3 * C + c];
        for (int64_t r = 0; r < B * T; ++r) {
          direct += g[r * 3 * C + c];
          mag += std::fabs(g[r * 3 * C + c]);
        }
        ASSERT_NEAR(from_parts, direct, 1e-5 * mag + 1e-6)
            << "HS " << HS << " T " << T << " c " << c;
      }
      // A gradient access after the write drops them; nobody asking gets none.
      Var again = Var::leaf(to_gpu(bf16_values(B * T * 3 * C, 20 + T), {B, T, 3 * C}));
      again.request_col_partials();
      backward_with(causal_attention(again, static_cast<int>(NH)), dy);
      (void)again.grad();
      EXPECT_FALSE(again.take_col_partials(&chunks).defined());
      Var plain = Var::leaf(to_gpu(bf16_values(B * T * 3 * C, 20 + T), {B, T, 3 * C}));
      backward_with(causal_attention(plain, static_cast<int>(NH)), dy);
      EXPECT_FALSE(plain.take_col_partials(&chunks).defined());
    }
  }
}

using testing::cycled_segments;  // Note [document masking in the flash kernels]

// Document lengths that put boundaries inside tiles, on them (64, 128) and one position apart
// (documents of 1 token), and a long document over many tiles.
const std::vector<std::vector<int>> kDocumentLengths = {
    {5, 1, 64, 17, 300, 1, 1, 90}, {64, 64, 128, 3}, {1000}, {2, 333, 40}};

TEST(FlashAttentionCuda, DocumentMaskMatchesCpuF64AndReference) {
  GTRON_REQUIRE_GPU();
  for (int64_t HS : {64, 128}) {
    for (int64_t T : {7, 129, 1000}) {
      for (size_t l = 0; l < kDocumentLengths.size(); ++l) {
        SCOPED_TRACE("HS " + std::to_string(HS) + " T " + std::to_string(T) + " lengths " +
                     std::to_string(l));
        for (Problem p : {Problem{1, T, 2, HS}, Problem{2, T, 4, HS, 2}, Problem{1, T, 4, HS, 1}}) {
          p.seg = cycled_segments(p.B, T, kDocumentLengths[l], 37);
          expect_flash_matches(p);
        }
      }
    }
  }
}

// Each document of a packed row, run alone through the unmasked kernels, gives the rows the
// masked kernels give it in the packed row (to bf16 rounding: the tiles fall differently).
TEST(FlashAttentionCuda, PackedDocumentsAreEachDocumentAlone) {
  GTRON_REQUIRE_GPU();
  for (int64_t HS : {64, 128}) {
    for (int64_t NKV : {4, 2, 1}) {
      const std::vector<int> docs = {70, 1, 200, 64, 129, 536};  // T = 1000
      Problem p{1, 1000, 4, HS, NKV};
      p.seg = cycled_segments(1, p.T, docs, 0);
      const int64_t C = p.C(), W = p.W();
      const auto qkv = bf16_values(p.T * W, 40 + HS + NKV);
      const auto dout = bf16_values(p.T * C, 41 + HS + NKV);
      const std::vector<double> zeros(p.T * W, 0.0);
      const Result packed = run_flash(p, qkv, dout, zeros);
      int64_t t0 = 0;
      double worst_out = 0, worst_lse = 0, worst_grad = 0;
      for (int len : docs) {
        const Problem alone{1, len, 4, HS, NKV};
        const auto cut = [&](const std::vector<double>& v, int64_t width) {
          return std::vector<double>(v.begin() + t0 * width, v.begin() + (t0 + len) * width);
        };
        const Result r =
            run_flash(alone, cut(qkv, W), cut(dout, C), std::vector<double>(len * W, 0.0));
        worst_out = std::max(worst_out, rel_err(cut(packed.out, C), r.out));
        worst_grad = std::max(worst_grad, rel_err(cut(packed.dqkv, W), r.dqkv));
        for (int64_t h = 0; h < 4; ++h) {
          for (int64_t t = 0; t < len; ++t) {
            worst_lse =
                std::max(worst_lse, std::abs(packed.lse[h * p.T + t0 + t] - r.lse[h * len + t]));
          }
        }
        t0 += len;
      }
      std::printf("HS %ld NKV %ld: packed vs alone: out %.3g, dqkv %.3g (normwise), lse %.3g\n",
                  static_cast<long>(HS), static_cast<long>(NKV), worst_out, worst_grad, worst_lse);
      EXPECT_LT(worst_out, testing::kBF16Tol);
      EXPECT_LT(worst_grad, testing::kBF16Tol);
      EXPECT_LT(worst_lse, 1e-3);
    }
  }
}

// One segment over the whole row: the masked kernels compute exactly what the unmasked ones do
// (no tile skipped, no element masked but the causal ones), bit for bit; reruns repeat.
TEST(FlashAttentionCuda, OneSegmentIsTheUnmaskedKernelBitForBit) {
  GTRON_REQUIRE_GPU();
  for (int64_t HS : {64, 128}) {
    for (int64_t NKV : {4, 1}) {
      Problem p{2, 333, 4, HS, NKV};
      const auto qkv = bf16_values(p.B * p.T * p.W(), 50);
      const auto dout = bf16_values(p.B * p.T * p.C(), 51);
      const auto g0 = grad_init(p);
      const Result open = run_flash(p, qkv, dout, g0);
      p.seg.assign(p.B * p.T, 0);
      const Result one = run_flash(p, qkv, dout, g0);
      EXPECT_EQ(one.out, open.out) << "HS " << HS << " NKV " << NKV;
      EXPECT_EQ(one.lse, open.lse) << "HS " << HS << " NKV " << NKV;
      EXPECT_EQ(one.dqkv, open.dqkv) << "HS " << HS << " NKV " << NKV;
      p.seg = cycled_segments(p.B, p.T, {50, 1, 90}, 11);
      const Result a = run_flash(p, qkv, dout, g0), b = run_flash(p, qkv, dout, g0);
      EXPECT_EQ(a.out, b.out);
      EXPECT_EQ(a.dqkv, b.dqkv);
      EXPECT_NE(a.out, open.out) << "the mask changes the output";
    }
  }
}

}  // namespace
}  // namespace gtron
