// qk_rmsnorm on CUDA against the CPU kernels (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "model/ops/qk_norm.h"
#include "model/ops/rope.h"
#include "model/stream.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

using testing::OpCase;
using testing::ParamDtype;

OpCase qk_case(int NH, int NKV, int64_t HS, int64_t N, ParamDtype pd) {
  OpCase c;
  c.f = [NH, NKV, HS](const std::vector<Var>& in, const std::vector<Var>& p) {
    return qk_rmsnorm(in[0], NH, NKV, HS, p[0], p[1], 1e-6);
  };
  c.inputs = {testing::randn_tensor({N, (NH + 2 * NKV) * HS}, 1, 2.0)};
  c.params = {testing::randn_tensor({HS}, 2, 0.5), testing::randn_tensor({HS}, 3, 0.5)};
  c.param_dtypes = {pd, pd};
  return c;
}

TEST(QkRmsNormCuda, MatchesCpu) {
  GTRON_REQUIRE_GPU();
  // Odd sizes (HS 6: lanes idle; 130 rows: a partial chunk), MQA, GQA, and head size 128.
  for (auto [NH, NKV, HS, N] :
       {std::tuple<int, int, int64_t, int64_t>{4, 1, 6, 130}, {4, 2, 10, 37}, {2, 2, 128, 67}}) {
    testing::expect_cuda_matches_cpu(qk_case(NH, NKV, HS, N, ParamDtype::kAct), DType::kF32,
                                     testing::kF32Tol);
    testing::expect_cuda_matches_cpu(qk_case(NH, NKV, HS, N, ParamDtype::kF32), DType::kBF16,
                                     testing::kBF16Tol);
  }
}

struct QkShape {
  int NH, NKV;
  int64_t HS, N;
  std::string str() const {
    return "NH " + std::to_string(NH) + " NKV " + std::to_string(NKV) + " HS " +
           std::to_string(HS) + " N " + std::to_string(N);
  }
};

// The packed kernels (Note [packed q/k norm]): HS = 32·kPer with kPer = 1, 2, 4 and 8, GQA and
// equal heads, gamma in f32 and in the activation dtype. The fused backward's grid holds at most
// 8192 warps: up to 7200 tasks a warp has one (or none: the last block's spare warps); 8400 tasks
// of 6 heads give some warps a second task, of the other kind (8192 % 6 = 2: q then k registers);
// 20800 and 24576 tasks (the Qwen3 head layout) give every warp two or three.
TEST(QkRmsNormCuda, PackedKernelsMatchCpu) {
  GTRON_REQUIRE_GPU();
  for (const QkShape sh : {QkShape{4, 2, 64, 74},
                           {4, 4, 64, 74},
                           {4, 2, 128, 74},
                           {4, 4, 128, 74},
                           {4, 4, 128, 37},
                           {2, 1, 32, 9},
                           {2, 1, 256, 5},
                           {16, 8, 128, 300},
                           {4, 2, 128, 1400},
                           {4, 4, 64, 2600},
                           {16, 8, 128, 1024}}) {
    SCOPED_TRACE(sh.str());
    for (ParamDtype pd : {ParamDtype::kAct, ParamDtype::kF32}) {
      testing::expect_cuda_matches_cpu(qk_case(sh.NH, sh.NKV, sh.HS, sh.N, pd), DType::kF32,
                                       testing::kF32Tol);
      testing::expect_cuda_matches_cpu(qk_case(sh.NH, sh.NKV, sh.HS, sh.N, pd), DType::kBF16,
                                       testing::kBF16Tol);
    }
  }
}

// A normal draw on cuda:0 in `dt`, `skip` elements into its buffer (1: misaligned for every pack
// wider than one element, so the general kernels run).
Tensor gpu_values(const Shape& shape, uint64_t seed, double std, DType dt, int64_t skip = 0) {
  const int64_t n = shape.numel();
  std::vector<double> v = testing::randn(static_cast<size_t>(n), seed, std);
  v.insert(v.begin(), static_cast<size_t>(skip), 0.0);
  const Tensor host = Tensor::from_vector(v, Shape{n + skip}, dt);
  return host.to(Device::cuda(0)).rows(skip, n + skip).view(shape);
}

struct GpuRun {
  DType act = DType::kBF16, param = DType::kF32;
  bool dx = true, dgq = true, dgk = true;  // which gradients are asked for (else null)
  int64_t x_skip = 0, dy_skip = 0;         // misaligned x or dy
};

// y, dx, dgq, dgk of one forward + backward on cuda:0, copied to the host (undefined where a
// gradient was not asked for). Every gradient slot starts non-zero: the backward adds.
std::vector<Tensor> run_gpu(const QkShape& sh, const GpuRun& r) {
  const Shape xs{sh.N, (sh.NH + 2 * sh.NKV) * sh.HS};
  const Tensor xv = gpu_values(xs, 1, 2.0, r.act, r.x_skip);
  Var x = r.dx ? Var::leaf(xv) : Var::constant(xv);
  if (r.dx) x.set_grad(gpu_values(xs, 4, 0.1, r.act));
  auto gamma = [&](bool learns, uint64_t seed) {
    const Tensor g = gpu_values(Shape{sh.HS}, seed, 0.5, r.param);
    if (!learns) return Var::constant(g);
    Var v = Var::external(g);
    v.set_grad(gpu_values(Shape{sh.HS}, seed + 100, 0.1, DType::kF32));
    return v;
  };
  const Var gq = gamma(r.dgq, 2), gk = gamma(r.dgk, 3);
  Var y;
  Tape tape;
  {
    TapeScope scope;
    y = qk_rmsnorm(x, sh.NH, sh.NKV, sh.HS, gq, gk, 1e-6);
    tape = scope.take();
  }
  y.set_grad(gpu_values(xs, 5, 1.0, r.act, r.dy_skip));  // the view itself: backward_with copies
  run_tape(std::move(tape));
  auto host = [](bool asked, const Var& v) {
    return asked ? v.grad().to(Device::cpu()) : Tensor();
  };
  return {y.value().to(Device::cpu()), host(r.dx, x), host(r.dgq, gq), host(r.dgk, gk)};
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// ‖a − b‖ / ‖b‖ over the values.
double rel_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> u = a.to_vector(), v = b.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    num += (u[i] - v[i]) * (u[i] - v[i]);
    den += v[i] * v[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

const char* const kSlotNames[] = {"y", "dx", "dgq", "dgk"};

// Null gradient slots (dx, dgq, dgk, each alone or with another) change nothing in the others:
// the same bits as with every slot asked for, on the packed kernels (one and several tasks a
// warp) and on the general ones.
TEST(QkRmsNormCuda, NullGradientSlotsLeaveTheOthersBitIdentical) {
  GTRON_REQUIRE_GPU();
  for (const QkShape sh : {QkShape{4, 2, 128, 74}, {4, 2, 64, 1400}, {4, 1, 6, 130}}) {
    for (auto [act, param] : {std::pair<DType, DType>{DType::kBF16, DType::kF32},
                              {DType::kBF16, DType::kBF16},
                              {DType::kF32, DType::kF32}}) {
      GpuRun all;
      all.act = act;
      all.param = param;
      const std::vector<Tensor> ref = run_gpu(sh, all);
      for (int mask = 1; mask < 7; ++mask) {  // bits: dx, dgq, dgk asked for; not all, not none
        GpuRun r = all;
        r.dx = mask & 1;
        r.dgq = mask & 2;
        r.dgk = mask & 4;
        SCOPED_TRACE(sh.str() + " " + dtype_name(act) + "/" + dtype_name(param) + " slots mask " +
                     std::to_string(mask));
        const std::vector<Tensor> got = run_gpu(sh, r);
        for (size_t i = 0; i < got.size(); ++i) {
          if (!got[i].defined()) continue;
          EXPECT_TRUE(same_bytes(got[i], ref[i])) << kSlotNames[i];
        }
      }
    }
  }
}

// A misaligned x (every kernel of the forward and the backward's norm part fall back) or dy (the
// backward's norm part falls back) agrees with the aligned, packed run within the dtype's
// tolerance: the alignment checks pick a kernel that can read the pointers.
TEST(QkRmsNormCuda, MisalignedTensorsTakeTheGeneralKernels) {
  GTRON_REQUIRE_GPU();
  for (const QkShape sh : {QkShape{4, 2, 128, 74}, {4, 4, 64, 1100}}) {
    for (DType act : {DType::kBF16, DType::kF32}) {
      GpuRun aligned;
      aligned.act = act;
      aligned.param = DType::kF32;
      const std::vector<Tensor> ref = run_gpu(sh, aligned);
      const double tol = act == DType::kF32 ? testing::kF32Tol : testing::kBF16Tol;
      for (int which = 0; which < 2; ++which) {
        GpuRun r = aligned;
        (which == 0 ? r.x_skip : r.dy_skip) = 1;
        SCOPED_TRACE(sh.str() + " " + dtype_name(act) + (which == 0 ? " x" : " dy") +
                     " misaligned");
        const std::vector<Tensor> got = run_gpu(sh, r);
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_LT(rel_diff(got[i], ref[i]), tol) << kSlotNames[i];
        }
      }
    }
  }
}

// An empty dx slot is written (not zeroed, then added to): the values of adding into zeros, on
// the packed and the general kernels.
TEST(QkRmsNormCuda, EmptyDxSlotIsWritten) {
  GTRON_REQUIRE_GPU();
  for (const QkShape sh : {QkShape{16, 8, 128, 300}, {4, 2, 64, 74}, {4, 1, 6, 130}}) {
    for (DType act : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(sh.str() + " " + dtype_name(act));
      const Shape xs{sh.N, (sh.NH + 2 * sh.NKV) * sh.HS};
      std::vector<double> dx[2];
      for (int preset = 0; preset < 2; ++preset) {
        Var x = Var::leaf(gpu_values(xs, 1, 2.0, act));
        if (preset) x.set_grad(Tensor::zeros(xs, act, Device::cuda(0)));
        const Var gq = Var::constant(gpu_values(Shape{sh.HS}, 2, 0.5, DType::kF32));
        const Var gk = Var::constant(gpu_values(Shape{sh.HS}, 3, 0.5, DType::kF32));
        Var y;
        Tape tape;
        {
          TapeScope scope;
          y = qk_rmsnorm(x, sh.NH, sh.NKV, sh.HS, gq, gk, 1e-6);
          tape = scope.take();
        }
        y.set_grad(gpu_values(xs, 5, 1.0, act));
        run_tape(std::move(tape));
        dx[preset] = x.grad().to(Device::cpu()).to_vector();
      }
      EXPECT_EQ(dx[0], dx[1]);
      EXPECT_GT(rel_diff(Tensor::from_vector(dx[0], Shape{xs.numel()}, DType::kF64),
                         Tensor::zeros(Shape{xs.numel()}, DType::kF64)),
                0.5);  // not all zeros
    }
  }
}

// Note [RoPE in the q/k norm]: the fused rotation gives the bits of the norm followed by RoPE's
// in-place pass, on the packed kernels (HS = 32·kPer) and on the general ones (HS 10, and a
// misaligned x at HS 128, which rotate in RoPE's own pass), in both dtypes, several sequences,
// positions from pos0 = 5; the backward is the plain one's.
TEST(QkRmsNormCuda, FusedRopeEqualsNormThenRope) {
  GTRON_REQUIRE_GPU();
  struct Case {
    int NH, NKV;
    int64_t HS, B, T, skip;
  };
  for (const Case c : {Case{4, 2, 64, 2, 37, 0},
                       {16, 8, 128, 3, 50, 0},
                       {2, 1, 32, 1, 9, 0},
                       {2, 2, 256, 2, 5, 0},
                       {4, 1, 10, 2, 13, 0},
                       {4, 2, 128, 2, 21, 1}}) {
    for (DType act : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE("NH " + std::to_string(c.NH) + " NKV " + std::to_string(c.NKV) + " HS " +
                   std::to_string(c.HS) + " skip " + std::to_string(c.skip) + " " +
                   dtype_name(act));
      const Shape xs{c.B, c.T, (c.NH + 2 * c.NKV) * c.HS};
      const Tensor table = rope_table(rope_inv_freq(c.HS, 10000.0), Device::cuda(0), act);
      const QkNormRope rope{table, 5};
      std::vector<Tensor> out[2];  // plain then RoPE's pass, fused
      for (int fused = 0; fused < 2; ++fused) {
        Var x = Var::leaf(gpu_values(xs, 1, 2.0, act, c.skip));
        x.set_grad(gpu_values(xs, 4, 0.1, act));
        Var gq = Var::external(gpu_values(Shape{c.HS}, 2, 0.5, DType::kF32));
        Var gk = Var::external(gpu_values(Shape{c.HS}, 3, 0.5, DType::kF32));
        gq.set_grad(gpu_values(Shape{c.HS}, 102, 0.1, DType::kF32));
        gk.set_grad(gpu_values(Shape{c.HS}, 103, 0.1, DType::kF32));
        Var y;
        Tape tape;
        {
          TapeScope scope;
          y = qk_rmsnorm(x, c.NH, c.NKV, c.HS, gq, gk, 1e-6, fused ? &rope : nullptr);
          tape = scope.take();
        }
        if (!fused) {
          cuda::rope_forward_inplace(y.value().raw(), table.data<float>(), c.B, c.T, c.NH, c.NKV,
                                     c.HS, 5, act, current_stream(Device::cuda(0)).native());
        }
        y.set_grad(gpu_values(xs, 5, 1.0, act));
        run_tape(std::move(tape));
        out[fused] = {y.value().to(Device::cpu()), x.grad().to(Device::cpu()),
                      gq.grad().to(Device::cpu()), gk.grad().to(Device::cpu())};
      }
      for (size_t i = 0; i < out[0].size(); ++i) {
        EXPECT_TRUE(same_bytes(out[1][i], out[0][i])) << kSlotNames[i];
      }
      // The rotation did happen: position 5 onward turns every q/k pair by a non-zero angle.
      EXPECT_GT(
          rel_diff(out[1][0],
                   qk_rmsnorm(Var::constant(gpu_values(xs, 1, 2.0, act, c.skip)), c.NH, c.NKV, c.HS,
                              Var::constant(gpu_values(Shape{c.HS}, 2, 0.5, DType::kF32)),
                              Var::constant(gpu_values(Shape{c.HS}, 3, 0.5, DType::kF32)), 1e-6)
                       .value()
                       .to(Device::cpu())),
          1e-3);
    }
  }
}

}  // namespace
}  // namespace gtron
