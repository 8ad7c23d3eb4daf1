// The FlashAttention-3-structured forward (model/ops/flash_fa3.h) against the fp32 reference
// kernels (cuda::attention_gqa_forward on the same bf16 values widened to fp32, as the attention
// sweep checks) and against the wgmma flash forward, at odd lengths, head sizes 64 and 128, with
// as many k/v heads as query heads and with fewer (GQA, MQA); outputs poisoned with NaN first, so
// an element left unwritten fails; strides honoured (q apart from k/v, a wider output row whose
// extra columns stay untouched); bit-identical reruns; document masking (segment ids, Note
// [document masking in the FA3 forward]) against the reference with the same segments, up to
// T = 8192 (GPU test; skipped without a GPU or where the kernel cannot run: it needs compute
// capability 9.0); flash_attention_forward routes to it under cuda::set_hopper_flash(kFa3), with
// and without segments. The persistent schedules (Note [persistent FA3 forward]) give the same
// bits as one CTA a tile at every shape checked, on the SM-count grid and on grids of 1 and 5
// CTAs (so that each CTA walks many tiles even at small shapes), and rerun bit-identically.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/ops/attention.h"
#include "model/ops/flash_fa3.h"
#include "model/stream.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/flash_test_util.h"

namespace gtron {
namespace {

using Problem = testing::FlashProblem;
using Output = testing::FlashResult;  // out and lse; no dqkv (forward only)
using testing::bf16_values;
using testing::describe;
using testing::kNaN;
using testing::rel_err;
using testing::to_gpu;
using testing::to_host;

// Which forward runs: the FA3-structured kernel or flash_attention_forward (the wgmma kernel on
// this card).
enum class Kernel { kFa3, kFlash };

// How the FA3 forward is launched (Kernel::kFa3): its schedule and grid cap.
struct Fa3Launch {
  cuda::Fa3Schedule schedule = cuda::Fa3Schedule::kTiles;
  int max_ctas = 0;  // 0: the SM count (persistent schedules)
};

// The persistent launches held to kTiles' bits: both persistent schedules on the SM-count grid
// and on grids of 1 and 5 CTAs. With few CTAs every CTA walks many work tiles of different walk
// lengths, so Q's buffer is refilled and the K/V rings' slots and phases carry across tiles
// (Note [persistent FA3 forward]) even where the problem has fewer tiles than the GPU has SMs.
std::vector<Fa3Launch> persistent_launches() {
  std::vector<Fa3Launch> out;
  for (cuda::Fa3Schedule s : {cuda::Fa3Schedule::kPersistent, cuda::Fa3Schedule::kPersistentPairs})
    for (int ctas : {0, 1, 5}) out.push_back({s, ctas});
  return out;
}

std::string describe(const Fa3Launch& l) {
  const char* name = l.schedule == cuda::Fa3Schedule::kTiles        ? "tiles"
                     : l.schedule == cuda::Fa3Schedule::kPersistent ? "persistent"
                                                                    : "persistent pairs";
  return std::string(name) + (l.max_ctas > 0 ? ", " + std::to_string(l.max_ctas) + " CTAs" : "");
}

// One forward on the packed bf16 rows qkv [B, T, W] with p's segments (if any); the output rows
// are o_ld wide (>= C), poisoned with NaN first. With `separate_q`, q is copied into its own
// [B, T, C] tensor and read from there (q_ld = C) while k and v stay in the packed rows.
Output run_forward(const Problem& p, const std::vector<double>& qkv, Kernel kernel,
                   int64_t o_ld = 0, bool separate_q = false, const Fa3Launch& launch = {}) {
  const int64_t C = p.C(), W = p.W();
  if (o_ld == 0) o_ld = C;
  Stream& s = current_stream(Device::cuda(0));
  Tensor tqkv = to_gpu(qkv, {p.B, p.T, W});
  Tensor tq;
  if (separate_q) {
    std::vector<double> q(p.B * p.T * C);
    for (int64_t r = 0; r < p.B * p.T; ++r)
      for (int64_t c = 0; c < C; ++c) q[r * C + c] = qkv[r * W + c];
    tq = to_gpu(q, {p.B, p.T, C});
  }
  Tensor out = to_gpu(std::vector<double>(p.B * p.T * o_ld, kNaN), {p.B, p.T, o_ld});
  Tensor lse = to_gpu(std::vector<double>(p.B * p.NH * p.T, kNaN), {p.B, p.NH, p.T}, DType::kF32);
  const Tensor seg = testing::segment_ids(p);
  cuda::FlashForwardArgs a =
      testing::flash_forward_args(p, tqkv.raw(), out.raw(), lse.data<float>(), W, o_ld);
  if (seg.defined()) {
    a.seg = seg.data<int32_t>();
    a.seg_batch = p.T;
  }
  if (separate_q) {
    a.q = tq.raw();
    a.q_ld = C;
    a.q_batch = p.T * C;
  }
  if (kernel == Kernel::kFa3) {
    cuda::flash_fa3_forward(a, s.native(), launch.schedule, launch.max_ctas);
  } else {
    cuda::flash_attention_forward(a, s.native());
  }
  return {to_host(out), to_host(lse), {}};
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

// The elements where a and b differ, zeros by sign too (a NaN matches a NaN: the poison of the
// columns a wide output leaves untouched).
int64_t differences(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::max(a.size(), b.size()));
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same = (a[i] == b[i] && std::signbit(a[i]) == std::signbit(b[i])) ||
                      (std::isnan(a[i]) && std::isnan(b[i]));
    n += same ? 0 : 1;
  }
  return n;
}

// FA3 against the fp32 reference (out within the bf16 tolerance, lse within 1e-3) and against the
// wgmma flash forward (the same bf16 roundings of P: closer still), on the inputs qkv; then every
// persistent launch against it, bit for bit (the same tiles' math in the same key-tile order).
void expect_matches_reference(const Problem& p, const std::vector<double>& qkv) {
  const Output got = run_forward(p, qkv, Kernel::kFa3);
  const Output ref = testing::run_reference(p, DType::kF32, qkv);  // the fp32 reference
  const Output flash = run_forward(p, qkv, Kernel::kFlash);
  const double err = rel_err(got.out, ref.out);
  EXPECT_LT(err, testing::kBF16Tol) << "out vs fp32, " << describe(p);  // NaN fails too
  EXPECT_LT(max_abs_diff(got.lse, ref.lse), 1e-3) << "lse vs fp32, " << describe(p);
  EXPECT_LT(rel_err(got.out, flash.out), testing::kBF16Tol) << "out vs flash, " << describe(p);
  EXPECT_LT(max_abs_diff(got.lse, flash.lse), 1e-3) << "lse vs flash, " << describe(p);
  for (const Fa3Launch& l : persistent_launches()) {
    const Output pers = run_forward(p, qkv, Kernel::kFa3, 0, false, l);
    EXPECT_EQ(differences(pers.out, got.out), 0)
        << "out vs one CTA a tile, " << describe(l) << ", " << describe(p);
    EXPECT_EQ(differences(pers.lse, got.lse), 0)
        << "lse vs one CTA a tile, " << describe(l) << ", " << describe(p);
  }
}

void expect_matches_reference(const Problem& p) {
  expect_matches_reference(p, bf16_values(p.B * p.T * p.W(), 1 + p.T + 3 * p.HS + 7 * p.NKV));
}

TEST(FlashFa3Cuda, MatchesFp32ReferenceAtOddLengths) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    for (int64_t T : {1, 7, 63, 129, 1000, 2048, 8192}) {
      expect_matches_reference(Problem{2, T, 2, HS, 2});
    }
  }
}

// Grouped-query attention: 4 query heads per k/v head, and multi-query (one for all 4).
TEST(FlashFa3Cuda, GroupedQueryMatchesFp32Reference) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    for (int64_t T : {1, 7, 63, 129, 1000, 2048, 8192}) {
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
    EXPECT_EQ(rel_err(strided.out, o_ld, dense.out, C, 0, C), 0.0) << describe(p);
    EXPECT_EQ(strided.lse, dense.lse) << describe(p);
    int64_t touched = 0;
    for (int64_t r = 0; r < p.B * p.T; ++r)
      for (int64_t c = C; c < o_ld; ++c) touched += std::isnan(strided.out[r * o_ld + c]) ? 0 : 1;
    EXPECT_EQ(touched, 0) << "columns past C written, " << describe(p);
    for (const Fa3Launch& l : persistent_launches()) {
      const Output pers = run_forward(p, qkv, Kernel::kFa3, o_ld, /*separate_q=*/true, l);
      EXPECT_EQ(differences(pers.out, strided.out), 0) << describe(l) << ", " << describe(p);
      EXPECT_EQ(differences(pers.lse, strided.lse), 0) << describe(l) << ", " << describe(p);
    }
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
      for (const Fa3Launch& l : persistent_launches()) {
        const Output c = run_forward(p, qkv, Kernel::kFa3, 0, false, l);
        const Output d = run_forward(p, qkv, Kernel::kFa3, 0, false, l);
        EXPECT_EQ(differences(c.out, d.out), 0) << "rerun, " << describe(l) << ", " << describe(p);
        EXPECT_EQ(differences(c.lse, d.lse), 0) << "rerun, " << describe(l) << ", " << describe(p);
        EXPECT_EQ(differences(c.out, a.out), 0) << describe(l) << ", " << describe(p);
      }
    }
  }
}

// The masked forward (Note [document masking in the FA3 forward]) against the fp32 reference with
// the same segments (and the wgmma forward): every row attends within its document only. That the
// segments matter is checked too: the unmasked output is off by order one.
void expect_masked_matches_reference(Problem p, const std::vector<int>& lengths, int shift) {
  const auto qkv = bf16_values(p.B * p.T * p.W(), 11 + p.T + p.HS + p.NH);
  const Output open = testing::run_reference(p, DType::kF32, qkv);
  p.seg = testing::cycled_segments(p.B, p.T, lengths, shift);
  expect_matches_reference(p, qkv);
  if (p.T >= 128) {
    EXPECT_GT(rel_err(run_forward(p, qkv, Kernel::kFa3).out, open.out), 0.1)
        << "the segments change nothing: the test cannot see the mask, " << describe(p);
  }
}

TEST(FlashFa3Cuda, DocumentMaskMatchesFp32Reference) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    testing::for_each_fa3_masked_case(HS, expect_masked_matches_reference);
  }
}

// A long row: boundaries at 2048 (a tile edge), 2049 (a one-token document), 3072 and 6144 (tile
// edges), so most CTAs skip most key tiles.
TEST(FlashFa3Cuda, DocumentMaskAtT8192MatchesFp32Reference) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    expect_masked_matches_reference(Problem{1, 8192, 2, HS, 1}, {2048, 1, 1023, 3072, 2048}, 0);
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

// The same with document masking, which the FA3 forward now takes: routed to it under kFa3.
TEST(FlashFa3Cuda, RoutedWithDocumentMaskingWhenChosen) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    Problem p{2, 777, 8, HS, 2};
    p.seg = testing::cycled_segments(p.B, p.T, {300, 1, 128, 200}, 37);
    const auto qkv = bf16_values(p.B * p.T * p.W(), 91 + HS);
    const Output wgmma = run_forward(p, qkv, Kernel::kFlash);
    const Output direct = run_forward(p, qkv, Kernel::kFa3);
    cuda::set_hopper_flash(cuda::HopperFlash::kFa3);
    const Output routed = run_forward(p, qkv, Kernel::kFlash);
    cuda::set_hopper_flash(cuda::HopperFlash::kWgmma);
    EXPECT_EQ(routed.out, direct.out) << describe(p);
    EXPECT_EQ(routed.lse, direct.lse) << describe(p);
    EXPECT_NE(direct.out, wgmma.out)
        << "the routing test cannot tell the kernels apart, " << describe(p);
  }
}

}  // namespace
}  // namespace gtron
