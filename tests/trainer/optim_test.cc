#include <gtest/gtest.h>

#include <cmath>

#include "parallel/ddp.h"
#include "parallel/self_communicator.h"
#include "trainer/optimizer.h"
#include "trainer/schedule.h"

namespace gtron {
namespace {

// Runs AdamW over the single-process DataParallel layout of `params`.
struct Harness {
  parallel::SelfCommunicator comm;
  parallel::DataParallel dp;
  AdamW opt;
  Harness(std::vector<Parameter*> params, std::unordered_set<const Parameter*> decayed,
          AdamWHyper h)
      : dp(params, &comm, parallel::DdpOptions{}), opt(dp.owned_numel(), decayed, h) {}
  // Reduces the gradients (trivially, one rank) and returns their global norm.
  double reduce() {
    dp.finish_grads();
    return std::sqrt(dp.grad_square_sum());
  }
  void step(double lr, float scale = 1.f) {
    opt.step(dp.owned(), lr, scale);
    dp.after_update();
  }
};

TEST(AdamW, FirstStepByHand) {
  // At t=1 the bias-corrected m/sqrt(v) is g/|g| = sign(g): w -= lr·(sign(g) + wd·w).
  Parameter a("a", Tensor::from_vector({1.0, -2.0}, {2}, DType::kF32));
  Parameter b("b", Tensor::from_vector({3.0}, {1}, DType::kF32), false);
  AdamWHyper h;
  h.weight_decay = 0.1;
  h.eps = 0;
  Harness hs({&a, &b}, {&a}, h);
  a.main_grad.copy_from(Tensor::from_vector({0.5, -4.0}, {2}, DType::kF32));
  b.main_grad.copy_from(Tensor::from_vector({2.0}, {1}, DType::kF32));
  EXPECT_NEAR(hs.reduce(), std::sqrt(0.25 + 16 + 4), 1e-6);
  hs.step(0.01);
  auto av = a.data.to_vector();
  EXPECT_NEAR(av[0], 1.0 - 0.01 * (1 + 0.1 * 1.0), 1e-6);
  EXPECT_NEAR(av[1], -2.0 - 0.01 * (-1 + 0.1 * -2.0), 1e-6);
  EXPECT_NEAR(b.data.item(), 3.0 - 0.01 * 1.0, 1e-6);  // no decay on b
  EXPECT_EQ(hs.opt.steps_taken(), 1);
}

TEST(AdamW, SecondStepMomentsByHand) {
  Parameter a("a", Tensor::from_vector({0.0}, {1}, DType::kF32));
  AdamWHyper h;
  h.weight_decay = 0;
  h.eps = 0;
  Harness hs({&a}, {&a}, h);
  a.main_grad.copy_from(Tensor::from_vector({1.0}, {1}, DType::kF32));
  hs.reduce();
  hs.step(1.0);
  a.main_grad.copy_from(Tensor::from_vector({3.0}, {1}, DType::kF32));
  hs.reduce();
  hs.step(1.0);
  const double m = 0.9 * 0.1 + 0.1 * 3, v = 0.95 * 0.05 + 0.05 * 9;
  const double mh = m / (1 - 0.81), vh = v / (1 - 0.9025);
  EXPECT_NEAR(a.data.item(), -1.0 - mh / std::sqrt(vh), 1e-5);
}

TEST(AdamW, ClippingScalesGradients) {
  // The clipped gradient enters the first moment: m = (1-β1)·g·clip/norm.
  Parameter a("a", Tensor::from_vector({0.0, 0.0}, {2}, DType::kF32));
  Harness hs({&a}, {}, AdamWHyper{});
  a.main_grad.copy_from(Tensor::from_vector({3.0, 4.0}, {2}, DType::kF32));
  const double norm = hs.reduce();
  EXPECT_NEAR(norm, 5.0, 1e-6);
  hs.step(0.1, clip_scale(norm, 1.0));
  auto m = hs.opt.m().to_vector();
  EXPECT_NEAR(m[0], 0.1 * 3.0 / 5.0, 1e-6);
  EXPECT_NEAR(m[1], 0.1 * 4.0 / 5.0, 1e-6);
  EXPECT_EQ(clip_scale(0.5, 1.0), 1.f);
  EXPECT_EQ(clip_scale(5.0, 0.0), 1.f);
}

TEST(Schedule, WarmupCosineLinearConstantWSD) {
  Schedule s;
  s.lr = 1.0;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // cosine midpoint: (1 + 0.1) / 2
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  s.kind = ScheduleKind::kLinear;
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);
  EXPECT_NEAR(s.at(35), 1.0 - 0.9 * 0.25, 1e-12);
  s.kind = ScheduleKind::kConstant;
  EXPECT_DOUBLE_EQ(s.at(100), 1.0);
  s.kind = ScheduleKind::kWsd;
  s.wsd_decay_fraction = 0.2;  // decay over the last 22 steps: [88, 110)
  EXPECT_DOUBLE_EQ(s.at(87), 1.0);
  EXPECT_LT(s.at(88), 1.0);
  EXPECT_NEAR(s.at(109), 0.1, 1e-12);
}

}  // namespace
}  // namespace gtron
