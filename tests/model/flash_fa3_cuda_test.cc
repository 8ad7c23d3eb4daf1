// The FlashAttention-3-structured forward (model/ops/flash_fa3.h) against the fp32 reference
// kernels (cuda::attention_gqa_forward on the same bf16 values widened to fp32, as the attention
// sweep checks) and against the wgmma flash forward, at odd lengths, head sizes 64 and 128, with
// as many k/v heads as query heads and with fewer (GQA, MQA); outputs poisoned with NaN first, so
// an element left unwritten fails; strides honoured (q apart from k/v, a wider output row whose
// extra columns stay untouched); bit-identical reruns (GPU test; skipped without a GPU or where
// the kernel cannot run: it needs compute capability 9.0); flash_attention_forward routes to it
// under cuda::set_hopper_flash(kFa3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "model/ops/attention.h"
#include "model/ops/device_util.h"
#include "model/ops/flash_fa3.h"
#include "model/stream.h"
#include "tests/model/cuda_op_check.h"

namespace gtron {
namespace {

#define GTRON_REQUIRE_FA3(HS)                                                \
  GTRON_REQUIRE_GPU();                                                       \
  if (!cuda::flash_fa3_usable(HS)) {                                         \
    GTEST_SKIP() << "flash_fa3 needs a compute-capability 9.0 GPU: skipped"; \
  }

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Values rounded to bf16, held as doubles (what every side computes on).
std::vector<double> bf16_values(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = bf16_to_float(float_to_bf16(static_cast<float>(nd(rng))));
  return v;
}

std::vector<double> to_host(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::kF64).to_vector();
}

struct Problem {
  int64_t B, T, NH, HS, NKV;
  int64_t C() const { return NH * HS; }              // q and output width
  int64_t W() const { return (NH + 2 * NKV) * HS; }  // packed qkv width
};

struct Output {
  std::vector<double> out;  // [B, T, o_ld]
  std::vector<double> lse;  // [B, NH, T]
};

// Which forward runs: the FA3-structured kernel or flash_attention_forward (the wgmma kernel on
// this card).
enum class Kernel { kFa3, kFlash };

// One forward on the packed bf16 rows qkv [B, T, W]; the output rows are o_ld wide (>= C),
// poisoned with NaN first. With `separate_q`, q is copied into its own [B, T, C] tensor and read
// from there (q_ld = C) while k and v stay in the packed rows.
Output run_forward(const Problem& p, const std::vector<double>& qkv, Kernel kernel,
                   int64_t o_ld = 0, bool separate_q = false) {
  const int64_t C = p.C(), W = p.W();
  if (o_ld == 0) o_ld = C;
  Stream& s = current_stream(Device::cuda(0));
  Tensor tqkv = Tensor::from_vector(qkv, {p.B, p.T, W}, DType::kBF16).to(Device::cuda(0));
  Tensor tq;
  if (separate_q) {
    std::vector<double> q(p.B * p.T * C);
    for (int64_t r = 0; r < p.B * p.T; ++r)
      for (int64_t c = 0; c < C; ++c) q[r * C + c] = qkv[r * W + c];
    tq = Tensor::from_vector(q, {p.B, p.T, C}, DType::kBF16).to(Device::cuda(0));
  }
  Tensor out = Tensor::from_vector(std::vector<double>(p.B * p.T * o_ld, kNaN), {p.B, p.T, o_ld},
                                   DType::kBF16)
                   .to(Device::cuda(0));
  Tensor lse = Tensor::from_vector(std::vector<double>(p.B * p.NH * p.T, kNaN), {p.B, p.NH, p.T},
                                   DType::kF32)
                   .to(Device::cuda(0));
  const char* base = static_cast<const char*>(tqkv.raw());
  cuda::FlashForwardArgs a;
  a.q = separate_q ? tq.raw() : base;
  a.k = base + C * 2;
  a.v = base + (C + p.NKV * p.HS) * 2;
  a.o = out.raw();
  a.lse = lse.data<float>();
  a.q_ld = separate_q ? C : W;
  a.q_batch = p.T * a.q_ld;
  a.kv_ld = W;
  a.kv_batch = p.T * W;
  a.o_ld = o_ld;
  a.o_batch = p.T * o_ld;
  a.B = static_cast<int>(p.B);
  a.NH = static_cast<int>(p.NH);
  a.NKV = static_cast<int>(p.NKV);
  a.HS = static_cast<int>(p.HS);
  a.Tq = a.Tk = static_cast<int>(p.T);
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.HS)));
  if (kernel == Kernel::kFa3) {
    cuda::flash_fa3_forward(a, s.native());
  } else {
    cuda::flash_attention_forward(a, s.native());
  }
  return {to_host(out), to_host(lse)};
}

// The fp32 reference kernels on the same bf16 values: out [B, T, C], lse [B, NH, T].
Output run_reference(const Problem& p, const std::vector<double>& qkv) {
  Stream& s = current_stream(Device::cuda(0));
  Tensor tq = Tensor::from_vector(qkv, {p.B, p.T, p.W()}, DType::kF32).to(Device::cuda(0));
  Tensor out = Tensor::empty({p.B, p.T, p.C()}, DType::kF32, Device::cuda(0), &s);
  Tensor lse = Tensor::empty({p.B, p.NH, p.T}, DType::kF32, Device::cuda(0), &s);
  Tensor scratch = scratch_bytes(
      cuda::attention_gqa_forward_scratch_bytes(p.B, p.T, p.NH, p.NKV, p.HS, DType::kF32), s);
  cuda::attention_gqa_forward(tq.raw(), out.raw(), lse.data<float>(), scratch.raw(), p.B, p.T, p.NH,
                              p.NKV, p.HS, DType::kF32, s.native());
  return {to_host(out), to_host(lse)};
}

// Normwise ‖got − ref‖ / ‖ref‖ over columns [0, C) of got's rows (got_ld wide) against ref's
// (C wide); NaN when got holds one there.
double rel_err(const std::vector<double>& got, int64_t got_ld, const std::vector<double>& ref,
               int64_t C) {
  double num = 0, den = 0;
  const int64_t rows = static_cast<int64_t>(ref.size()) / C;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      const double d = got[r * got_ld + c] - ref[r * C + c];
      num += d * d;
      den += ref[r * C + c] * ref[r * C + c];
    }
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(a[i] - b[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

std::string describe(const Problem& p) {
  return "B " + std::to_string(p.B) + " T " + std::to_string(p.T) + " NH " + std::to_string(p.NH) +
         " NKV " + std::to_string(p.NKV) + " HS " + std::to_string(p.HS);
}

// FA3 against the fp32 reference (out within the bf16 tolerance, lse within 1e-3) and against the
// wgmma flash forward (the same bf16 roundings of P: closer still).
void expect_matches_reference(const Problem& p) {
  const auto qkv = bf16_values(p.B * p.T * p.W(), 1 + p.T + 3 * p.HS + 7 * p.NKV);
  const Output got = run_forward(p, qkv, Kernel::kFa3);
  const Output ref = run_reference(p, qkv);
  const Output flash = run_forward(p, qkv, Kernel::kFlash);
  const double err = rel_err(got.out, p.C(), ref.out, p.C());
  EXPECT_LT(err, testing::kBF16Tol) << "out vs fp32, " << describe(p);  // NaN fails too
  EXPECT_LT(max_abs_diff(got.lse, ref.lse), 1e-3) << "lse vs fp32, " << describe(p);
  EXPECT_LT(rel_err(got.out, p.C(), flash.out, p.C()), testing::kBF16Tol)
      << "out vs flash, " << describe(p);
  EXPECT_LT(max_abs_diff(got.lse, flash.lse), 1e-3) << "lse vs flash, " << describe(p);
}

TEST(FlashFa3Cuda, MatchesFp32ReferenceAtOddLengths) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    for (int64_t T : {1, 7, 63, 129, 1000, 2048}) expect_matches_reference(Problem{2, T, 2, HS, 2});
  }
}

// Grouped-query attention: 4 query heads per k/v head, and multi-query (one for all 4).
TEST(FlashFa3Cuda, GroupedQueryMatchesFp32Reference) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    for (int64_t T : {1, 7, 63, 129, 1000, 2048}) {
      expect_matches_reference(Problem{2, T, 8, HS, 2});
      expect_matches_reference(Problem{1, T, 4, HS, 1});
    }
  }
}

// q read from its own rows (q_ld = C, not the packed width) and the output written into rows
// wider than C: the same values as the packed, dense call, and the extra columns left as they
// were (NaN).
TEST(FlashFa3Cuda, HonoursRowStrides) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    const Problem p{3, 200, 4, HS, 2};
    const int64_t C = p.C(), o_ld = C + 72;
    const auto qkv = bf16_values(p.B * p.T * p.W(), 40 + HS);
    const Output dense = run_forward(p, qkv, Kernel::kFa3);
    const Output strided = run_forward(p, qkv, Kernel::kFa3, o_ld, /*separate_q=*/true);
    EXPECT_EQ(rel_err(strided.out, o_ld, dense.out, C), 0.0) << describe(p);
    EXPECT_EQ(strided.lse, dense.lse) << describe(p);
    int64_t touched = 0;
    for (int64_t r = 0; r < p.B * p.T; ++r)
      for (int64_t c = C; c < o_ld; ++c) touched += std::isnan(strided.out[r * o_ld + c]) ? 0 : 1;
    EXPECT_EQ(touched, 0) << "columns past C written, " << describe(p);
  }
}

TEST(FlashFa3Cuda, RerunsAreBitIdentical) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    for (int64_t NKV : {4, 2, 1}) {
      const Problem p{3, 1333, 4, HS, NKV};
      const auto qkv = bf16_values(p.B * p.T * p.W(), 5 + NKV);
      const Output a = run_forward(p, qkv, Kernel::kFa3);
      const Output b = run_forward(p, qkv, Kernel::kFa3);
      EXPECT_EQ(a.out, b.out) << describe(p);
      EXPECT_EQ(a.lse, b.lse) << describe(p);
      EXPECT_EQ(std::count_if(a.out.begin(), a.out.end(), [](double x) { return std::isnan(x); }),
                0)
          << describe(p);
    }
  }
}

// Note [Hopper attention choice]: with set_hopper_flash(kFa3), flash_attention_forward runs the
// FA3 kernel (bit for bit its direct call's output, which differs from the wgmma kernel's in
// summation order), and with kWgmma it is the wgmma kernel again; the setting is restored.
TEST(FlashFa3Cuda, RoutedFromFlashAttentionForwardWhenChosen) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    const Problem p{2, 777, 8, HS, 2};
    const auto qkv = bf16_values(p.B * p.T * p.W(), 90 + HS);
    const Output wgmma = run_forward(p, qkv, Kernel::kFlash);
    const Output direct = run_forward(p, qkv, Kernel::kFa3);
    cuda::set_hopper_flash(cuda::HopperFlash::kFa3);
    const Output routed = run_forward(p, qkv, Kernel::kFlash);
    cuda::set_hopper_flash(cuda::HopperFlash::kWgmma);
    const Output back = run_forward(p, qkv, Kernel::kFlash);
    EXPECT_EQ(routed.out, direct.out) << describe(p);
    EXPECT_EQ(routed.lse, direct.lse) << describe(p);
    EXPECT_EQ(back.out, wgmma.out) << describe(p);
    EXPECT_NE(direct.out, wgmma.out) << "the two kernels agree bit for bit: the routing test "
                                     << "cannot tell them apart, " << describe(p);
  }
}

}  // namespace
}  // namespace gtron
