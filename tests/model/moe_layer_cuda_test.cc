// The mixture-of-experts layer (model/moe.h, Note [MoE on CUDA]) and a tiny MoE llama on CUDA
// against the CPU (GPU test; skipped without a GPU): the layer's output, input gradient, every
// parameter gradient, balance loss and load in fp32 (1e-5) and in bf16 mixed precision (bf16
// shadows, bf16 rows, fp32 main_grad), both routers, with and without a shared expert, on the
// tensor-core and the fp32-twin expert GEMMs; bit-identical reruns; the whole model's losses and
// gradients in fp32, and its bf16 losses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/mixed_precision.h"
#include "model/moe.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron {
namespace {

constexpr int64_t kC = 24;  // a multiple of 8: the gate_up GEMMs take the tensor cores in bf16
constexpr int64_t kRows = 39;

// x's values, rounded to bf16 when `bf16` (the CPU reference then computes on the GPU's values).
Tensor rounded(const Tensor& t, bool bf16) {
  return bf16 ? t.to(DType::kBF16).to(DType::kF32) : t.to(DType::kF32);
}

// The layer's input: for each row a permutation of the E router logits spaced 1 apart (columns
// [0, E)), the other columns random. With the router set by set_weights, every row's k-th and
// (k+1)-th logits stay ~1 apart, far above what bf16 rounding (|z|·2^-9 < 0.01) or another
// summation order can move: the CPU and the GPU route every row alike, so their outputs compare
// value by value.
Tensor layer_input(int E) {
  std::vector<double> x = testing::randn(static_cast<size_t>(kRows * kC), 71);
  uint64_t s = 5;
  for (int64_t n = 0; n < kRows; ++n) {
    std::vector<int> perm(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) perm[static_cast<size_t>(e)] = e;
    for (int e = E - 1; e > 0; --e) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(perm[static_cast<size_t>(e)], perm[(s >> 33) % static_cast<uint64_t>(e + 1)]);
    }
    for (int e = 0; e < E; ++e) {
      x[static_cast<size_t>(n * kC + e)] = perm[static_cast<size_t>(e)] - (E - 1) / 2.0;
    }
  }
  return Tensor::from_vector(x, {3, 13, kC}, DType::kF32);
}

// Every parameter random (fixed seeds), the router the identity on the first E columns plus a
// little noise (so its gradient paths are generic); values rounded to bf16 when `bf16` (the
// shadows then equal the masters).
void set_weights(ParamRegistry& reg, bool bf16) {
  uint64_t seed = 300;
  for (Parameter* p : reg.all()) {
    const Shape shape = p->data.shape();
    std::vector<double> v = testing::randn(static_cast<size_t>(shape.numel()), ++seed, 0.2);
    if (p->name == "moe.router.weight") {
      for (size_t i = 0; i < v.size(); ++i) {
        const int64_t e = static_cast<int64_t>(i) / kC, c = static_cast<int64_t>(i) % kC;
        v[i] = (e == c ? 1.0 : 0.0) + 0.025 * v[i];  // noise: logits move by ~0.05
      }
    }
    p->data.copy_from(rounded(Tensor::from_vector(v, shape, DType::kF32), bf16));
    p->zero_grad();
  }
}

struct LayerResult {
  std::vector<double> y, dx, aux;
  std::vector<std::vector<double>> grads;
  std::vector<std::string> names;
  std::vector<int64_t> load;
};

// One forward and backward of the layer on `dev`: d(Σ y·dy + aux) with dy a fixed draw.
LayerResult run_layer(const MoeDims& d, Device dev, bool bf16) {
  ParamRegistry reg(DType::kF32, dev, 1);
  MoeLayer moe(reg, "moe", kC, d, 0.2, 0.2);
  set_weights(reg, bf16);
  if (d.router == MoeRouterKind::kSigmoid) {  // small: it reorders no row's choice
    std::vector<double> b(static_cast<size_t>(d.E));
    for (int e = 0; e < d.E; ++e) b[static_cast<size_t>(e)] = 0.01 * (e % 3) - 0.01;
    moe.expert_bias().copy_from(Tensor::from_vector(b, {d.E}, moe.expert_bias().dtype()));
  }
  Bf16Weights shadows;
  DirectWeights direct;
  const DType act = bf16 && dev.is_cuda() ? DType::kBF16 : DType::kF32;
  // The CPU reference reads the (bf16-valued) fp32 masters directly.
  WeightAccess& w = act == DType::kBF16 ? static_cast<WeightAccess&>(shadows) : direct;
  auto on = [&](const Tensor& t) {
    const Tensor r = rounded(t, bf16);
    return dev.is_cpu() ? r : (act == DType::kBF16 ? r.to(act).to(dev) : r.to(dev));
  };
  const Tensor x0 = layer_input(d.E);
  const Var x = Var::leaf(on(x0));
  const Var y = moe.forward(x, w);
  const Var aux = moe.take_aux_loss();
  LayerResult r;
  if (aux.defined()) {
    aux.grad().copy_from(Tensor::from_vector({1.0}, Shape{}, DType::kF32).to(dev));
    r.aux = aux.value().to_vector();
  }
  const Tensor dy = testing::randn_tensor(x0.shape(), 72, 1.0, DType::kF32);
  backward_with(y, on(dy));
  r.y = y.value().to_vector();
  r.dx = x.grad().to_vector();
  for (Parameter* p : reg.all()) {
    r.grads.push_back(p->main_grad.to_vector());
    r.names.push_back(p->name);
  }
  r.load = moe.load();
  return r;
}

MoeDims dims(MoeRouterKind router, int64_t F, int shared, double aux) {
  MoeDims d;
  d.E = 6;
  d.top_k = 2;
  d.num_shared = shared;
  d.F = F;
  d.router = router;
  d.norm_topk_prob = true;
  d.aux_loss_weight = aux;
  return d;
}

void expect_layer_close(const LayerResult& gpu, const LayerResult& cpu, double tol) {
  EXPECT_EQ(gpu.load, cpu.load) << "the GPU routed differently";
  EXPECT_LT(testing::rel_diff(gpu.y, cpu.y), tol) << "y";
  EXPECT_LT(testing::rel_diff(gpu.dx, cpu.dx), tol) << "dx";
  ASSERT_EQ(gpu.aux.size(), cpu.aux.size());
  if (!cpu.aux.empty()) {
    EXPECT_LT(std::fabs(gpu.aux[0] - cpu.aux[0]), tol * cpu.aux[0]) << "aux";
  }
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    double norm = 0;
    for (double g : cpu.grads[i]) norm += g * g;
    EXPECT_GT(norm, 0) << cpu.names[i] << ": a zero CPU gradient would make the check empty";
    EXPECT_LT(testing::rel_diff(gpu.grads[i], cpu.grads[i]), tol) << cpu.names[i];
  }
}

void expect_identical(const LayerResult& a, const LayerResult& b) {
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.aux, b.aux);
  EXPECT_EQ(a.grads, b.grads);
  EXPECT_EQ(a.load, b.load);
}

// F = 24: every expert GEMM on the tensor cores in bf16; F = 12: the down GEMMs (Cin = 12) on the
// fp32 twin. fp32 runs the twin throughout: 1e-5 as the op tests. bf16: the rows are rounded at
// each of the layer's ~6 stored tensors (gate_up, SwiGLU, down, combine; and their gradients),
// each ~2e-3 relative: 3e-2 holds them with margin and still catches an O(1) error.
TEST(MoeLayerCuda, MatchesCpu) {
  GTRON_REQUIRE_GPU();
  for (MoeRouterKind router : {MoeRouterKind::kSoftmax, MoeRouterKind::kSigmoid}) {
    for (int64_t F : {24, 12}) {
      for (int shared : {0, 1}) {
        const MoeDims d = dims(router, F, shared, 0.01);
        SCOPED_TRACE(std::string(router == MoeRouterKind::kSigmoid ? "sigmoid" : "softmax") +
                     ", F " + std::to_string(F) + ", shared " + std::to_string(shared));
        for (bool bf16 : {false, true}) {
          SCOPED_TRACE(bf16 ? "bf16" : "fp32");
          const LayerResult cpu = run_layer(d, Device::cpu(), bf16);
          const LayerResult gpu = run_layer(d, Device::cuda(0), bf16);
          expect_layer_close(gpu, cpu, bf16 ? 3e-2 : 1e-5);
          expect_identical(run_layer(d, Device::cuda(0), bf16), gpu);
        }
      }
    }
  }
}

// The balance loss is left out when its weight is 0, and the load still counts every slot.
TEST(MoeLayerCuda, CountsTheLoadWithoutABalanceLoss) {
  GTRON_REQUIRE_GPU();
  const MoeDims d = dims(MoeRouterKind::kSigmoid, 24, 0, 0);
  const LayerResult gpu = run_layer(d, Device::cuda(0), true);
  EXPECT_TRUE(gpu.aux.empty());
  int64_t slots = 0;
  for (int64_t t : gpu.load) slots += t;
  EXPECT_EQ(slots, kRows * d.top_k);
  EXPECT_EQ(gpu.load, run_layer(d, Device::cpu(), true).load);
}

Tensor random_window(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  std::vector<int32_t> tok(static_cast<size_t>(B * (T + 1)));
  for (auto& t : tok) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((seed >> 33) % static_cast<uint64_t>(V));
  }
  return Tensor::from_ints(tok, {B, T + 1});
}

// A tiny MoE llama: block 0 dense, block 1 and the MTP depth mixtures of experts (sigmoid router
// with a shared expert; the balance loss in the total).
GPTConfig moe_llama() {
  GPTConfig c;
  c.arch = Arch::kLlama;
  c.vocab_size = 61;
  c.context_length = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.head_dim = 12;
  c.n_embd = 24;
  c.intermediate_size = 40;
  c.rope_theta = 10000;
  c.mtp_depth = 1;
  c.mtp_moe = true;
  c.moe = dims(MoeRouterKind::kSigmoid, 16, 1, 0.01);
  c.moe.E = 4;
  c.moe.first_dense_layers = 1;
  return c;
}

struct ModelResult {
  std::vector<double> losses;  // total, main, aux
  std::vector<std::vector<double>> grads;
  std::vector<std::string> names;
};

ModelResult run_model(GPT& model, const Tensor& window) {
  for (Parameter* p : model.parameters()) p->zero_grad();
  GPTOutput out = model.forward(window);
  backward(out.loss);
  ModelResult r;
  r.losses = {out.loss.value().item(), out.main_loss.value().item(),
              out.moe_aux_loss.value().item()};
  for (Parameter* p : model.parameters()) {
    r.grads.push_back(p->main_grad.to_vector());
    r.names.push_back(p->name);
  }
  return r;
}

// fp32: the model's losses within 1e-5 and every gradient within 1e-4 normwise (the dense llama's
// bounds in gpt_cuda_test: ~40 chained ops). bf16: the losses within 1e-2 (routing may differ
// where bf16 logits tie, so gradients are not compared value by value), reruns bit-identical.
TEST(MoeLayerCuda, TinyMoeLlamaMatchesCpu) {
  GTRON_REQUIRE_GPU();
  const GPTConfig c = moe_llama();
  const Tensor window = random_window(3, 11, c.vocab_size, 3);
  GPT cpu(c, DType::kF32, Device::cpu(), 5);
  const ModelResult ref = run_model(cpu, window);
  GPT gpu(c, DType::kF32, Device::cuda(0), 5);
  const ModelResult got = run_model(gpu, window.to(Device::cuda(0)));
  ASSERT_EQ(got.grads.size(), ref.grads.size());
  for (size_t k = 0; k < ref.losses.size(); ++k) {
    EXPECT_NEAR(got.losses[k], ref.losses[k], 1e-5) << "loss " << k;
  }
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    EXPECT_LT(testing::rel_diff(got.grads[i], ref.grads[i]), 1e-4) << ref.names[i];
  }
  GPT half(c, DType::kF32, Device::cuda(0), 5);
  Bf16Weights shadows;
  half.set_weight_access(&shadows);
  const ModelResult a = run_model(half, window.to(Device::cuda(0)));
  const ModelResult b = run_model(half, window.to(Device::cuda(0)));
  for (size_t k = 0; k < ref.losses.size(); ++k) {
    EXPECT_NEAR(a.losses[k], ref.losses[k], k == 2 ? 1e-3 : 1e-2) << "bf16 loss " << k;
  }
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.grads, b.grads);
  for (const auto& g : a.grads) {
    for (double v : g) ASSERT_TRUE(std::isfinite(v));
  }
}

}  // namespace
}  // namespace gtron
