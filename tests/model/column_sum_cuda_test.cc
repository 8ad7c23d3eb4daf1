// The one-launch column sums (Note [one-launch column finish], model/cuda/column_sum.cuh) against
// the two-launch path they replace: bias gradients (linear_backward) and the LayerNorm/RMSNorm
// parameter gradients, one-pass and fallback shapes, bit for bit; back-to-back launches on one
// stream (the counters' reset); the first use of a stream inside a CUDA graph, replayed. GPU test;
// skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "graphs/graph.h"
#include "model/cuda/column_finish.h"
#include "model/ops/device_util.h"
#include "model/ops/linear.h"
#include "model/ops/norm.h"
#include "model/stream.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

// Selects the finish path for its lifetime, then restores the previous one.
class FinishPath {
 public:
  explicit FinishPath(bool fused) : prev_(cuda::column_finish_fused()) {
    cuda::set_column_finish_fused(fused);
  }
  ~FinishPath() { cuda::set_column_finish_fused(prev_); }

 private:
  bool prev_;
};

// The bits of an f32 tensor (on any device), after the work queued on `s`.
std::vector<uint32_t> bits(const Tensor& t, Stream& s) {
  const Tensor h = t.to(Device::cpu(), &s);
  s.synchronize();
  std::vector<uint32_t> out(static_cast<size_t>(h.numel()));
  std::memcpy(out.data(), h.data<float>(), out.size() * sizeof(float));
  return out;
}

// An f32 vector on the device, from `seed` (the accumulate-into start of a gradient).
Tensor start_values(int64_t C, uint64_t seed, Stream& s) {
  return Tensor::from_vector(testing::randn(static_cast<size_t>(C), seed), {C}, DType::kF32)
      .to(s.device(), &s);
}

// db after `calls` back-to-back bias-gradient launches on `s`, starting from start_values.
std::vector<uint32_t> bias_gradient(const Tensor& dy, int64_t N, int64_t C, bool fused, int calls,
                                    Stream& s) {
  FinishPath path(fused);
  Tensor db = start_values(C, 31, s);
  Tensor scratch = scratch_floats(cuda::linear_backward_scratch_floats(N, C), s);
  for (int i = 0; i < calls; ++i) {
    cuda::linear_backward(nullptr, nullptr, dy.raw(), nullptr, nullptr, DType::kF32,
                          db.data<float>(), scratch.data<float>(), N, /*Cin=*/1, C, dy.dtype(),
                          s.native());
  }
  return bits(db, s);
}

// The widths of GPT-2's biases (3 and 12 column tiles of 256: several finishers a tile), f32's
// 128-column tiles, an odd width (one column a thread, a ragged last tile) and row counts from one
// chunk to 128.
TEST(ColumnSumCuda, OneLaunchBiasGradientIsBitIdentical) {
  GTRON_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  Stream& s = current_stream(dev);
  struct Case {
    int64_t N, C;
    DType act;
  };
  for (const Case k : {Case{16384, 768, DType::kBF16}, Case{4096, 3072, DType::kBF16},
                       Case{16384, 768, DType::kF32}, Case{5000, 67, DType::kBF16},
                       Case{100, 2304, DType::kBF16}, Case{1, 40, DType::kF32}}) {
    SCOPED_TRACE("N = " + std::to_string(k.N) + ", C = " + std::to_string(k.C) + ", " +
                 dtype_name(k.act));
    const Tensor dy = testing::randn_tensor({k.N, k.C}, 30, 1.0, DType::kF32).to(k.act).to(dev, &s);
    const std::vector<uint32_t> two = bias_gradient(dy, k.N, k.C, false, 1, s);
    const std::vector<uint32_t> one = bias_gradient(dy, k.N, k.C, true, 1, s);
    EXPECT_EQ(one, two) << "the one-launch finish changed the bits";
    EXPECT_EQ(bias_gradient(dy, k.N, k.C, true, 1, s), one) << "a rerun changed the bits";
    // Three launches queued back to back: each must find its counters reset by the one before.
    EXPECT_EQ(bias_gradient(dy, k.N, k.C, true, 3, s), bias_gradient(dy, k.N, k.C, false, 3, s));
  }
}

struct NormInputs {
  Tensor x, gamma, dy, mean, rstd;
};

// bf16 or f32 rows with f32 gamma, and the statistics of the CUDA forward.
NormInputs norm_inputs(int64_t N, int64_t C, DType act, bool ln, Stream& s) {
  const Device dev = s.device();
  NormInputs in;
  in.x = testing::randn_tensor({N, C}, 40, 2.0, DType::kF32).to(act).to(dev, &s);
  in.gamma = start_values(C, 41, s);
  in.dy = testing::randn_tensor({N, C}, 42, 1.0, DType::kF32).to(act).to(dev, &s);
  in.mean = Tensor::zeros({N}, DType::kF32, dev, &s);
  in.rstd = Tensor::zeros({N}, DType::kF32, dev, &s);
  Tensor y = Tensor::empty({N, C}, act, dev, &s);
  Tensor beta = start_values(C, 43, s);
  if (ln) {
    cuda::layernorm_forward(in.x.raw(), in.gamma.raw(), beta.raw(), DType::kF32, y.raw(),
                            in.mean.data<float>(), in.rstd.data<float>(), N, C, 1e-5, act,
                            s.native());
  } else {
    cuda::rmsnorm_forward(in.x.raw(), in.gamma.raw(), DType::kF32, y.raw(), in.rstd.data<float>(),
                          N, C, 1e-5, act, s.native());
  }
  return in;
}

// dgamma then dbeta (LN, when wanted) after `calls` back-to-back backward launches on `s`; dx
// written when with_dx.
std::vector<uint32_t> norm_gradients(const NormInputs& in, bool ln, bool want_beta, bool with_dx,
                                     bool fused, int calls, Stream& s) {
  FinishPath path(fused);
  const int64_t N = in.x.shape()[0], C = in.x.shape()[1];
  const DType act = in.x.dtype();
  Tensor dgamma = start_values(C, 44, s);
  Tensor dbeta = start_values(C, 45, s);
  Tensor dx = Tensor::zeros({N, C}, act, s.device(), &s);
  const int64_t floats = ln ? cuda::layernorm_backward_scratch_floats(N, C)
                            : cuda::rmsnorm_backward_scratch_floats(N, C);
  Tensor scratch = scratch_floats(floats, s);
  for (int i = 0; i < calls; ++i) {
    void* dxp = with_dx ? dx.raw() : nullptr;
    if (ln) {
      cuda::layernorm_backward(in.x.raw(), in.gamma.raw(), DType::kF32, in.mean.data<float>(),
                               in.rstd.data<float>(), in.dy.raw(), dxp, dgamma.data<float>(),
                               want_beta ? dbeta.data<float>() : nullptr, scratch.data<float>(), N,
                               C, act, s.native());
    } else {
      cuda::rmsnorm_backward(in.x.raw(), in.gamma.raw(), DType::kF32, in.rstd.data<float>(),
                             in.dy.raw(), dxp, dgamma.data<float>(), scratch.data<float>(), N, C,
                             act, s.native());
    }
  }
  std::vector<uint32_t> out = bits(dgamma, s);
  if (ln) {
    const std::vector<uint32_t> b = bits(dbeta, s);
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

// The one-pass kernel at GPT-2's width (256 chunks, every block of the grid in one group) and at
// C = 1000, its one-element path (C = 250), the two-pass fallback (C = 1536; f32 C = 768), a
// dbeta-free LayerNorm (a null second output) and a dx-free call.
TEST(ColumnSumCuda, OneLaunchNormGradientsAreBitIdentical) {
  GTRON_REQUIRE_GPU();
  Stream& s = current_stream(Device::cuda(0));
  struct Case {
    int64_t N, C;
    DType act;
    bool ln, want_beta, with_dx;
  };
  for (const Case k : {Case{16384, 768, DType::kBF16, true, true, true},
                       Case{16384, 768, DType::kBF16, false, false, true},
                       Case{4101, 1000, DType::kBF16, true, true, false},
                       Case{333, 250, DType::kBF16, true, false, true},
                       Case{2053, 1536, DType::kBF16, true, true, true},
                       Case{2053, 1536, DType::kBF16, false, false, true},
                       Case{1029, 768, DType::kF32, true, true, true},
                       Case{7, 64, DType::kF32, true, true, true}}) {
    SCOPED_TRACE("N = " + std::to_string(k.N) + ", C = " + std::to_string(k.C) + ", " +
                 dtype_name(k.act) + (k.ln ? " layernorm" : " rmsnorm") +
                 (k.want_beta ? "" : ", no dbeta") + (k.with_dx ? "" : ", no dx"));
    const NormInputs in = norm_inputs(k.N, k.C, k.act, k.ln, s);
    auto run = [&](bool fused, int calls) {
      return norm_gradients(in, k.ln, k.want_beta, k.with_dx, fused, calls, s);
    };
    const std::vector<uint32_t> one = run(true, 1);
    EXPECT_EQ(one, run(false, 1)) << "the one-launch finish changed the bits";
    EXPECT_EQ(run(true, 1), one) << "a rerun changed the bits";
    EXPECT_EQ(run(true, 3), run(false, 3)) << "back-to-back launches disagree";
  }
}

// A stream's first column sum inside a CUDA graph (its counters made and zeroed during the
// capture), replayed three times: each replay accumulates exactly what an eager two-launch call
// does, so the counters are back at zero after every replay.
TEST(ColumnSumCuda, OneLaunchFinishReplaysInAGraph) {
  GTRON_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  Stream& s = current_stream(dev);
  constexpr int64_t N = 16384, C = 768;
  const Tensor dy =
      testing::randn_tensor({N, C}, 50, 1.0, DType::kF32).to(DType::kBF16).to(dev, &s);
  const NormInputs in = norm_inputs(N, C, DType::kBF16, /*ln=*/true, s);
  std::vector<std::vector<uint32_t>> want;  // after 1, 2, 3 eager two-launch calls
  for (int calls = 1; calls <= 3; ++calls) {
    std::vector<uint32_t> w = bias_gradient(dy, N, C, false, calls, s);
    const std::vector<uint32_t> n = norm_gradients(in, true, true, true, false, calls, s);
    w.insert(w.end(), n.begin(), n.end());
    want.push_back(w);
  }
  FinishPath path(true);
  Stream fresh(dev);  // never used before: the capture makes its counters
  Tensor db = start_values(C, 31, s);
  Tensor dgamma = start_values(C, 44, s);
  Tensor dbeta = start_values(C, 45, s);
  Tensor dx = Tensor::zeros({N, C}, DType::kBF16, dev, &s);
  Tensor lin_scratch = scratch_floats(cuda::linear_backward_scratch_floats(N, C), s);
  Tensor ln_scratch = scratch_floats(cuda::layernorm_backward_scratch_floats(N, C), s);
  s.synchronize();
  graphs::Graph::begin_capture(fresh);
  cuda::linear_backward(nullptr, nullptr, dy.raw(), nullptr, nullptr, DType::kF32, db.data<float>(),
                        lin_scratch.data<float>(), N, 1, C, DType::kBF16, fresh.native());
  cuda::layernorm_backward(in.x.raw(), in.gamma.raw(), DType::kF32, in.mean.data<float>(),
                           in.rstd.data<float>(), in.dy.raw(), dx.raw(), dgamma.data<float>(),
                           dbeta.data<float>(), ln_scratch.data<float>(), N, C, DType::kBF16,
                           fresh.native());
  const graphs::Graph g = graphs::Graph::end_capture(fresh);
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay + 1));
    g.replay(fresh);
    fresh.synchronize();
    std::vector<uint32_t> got = bits(db, s);
    for (const Tensor* t : {&dgamma, &dbeta}) {
      const std::vector<uint32_t> b = bits(*t, s);
      got.insert(got.end(), b.begin(), b.end());
    }
    EXPECT_EQ(got, want[static_cast<size_t>(replay)]);
  }
}

}  // namespace
}  // namespace gtron
