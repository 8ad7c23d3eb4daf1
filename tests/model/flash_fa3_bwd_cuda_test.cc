// The FlashAttention-3-structured backward (cuda::flash_fa3_backward, model/ops/flash_fa3.h)
// against the fp32 reference kernels (cuda::attention_gqa_forward/backward on the same bf16
// values widened to fp32) and against the wgmma backward (flash_attention_backward on this card),
// at odd lengths, head sizes 64 and 128, with as many k/v heads as query heads and with fewer
// (GQA 4:1, MQA); the gradient poisoned with NaN first, so an element left unwritten fails;
// accumulation into an existing gradient; RoPE; strides (padded rows whose extra columns stay
// untouched); bit-identical reruns; the fa3 forward and backward together; document masking
// (Note [document masking in the FA3 backward]) up to T = 8192; the qkv-bias column partials
// (Note [qkv bias partials]); flash_attention_forward and _backward route masked calls with
// partials to the fa3 kernels under cuda::set_hopper_flash(kFa3). At T = 1 the exact dQ and dK
// are zero: there they are held to a bound from the inputs (Note [the gradient at T = 1]). GPU
// test: skipped without a GPU or where the kernels cannot run (compute capability 9.0 only).
//
// Key length above query length is not part of the backward's contract (FlashBackwardArgs has
// one T: self-attention), so it is not tested here.
//
// Bounds. Both sides compute on the same bf16 inputs; the flash side rounds P and dS to bf16
// before their products and stores dQ, dK and dV in bf16. bf16 keeps 8 significant bits, so each
// rounding moves a value by at most u = 2^-8 of itself, and by about u/√3 ≈ 2.3e-3 on average over
// a uniformly placed error (less where the value sits high in its binade). The stored gradient
// carries one such rounding and the P or dS under it another, independent, so the normwise error
// ‖got − ref‖/‖ref‖ expected against the fp32 reference is about √2 · 2.3e-3 ≈ 3e-3 (random
// inputs: the rounding errors of a sum do not line up). testing::kBF16Tol = 1e-2 holds that with
// a factor 3 of margin, while a wrong mask, tile, head or slot gives errors of order one over the
// rows it touches: one 64-key block wrong of T = 2048 is already √(64/2048) ≈ 0.18 normwise.
// Against the wgmma backward the bf16 roundings are the same ones (the same S, lse and Δ; the
// same fp32 products in the same query order), so only fp32 summation order can differ: a
// relative difference δ ≤ T·2^-24 ≈ 1.2e-4 before the final rounding flips a fraction of about
// δ/u of the stored values by one bf16 step, √(δ/u)·u ≈ 7e-4 normwise: kWgmmaTol = 2e-3. dQ comes
// from the very same query kernel on the same inputs, so it must match bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/ops/attention.h"
#include "model/ops/device_util.h"
#include "model/ops/flash_fa3.h"
#include "model/ops/rope.h"
#include "model/stream.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/flash_test_util.h"

namespace gtron {
namespace {

using Problem = testing::FlashProblem;
using testing::bf16_values;
using testing::describe;
using testing::kNaN;
using testing::qkv_parts;
using testing::QkvPart;
using testing::rel_err;
using testing::to_gpu;
using testing::to_host;

constexpr double kWgmmaTol = 2e-3;  // against the wgmma backward (derivation above)

// The inputs of one problem: packed qkv rows [B, T, W] and dout rows [B, T, C].
struct Inputs {
  std::vector<double> qkv, dout;
};

Inputs make_inputs(const Problem& p, uint64_t seed) {
  return {bf16_values(p.B * p.T * p.W(), seed), bf16_values(p.B * p.T * p.C(), seed + 1)};
}

// How one run is set up. Rows are padded by extra columns (qkv_pad on the qkv and dqkv rows,
// o_pad on the out and dout rows); padding columns of the inputs hold NaN (a kernel reading them
// poisons its result), those of dqkv NaN too (they must stay so).
struct Config {
  bool fa3 = true;              // flash_fa3_backward, or flash_attention_backward (wgmma)
  bool ordered_dq = false;      // flash_fa3_backward_dq instead of flash_fa3_backward
  bool fa3_forward = false;     // out and lse from flash_fa3_forward, or flash_attention_forward
  std::vector<double> init;     // dqkv's values before ([B, T, W]; accumulate); empty: NaN, written
  const float* rope = nullptr;  // rope_inv_freq
  int64_t qkv_pad = 0, o_pad = 0;
  // When set: col_partial requested (poisoned with NaN first), its chunks
  // [flash_column_chunks(B, T), W] returned here.
  std::vector<double>* partials = nullptr;
};

// Rows [B, T, w] widened to [B, T, ld] with `fill` in the new columns.
std::vector<double> pad_rows(const std::vector<double>& v, int64_t w, int64_t ld, double fill) {
  const int64_t rows = static_cast<int64_t>(v.size()) / w;
  std::vector<double> out(rows * ld, fill);
  for (int64_t r = 0; r < rows; ++r) std::copy_n(v.begin() + r * w, w, out.begin() + r * ld);
  return out;
}

// The flash forward, then the chosen backward, with p's segments (if any); returns dqkv rows
// [B, T, W + qkv_pad].
std::vector<double> run_flash(const Problem& p, const Inputs& in, const Config& run) {
  const int64_t C = p.C(), W = p.W(), ld = W + run.qkv_pad, o_ld = C + run.o_pad;
  Stream& s = current_stream(Device::cuda(0));
  Tensor qkv = to_gpu(pad_rows(in.qkv, W, ld, kNaN), {p.B, p.T, ld});
  Tensor dout = to_gpu(pad_rows(in.dout, C, o_ld, kNaN), {p.B, p.T, o_ld});
  const std::vector<double> init =
      run.init.empty() ? std::vector<double>(p.B * p.T * W, kNaN) : run.init;
  Tensor dqkv = to_gpu(pad_rows(init, W, ld, kNaN), {p.B, p.T, ld});
  Tensor out = to_gpu(std::vector<double>(p.B * p.T * o_ld, kNaN), {p.B, p.T, o_ld});
  Tensor lse = Tensor::empty({p.B, p.NH, p.T}, DType::kF32, Device::cuda(0), &s);
  const Tensor seg = testing::segment_ids(p);
  cuda::FlashForwardArgs f =
      testing::flash_forward_args(p, qkv.raw(), out.raw(), lse.data<float>(), ld, o_ld);
  if (seg.defined()) {
    f.seg = seg.data<int32_t>();
    f.seg_batch = p.T;
  }
  if (run.fa3_forward) {
    cuda::flash_fa3_forward(f, s.native());
  } else {
    cuda::flash_attention_forward(f, s.native());
  }

  cuda::FlashBackwardArgs b = testing::flash_backward_args(p, qkv.raw(), out.raw(), dout.raw(),
                                                           lse.data<float>(), dqkv.raw(), ld, o_ld);
  b.accumulate = !run.init.empty();
  b.rope_inv_freq = run.rope;
  b.seg = f.seg;
  b.seg_batch = f.seg_batch;
  const int64_t chunks = cuda::flash_column_chunks(p.B, p.T);
  Tensor parts;
  if (run.partials != nullptr) {
    parts = to_gpu(std::vector<double>(chunks * W, kNaN), {chunks, W}, DType::kF32);
    b.col_partial = parts.data<float>();
  }
  Tensor scratch = scratch_floats(cuda::flash_attention_backward_scratch_floats(p.B, p.T, p.NH), s);
  if (run.ordered_dq) {
    Tensor dq_scratch = scratch_bytes(cuda::flash_fa3_backward_dq_scratch_bytes(b), s);
    cuda::flash_fa3_backward_dq(b, scratch.data<float>(), dq_scratch.raw(), s.native());
  } else if (run.fa3) {
    cuda::flash_fa3_backward(b, scratch.data<float>(), s.native());
  } else {
    cuda::flash_attention_backward(b, scratch.data<float>(), s.native());
  }
  if (run.partials != nullptr) *run.partials = to_host(parts);
  return to_host(dqkv);
}

// The fp32 reference kernels on the same bf16 values: the gradient rows [B, T, W].
std::vector<double> run_reference(const Problem& p, const Inputs& in) {
  return testing::run_reference(p, DType::kF32, in.qkv, in.dout).dqkv;
}

// Elements of columns [c0, c1) that differ (NaN differs from everything).
int64_t differences(const std::vector<double>& got, int64_t got_ld, const std::vector<double>& ref,
                    int64_t ref_ld, int64_t c0, int64_t c1) {
  int64_t n = 0;
  const int64_t rows = static_cast<int64_t>(ref.size()) / ref_ld;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = c0; c < c1; ++c) n += got[r * got_ld + c] == ref[r * ref_ld + c] ? 0 : 1;
  }
  return n;
}

// fa3's gradient `got` against the wgmma backward's `wg` (same run set-up): dQ bit for bit, dK
// and dV within kWgmmaTol.
void expect_matches_wgmma(const Problem& p, const std::vector<double>& got,
                          const std::vector<double>& wg, const std::string& what) {
  const int64_t W = p.W();
  EXPECT_EQ(differences(got, W, wg, W, 0, p.C()), 0) << "dq vs wgmma, " << what;
  for (const QkvPart& part : qkv_parts(p)) {
    EXPECT_LT(rel_err(got, W, wg, W, part.c0, part.c1), kWgmmaTol)
        << part.name << " vs wgmma, " << what;  // NaN fails too
  }
}

// Note [the gradient at T = 1]
// At T = 1 each query sees one key: P = 1 and O = V, so Δ = dO·O = dO·V = dP and dS = P ⊙ (dP − Δ)
// is zero, and with it dQ and dK. The fp32 reference gets that zero exactly (its Δ is Σ P·dP over
// the one key: dP itself), so a normwise error relative to ‖ref‖ divides by zero: rel_err's floor
// of 1e-300 turned the kernels' rounding into the 1e143 of the first H100 run (sqrt(num)·1e150,
// num ~ 4e-13), while dQ matched the wgmma backward's bit for bit and dK within kWgmmaTol: the
// same values, no uninitialized memory. The flash kernels form dP on the tensor cores and Δ as a
// row sum of dO ⊙ O in another order; each is a sum of HS exact bf16 products, within
// HS·u·Σ_c|dO_c·V_c| of the exact value (u = 2^-24; 2u for the tensor cores' truncating adds), so
// |dS| ≤ 4·HS·u·Σ_c|dO_c·V_c|. Then |dQ_d| ≤ scale·|dS|·|K_d| and |dK_d| ≤ scale·Σ_h |dS_h|·|Q_h,d|
// over the key's query heads; 1.01 covers the bf16 roundings of dS and of the stored gradient
// (2^-8 each) and P's ulps. The bound is about 4·HS·u ≈ 1.5e-5 (HS 64) of the uncancelled
// scale·|dP|·‖K‖, so anything but the cancellation's rounding (a wrong tile, NaN) exceeds it.

// ‖x‖ over columns [c0, c1) of rows `ld` wide.
double part_norm(const std::vector<double>& x, int64_t ld, int64_t c0, int64_t c1) {
  double sum = 0;
  for (size_t r = 0; r < x.size() / ld; ++r)
    for (int64_t c = c0; c < c1; ++c) sum += x[r * ld + c] * x[r * ld + c];
  return std::sqrt(sum);
}

// At T = 1: dQ and dK zero in the reference and, in `got`, within Note [the gradient at T = 1]'s
// bound from the inputs.
void expect_one_key_zero(const Problem& p, const Inputs& in, const std::vector<double>& got,
                         const std::vector<double>& ref) {
  const int64_t C = p.C(), KV = p.KV(), W = p.W(), HS = p.HS, group = p.NH / p.kv();
  const double e = 1.01 * 4.0 * static_cast<double>(HS) * std::ldexp(1.0, -24) /
                   std::sqrt(static_cast<double>(HS));  // with the score scale
  double dq2 = 0, dk2 = 0;
  for (int64_t b = 0; b < p.B; ++b) {
    const double* q = &in.qkv[b * W];
    const double *k = q + C, *v = q + C + KV, *dout = &in.dout[b * C];
    for (int64_t hk = 0; hk < p.kv(); ++hk) {
      std::vector<double> dk(HS, 0.0);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        double ds = 0;
        for (int64_t c = 0; c < HS; ++c) ds += std::abs(dout[h * HS + c] * v[hk * HS + c]);
        ds *= e;
        for (int64_t d = 0; d < HS; ++d) {
          dq2 += ds * k[hk * HS + d] * ds * k[hk * HS + d];
          dk[d] += ds * std::abs(q[h * HS + d]);
        }
      }
      for (double x : dk) dk2 += x * x;
    }
  }
  const double bound[2] = {std::sqrt(dq2), std::sqrt(dk2)};
  for (int i = 0; i < 2; ++i) {
    const QkvPart part = qkv_parts(p)[i];
    EXPECT_EQ(part_norm(ref, W, part.c0, part.c1), 0.0)
        << part.name << " of the fp32 reference at T = 1, " << describe(p);
    EXPECT_LE(part_norm(got, W, part.c0, part.c1), bound[i])  // NaN fails too
        << part.name << " at T = 1 (Note [the gradient at T = 1]), " << describe(p);
  }
}

// The fa3 backward (on the wgmma forward's out and lse) against the fp32 reference and the wgmma
// backward, the gradient written over NaN.
void expect_matches_reference(const Problem& p) {
  const Inputs in = make_inputs(p, 1 + p.T + 3 * p.HS + 7 * p.NKV);
  const std::vector<double> got = run_flash(p, in, Config{});
  const std::vector<double> ref = run_reference(p, in);
  for (const QkvPart& part : qkv_parts(p)) {
    if (p.T == 1 && part.c1 <= p.C() + p.KV()) continue;  // dq, dk: zero, checked below
    EXPECT_LT(rel_err(got, p.W(), ref, p.W(), part.c0, part.c1), testing::kBF16Tol)
        << part.name << " vs fp32, " << describe(p);
  }
  if (p.T == 1) expect_one_key_zero(p, in, got, ref);
  Config wgmma;
  wgmma.fa3 = false;
  expect_matches_wgmma(p, got, run_flash(p, in, wgmma), describe(p));
}

TEST(FlashFa3BackwardCuda, MatchesReferenceAtOddLengths) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    for (int64_t T : {1, 7, 63, 129, 1000, 2048}) expect_matches_reference(Problem{2, T, 2, HS, 2});
  }
}

// Grouped-query attention, 4 query heads per k/v head (dK and dV summed over the 4 inside one
// CTA), and multi-query (one k/v head for all 4).
TEST(FlashFa3BackwardCuda, GroupedQueryMatchesReference) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    for (int64_t T : {1, 7, 63, 129, 1000, 2048}) {
      expect_matches_reference(Problem{2, T, 8, HS, 2});
      expect_matches_reference(Problem{1, T, 4, HS, 1});
    }
  }
}

// A gradient to start from: standard normal values scaled to the root mean square of each part
// (dQ, dK, dV) of `grad`, rounded to bf16.
std::vector<double> initial_gradient(const Problem& p, const std::vector<double>& grad,
                                     uint64_t seed) {
  std::vector<double> init = bf16_values(p.B * p.T * p.W(), seed);
  const int64_t rows = p.B * p.T, W = p.W();
  for (const QkvPart& part : qkv_parts(p)) {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = part.c0; c < part.c1; ++c) sum += grad[r * W + c] * grad[r * W + c];
    const double rms = std::sqrt(sum / static_cast<double>(rows * (part.c1 - part.c0)));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = part.c0; c < part.c1; ++c) {
        double& x = init[r * W + c];
        x = bf16_to_float(float_to_bf16(static_cast<float>(x * rms)));
      }
    }
  }
  return init;
}

// accumulate = true adds to the gradient that is there (values of the gradient's own size, so a
// kernel that overwrote instead would be off by order one).
TEST(FlashFa3BackwardCuda, AccumulatesIntoTheGradient) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    for (int64_t NKV : {4, 1}) {
      const Problem p{2, 300, 4, HS, NKV};
      const Inputs in = make_inputs(p, 20 + NKV);
      std::vector<double> want = run_reference(p, in);
      Config acc;
      acc.init = initial_gradient(p, want, 30 + NKV);
      const std::vector<double> got = run_flash(p, in, acc);
      for (size_t i = 0; i < want.size(); ++i) want[i] += acc.init[i];
      const std::vector<double> fresh = run_flash(p, in, Config{});
      for (const QkvPart& part : qkv_parts(p)) {
        EXPECT_LT(rel_err(got, p.W(), want, p.W(), part.c0, part.c1), testing::kBF16Tol)
            << part.name << " accumulated vs fp32, " << describe(p);
        EXPECT_GT(rel_err(fresh, p.W(), want, p.W(), part.c0, part.c1), 0.1)
            << part.name << ": the initial gradient is not negligible, " << describe(p);
      }
      acc.fa3 = false;
      expect_matches_wgmma(p, got, run_flash(p, in, acc), "accumulated, " + describe(p));
    }
  }
}

// With rope_inv_freq set, dQ and dK are rotated back before the store (Note [RoPE in the flash
// backward]): as the wgmma backward does it, and not the unrotated gradient.
TEST(FlashFa3BackwardCuda, RotatesBackWithRope) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    const Tensor inv_freq = rope_table(rope_inv_freq(HS, 10000.0), Device::cuda(0), DType::kBF16);
    for (int64_t NKV : {4, 1}) {
      const Problem p{2, 700, 4, HS, NKV};
      const Inputs in = make_inputs(p, 50 + NKV);
      Config rope;
      rope.rope = inv_freq.data<float>();
      const std::vector<double> got = run_flash(p, in, rope);
      const std::vector<double> plain = run_flash(p, in, Config{});
      const int64_t C = p.C(), W = p.W();
      EXPECT_GT(rel_err(got, W, plain, W, C, C + p.KV()), 0.1) << "dk not rotated, " << describe(p);
      EXPECT_EQ(differences(got, W, plain, W, C + p.KV(), W), 0) << "dv rotated, " << describe(p);
      rope.fa3 = false;
      expect_matches_wgmma(p, got, run_flash(p, in, rope), "rope, " + describe(p));
    }
  }
}

// Padded rows (qkv and dqkv rows W + 40 wide, out and dout rows C + 24 wide, the padding of the
// inputs NaN): the same gradient as the dense call bit for bit, and the padding of dqkv left as
// it was (NaN).
TEST(FlashFa3BackwardCuda, HonoursRowStrides) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    const Problem p{3, 200, 4, HS, 2};
    const Inputs in = make_inputs(p, 40 + HS);
    const std::vector<double> dense = run_flash(p, in, Config{});
    Config padded;
    padded.qkv_pad = 40;
    padded.o_pad = 24;
    const std::vector<double> got = run_flash(p, in, padded);
    const int64_t W = p.W(), ld = W + padded.qkv_pad;
    EXPECT_EQ(differences(got, ld, dense, W, 0, W), 0) << describe(p);
    int64_t touched = 0;
    for (int64_t r = 0; r < p.B * p.T; ++r)
      for (int64_t c = W; c < ld; ++c) touched += std::isnan(got[r * ld + c]) ? 0 : 1;
    EXPECT_EQ(touched, 0) << "columns past W written, " << describe(p);
  }
}

TEST(FlashFa3BackwardCuda, RerunsAreBitIdentical) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    for (int64_t NKV : {4, 2, 1}) {
      const Problem p{3, 1333, 4, HS, NKV};
      const Inputs in = make_inputs(p, 5 + NKV);
      const std::vector<double> a = run_flash(p, in, Config{});
      const std::vector<double> b = run_flash(p, in, Config{});
      EXPECT_EQ(differences(a, p.W(), b, p.W(), 0, p.W()), 0) << describe(p);
      EXPECT_EQ(std::count_if(a.begin(), a.end(), [](double x) { return std::isnan(x); }), 0)
          << describe(p);
    }
  }
}

// Note [ordered dQ in the FA3 backward]: flash_fa3_backward_dq's dK and dV are flash_fa3_backward's
// bit for bit (the same products, and Δ summed in the same order); its dQ, summed over key blocks
// in their fixed order, is within kWgmmaTol of flash_fa3_backward's and within the bf16 bound of
// the fp32 reference (T > 1: at T = 1 dQ is rounding noise around 0, Note [the gradient at T =
// 1]); a rerun gives the same bits; no NaN anywhere.
void expect_ordered_dq_matches(const Problem& p, const Config& base) {
  const Inputs in = make_inputs(p, 11 + p.T + 5 * p.HS + 3 * p.NKV);
  Config ordered = base;
  ordered.ordered_dq = true;
  const std::vector<double> got = run_flash(p, in, ordered);
  const std::vector<double> fa3 = run_flash(p, in, base);
  const int64_t W = p.W(), C = p.C(), ld = W + base.qkv_pad;
  EXPECT_EQ(differences(got, ld, fa3, ld, C, W), 0) << "dk, dv vs fa3, " << describe(p);
  EXPECT_EQ(std::count_if(got.begin(), got.end(),
                          [ld, W, i = int64_t{0}](double x) mutable {
                            return (i++ % ld) < W && std::isnan(x);
                          }),
            0)
      << describe(p);
  if (p.T > 1) {
    EXPECT_LT(rel_err(got, ld, fa3, ld, 0, C), kWgmmaTol) << "dq vs fa3, " << describe(p);
    if (base.init.empty() && base.rope == nullptr && base.qkv_pad == 0) {
      EXPECT_LT(rel_err(got, W, run_reference(p, in), W, 0, C), testing::kBF16Tol)
          << "dq vs fp32, " << describe(p);
    }
  }
  EXPECT_EQ(differences(run_flash(p, in, ordered), ld, got, ld, 0, W), 0)
      << "rerun, " << describe(p);
}

TEST(FlashFa3BackwardCuda, OrderedDqMatchesAtOddLengthsAndGroups) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    for (int64_t T : {1, 7, 63, 129, 1000, 2048}) {
      expect_ordered_dq_matches(Problem{2, T, 2, HS, 2}, Config{});
      expect_ordered_dq_matches(Problem{2, T, 8, HS, 2}, Config{});
      expect_ordered_dq_matches(Problem{1, T, 4, HS, 1}, Config{});
    }
  }
}

// Long walks: 64 key blocks a head add into each query tile in turn.
TEST(FlashFa3BackwardCuda, OrderedDqAtT8192) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    expect_ordered_dq_matches(Problem{1, 8192, 2, HS, 1}, Config{});
  }
}

TEST(FlashFa3BackwardCuda, OrderedDqWithRopeAccumulationAndStrides) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    const Tensor inv_freq = rope_table(rope_inv_freq(HS, 10000.0), Device::cuda(0), DType::kBF16);
    const Problem p{2, 700, 4, HS, 2};
    Config rope;
    rope.rope = inv_freq.data<float>();
    expect_ordered_dq_matches(p, rope);
    Config acc;
    acc.init = bf16_values(p.B * p.T * p.W(), 77);
    expect_ordered_dq_matches(p, acc);
    Config strides;
    strides.qkv_pad = 24;
    strides.o_pad = 40;
    expect_ordered_dq_matches(p, strides);
  }
}

// What the sweep's fa3 variant runs: the fa3 forward, then the fa3 backward on its out and lse.
TEST(FlashFa3BackwardCuda, WithTheFa3ForwardMatchesReference) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    for (int64_t T : {7, 129, 1000}) {
      for (int64_t NKV : {4, 1}) {
        const Problem p{2, T, 4, HS, NKV};
        const Inputs in = make_inputs(p, 60 + T + NKV);
        Config both;
        both.fa3_forward = true;
        const std::vector<double> got = run_flash(p, in, both);
        const std::vector<double> ref = run_reference(p, in);
        for (const QkvPart& part : qkv_parts(p)) {
          EXPECT_LT(rel_err(got, p.W(), ref, p.W(), part.c0, part.c1), testing::kBF16Tol)
              << part.name << " vs fp32 (fa3 forward), " << describe(p);
        }
      }
    }
  }
}

// The masked backward against the fp32 reference with the same segments and the wgmma backward
// (dQ, from the same query kernel, bit for bit). That the segments matter is checked too: the
// unmasked reference gradient is off by order one.
void expect_masked_matches_reference(Problem p, const std::vector<int>& lengths, int shift) {
  const Inputs in = make_inputs(p, 3 + p.T + p.HS + p.NH);
  const std::vector<double> open = run_reference(p, in);
  p.seg = testing::cycled_segments(p.B, p.T, lengths, shift);
  const std::vector<double> got = run_flash(p, in, Config{});
  const std::vector<double> ref = run_reference(p, in);
  for (const QkvPart& part : qkv_parts(p)) {
    EXPECT_LT(rel_err(got, p.W(), ref, p.W(), part.c0, part.c1), testing::kBF16Tol)
        << part.name << " vs fp32, " << describe(p);
  }
  Config wgmma;
  wgmma.fa3 = false;
  expect_matches_wgmma(p, got, run_flash(p, in, wgmma), describe(p));
  if (p.T >= 128) {
    EXPECT_GT(rel_err(got, open), 0.1)
        << "the segments change nothing: the test cannot see the mask, " << describe(p);
  }
}

TEST(FlashFa3BackwardCuda, DocumentMaskMatchesReference) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    testing::for_each_fa3_masked_case(HS, expect_masked_matches_reference);
  }
}

// A long row: boundaries at 2048 (a tile edge), 2049 (a one-token document), 3072 and 6144 (tile
// edges), so most key CTAs walk a few query tiles of a long sequence.
TEST(FlashFa3BackwardCuda, DocumentMaskAtT8192MatchesReference) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    expect_masked_matches_reference(Problem{1, 8192, 2, HS, 1}, {2048, 1, 1023, 3072, 2048}, 0);
  }
}

// Note [qkv bias partials]: each chunk of 64 rows of each sequence gets the column sums of the
// stored gradient rows, every column (dQ from the query kernel, dK and dV from the key kernel's
// two consumers; T = 129 leaves the second consumer of the last key CTA without rows). The fp32
// sum of 64 stored bf16 values is within 64·2^-24 of Σ|x| of the exact one; a chunk missed, put
// in the wrong place or summed over the wrong rows is off by far more (or NaN: the partials are
// poisoned first).
TEST(FlashFa3BackwardCuda, LeavesColumnPartialsOfTheGradient) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    for (int64_t T : {63, 129, 1000}) {
      for (int64_t NKV : {4, 1}) {
        for (bool masked : {false, true}) {
          Problem p{2, T, 4, HS, NKV};
          if (masked) p.seg = testing::cycled_segments(p.B, T, {128, 1, 127, 256, 3}, 37);
          std::vector<double> parts;
          Config run;
          run.partials = &parts;
          const std::vector<double> got = run_flash(p, make_inputs(p, 70 + T + NKV), run);
          const int64_t W = p.W(), per = (T + 63) / 64;
          int64_t bad = 0;
          for (int64_t b = 0; b < p.B; ++b) {
            for (int64_t k = 0; k < per; ++k) {
              for (int64_t c = 0; c < W; ++c) {
                double sum = 0, mag = 0;
                for (int64_t t = k * 64; t < std::min(T, k * 64 + 64); ++t) {
                  sum += got[(b * T + t) * W + c];
                  mag += std::abs(got[(b * T + t) * W + c]);
                }
                const double part = parts[(b * per + k) * W + c];
                bad += std::abs(part - sum) <= 1e-5 * mag + 1e-30 ? 0 : 1;  // NaN counts
              }
            }
          }
          EXPECT_EQ(bad, 0) << "column partials off, " << describe(p);
        }
      }
    }
  }
}

// Note [Hopper attention choice]: under set_hopper_flash(kFa3), flash_attention_forward runs the
// fa3 forward and flash_attention_backward the fa3 backward, for a call with segments and column
// partials; the routed pair gives bit for bit the direct calls' gradient and partials.
// Note [routing test]: run_flash's forward goes through flash_attention_forward, which the setting
// routes too, so `want` is the direct fa3 forward's and fa3 backward's. The first H100 run took
// `want` on the wgmma forward's out and lse instead: the routed gradient then differed in 165k of
// 1.2M elements through the forward alone. That run also showed the fa3 backward equal to the
// wgmma backward bit for bit on this problem (the same tile products, k-slices in the same order:
// Note [FlashAttention-3 backward]), so no value shows the backward's route; what sets the
// routed pair apart from the wgmma kernels' is the forward, whose key tiles (128, walked from the
// diagonal down) round out and lse otherwise than the wgmma forward's (64, walked up).
TEST(FlashFa3BackwardCuda, RoutedWithSegmentsAndPartialsWhenChosen) {
  for (int64_t HS : {64, 128}) {
    GTRON_REQUIRE_FA3(HS);
    Problem p{2, 777, 8, HS, 2};
    p.seg = testing::cycled_segments(p.B, p.T, {300, 1, 128, 200}, 37);
    const Inputs in = make_inputs(p, 80 + HS);
    std::vector<double> direct_parts, routed_parts, wgmma_parts;
    Config direct, flash;
    direct.fa3_forward = true;
    direct.partials = &direct_parts;
    const std::vector<double> want = run_flash(p, in, direct);
    flash.fa3 = false;
    flash.partials = &wgmma_parts;
    const std::vector<double> wgmma = run_flash(p, in, flash);
    flash.partials = &routed_parts;
    cuda::set_hopper_flash(cuda::HopperFlash::kFa3);
    const std::vector<double> routed = run_flash(p, in, flash);
    cuda::set_hopper_flash(cuda::HopperFlash::kWgmma);
    EXPECT_EQ(differences(routed, p.W(), want, p.W(), 0, p.W()), 0) << describe(p);
    EXPECT_EQ(routed_parts, direct_parts) << describe(p);
    EXPECT_NE(differences(wgmma, p.W(), want, p.W(), 0, p.W()), 0)
        << "the routing test cannot tell the fa3 kernels from the wgmma ones, " << describe(p);
  }
}

}  // namespace
}  // namespace gtron
