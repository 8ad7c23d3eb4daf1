// The blocked classifier (model/ops/classifier.h) against linear + the one-pass cross-entropy
// over whole logits: loss, dx and dw within bf16 GEMM tolerance for several block sizes (one
// block, equal blocks, a short last block), bit-identical reruns, zero gradient on masked rows,
// a peak of one block of logits, and where it does not apply (GPU test; skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "memory/caching_allocator.h"
#include "model/ops/classifier.h"
#include "model/ops/linear.h"
#include "model/ops/loss.h"
#include "model/stream.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

constexpr int64_t kN = 300, kC = 64, kV = 1000, kVp = 1024;

struct Outcome {
  double loss = 0;
  std::vector<double> dx, dw;
};

// Rows of GTRON_CLASSIFIER_ROWS for the scope (0: the variable unset).
class RowsEnv {
 public:
  explicit RowsEnv(int64_t rows) {
    if (rows > 0) {
      setenv("GTRON_CLASSIFIER_ROWS", std::to_string(rows).c_str(), 1);
    } else {
      unsetenv("GTRON_CLASSIFIER_ROWS");
    }
  }
  ~RowsEnv() { unsetenv("GTRON_CLASSIFIER_ROWS"); }
};

Tensor targets() {  // every 7th row masked
  std::vector<int32_t> t;
  for (int64_t i = 0; i < kN; ++i) t.push_back(i % 7 == 3 ? kMaskedTarget : (i * 37) % kV);
  return Tensor::from_ints(t, {kN});
}

Tensor gpu_bf16(const Shape& shape, uint64_t seed, double std) {
  return testing::randn_tensor(shape, seed, std).to(DType::kBF16).to(Device::cuda(0));
}

// A weight use as the bf16 weight access makes it: a bf16 value with an f32 gradient slot.
Var weight_use(const Tensor& w) {
  Var v = Var::external(w);
  v.set_grad(Tensor::zeros(w.shape(), DType::kF32, w.device()));
  return v;
}

Tensor seed_tensor(float v) {
  return Tensor::from_vector({v}, Shape{}, DType::kF32).to(Device::cuda(0));
}

// blocked: the classifier op; else linear + cross_entropy with the same promise.
Outcome run(bool blocked, const Tensor& x0, const Tensor& w0, float seed_v, double weight) {
  Var x = Var::leaf(x0);
  Var w = weight_use(w0);
  const Tensor seed = seed_tensor(seed_v);
  const KnownLossGrad known{seed, weight};
  const Tensor tg = targets().to(Device::cuda(0));
  Var loss;
  if (blocked) {
    EXPECT_TRUE(classifier_supported(x, w, &known));
    loss = classifier_cross_entropy(x, w, tg, kV, known);
  } else {
    loss = cross_entropy(linear(x, w, Var()), tg, kV, /*overwrite_logits=*/true, &known);
  }
  const Tensor dloss =
      Tensor::from_vector({seed_v * static_cast<float>(weight)}, Shape{}, DType::kF32)
          .to(Device::cuda(0));
  backward_with(loss, dloss);
  Outcome r;
  r.loss = loss.value().item();
  r.dx = x.grad().to_vector();
  r.dw = w.grad().to_vector();
  return r;
}

double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

TEST(ClassifierCuda, BlockedMatchesWholeLogitsForEveryBlocking) {
  GTRON_REQUIRE_GPU();
  const Tensor x0 = gpu_bf16({kN, kC}, 1, 1.0), w0 = gpu_bf16({kVp, kC}, 2, 0.5);
  Outcome whole;
  {
    RowsEnv env(0);
    whole = run(false, x0, w0, 0.25f, 0.4);
  }
  EXPECT_GT(whole.loss, 1.0);
  for (int64_t rows : {int64_t{128}, int64_t{100}, int64_t{150}, int64_t{4096}}) {
    RowsEnv env(rows);
    const Outcome b = run(true, x0, w0, 0.25f, 0.4);
    const std::string what = "rows " + std::to_string(rows);
    EXPECT_NEAR(b.loss, whole.loss, 1e-5 * whole.loss) << what;
    EXPECT_LT(rel_err(b.dx, whole.dx), 1e-2) << what;
    EXPECT_LT(rel_err(b.dw, whole.dw), 1e-2) << what;
    for (int64_t i = 3; i < kN; i += 7) {  // masked rows: no gradient reaches x
      for (int64_t c = 0; c < kC; ++c) ASSERT_EQ(b.dx[i * kC + c], 0.0) << what << " row " << i;
    }
  }
}

TEST(ClassifierCuda, RerunsAreBitIdentical) {
  GTRON_REQUIRE_GPU();
  RowsEnv env(128);
  const Tensor x0 = gpu_bf16({kN, kC}, 3, 1.0), w0 = gpu_bf16({kVp, kC}, 4, 0.5);
  const Outcome a = run(true, x0, w0, 1.0f, 1.0), b = run(true, x0, w0, 1.0f, 1.0);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.dw, b.dw);
}

TEST(ClassifierCuda, HoldsOneBlockOfLogits) {
  GTRON_REQUIRE_GPU();
  RowsEnv env(128);
  const Tensor x0 = gpu_bf16({kN, kC}, 5, 1.0), w0 = gpu_bf16({kVp, kC}, 6, 0.5);
  Stream& s = current_stream(Device::cuda(0));
  auto& alloc = allocator_for(Device::cuda(0));
  s.synchronize();
  const size_t before = alloc.stats().allocated;
  alloc.reset_peak();
  (void)run(true, x0, w0, 1.0f, 1.0);
  s.synchronize();
  const size_t peak = alloc.stats().peak_allocated - before;
  const size_t whole_logits = static_cast<size_t>(kN * kVp * 2);
  // One [128, Vp] block, dx, dw's slot and the small row vectors; never all N rows of logits.
  EXPECT_LT(peak, whole_logits) << "peak " << peak;
}

TEST(ClassifierCuda, AppliesOnlyWithAPromiseAndABoundWeightGradient) {
  GTRON_REQUIRE_GPU();
  RowsEnv env(0);
  const Tensor x0 = gpu_bf16({kN, kC}, 7, 1.0), w0 = gpu_bf16({kVp, kC}, 8, 0.5);
  const KnownLossGrad known{seed_tensor(1.0f), 1.0};
  Var x = Var::leaf(x0);
  EXPECT_TRUE(classifier_supported(x, weight_use(w0), &known));
  EXPECT_FALSE(classifier_supported(x, weight_use(w0), nullptr));
  EXPECT_FALSE(classifier_supported(x, Var::external(w0), &known));  // slot bound later (GTP)
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(classifier_supported(x, weight_use(w0), &known));
  }
  const Tensor xf0 = testing::randn_tensor({kN, kC}, 7).to(DType::kF32).to(Device::cuda(0));
  const Tensor wf0 = testing::randn_tensor({kVp, kC}, 8).to(DType::kF32).to(Device::cuda(0));
  EXPECT_FALSE(classifier_supported(Var::leaf(xf0), weight_use(wf0), &known));
  RowsEnv off(0);
  setenv("GTRON_CLASSIFIER_ROWS", "0", 1);
  EXPECT_FALSE(classifier_supported(x, weight_use(w0), &known));
}

}  // namespace
}  // namespace gtron
