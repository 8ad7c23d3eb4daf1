// Generation on CUDA against the CPU (issue 14, acceptance 1 on the GPU, fp32): the cached
// attention kernel against its CPU twin at odd sizes over ragged windows (f32 tight, bf16 loose),
// and greedy decoding of a whole model on cuda:0 in fp32, plain and speculative, token for token
// equal to the CPU's. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/generate.h"
#include "model/kv_cache.h"
#include "tests/model/cuda_op_check.h"

namespace gtron {
namespace {

std::vector<double> pseudo_random(int64_t n, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<double>(seed >> 40) / static_cast<double>(1ull << 24) * 2 - 1;
  }
  return v;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

// Three windows over B = 3 rows: a ragged prefill, single slots with one row sitting out, and a
// window that rewrites rolled-back positions. NH = 3, HS = 5, 13 cached positions.
void check_cached_attention(DType act, double tol) {
  const int64_t B = 3, NH = 3, HS = 5, C = NH * HS, Tc = 13;
  const std::vector<DecodeWindow> windows = {
      {4, {0, 0, 0}, {4, 2, 3}}, {1, {4, 2, 3}, {1, 1, 0}}, {3, {3, 3, 3}, {3, 1, 2}}};
  KVCache cpu_cache(B, Tc, NH, HS, DType::kF32, Device::cpu());
  KVCache gpu_cache(B, Tc, NH, HS, act, Device::cuda(0));
  NoGradGuard no_grad;
  uint64_t seed = 7;
  for (const DecodeWindow& win : windows) {
    Tensor qkv = Tensor::from_vector(pseudo_random(B * win.width * 3 * C, ++seed),
                                     {B, win.width, 3 * C}, DType::kF32);
    if (act == DType::kBF16) qkv = qkv.to(DType::kBF16).to(DType::kF32);  // the GPU's inputs
    const Tensor ref = cached_attention(Var::constant(qkv), cpu_cache, win).value();
    Tensor dev_in = (act == DType::kBF16 ? qkv.to(DType::kBF16) : qkv).to(Device::cuda(0));
    Tensor got = cached_attention(Var::constant(dev_in), gpu_cache, win).value().to(Device::cpu());
    if (act == DType::kBF16) got = got.to(DType::kF32);
    EXPECT_LE(max_abs_diff(got.to_vector(), ref.to_vector()), tol) << dtype_name(act);
  }
}

TEST(GenerateCuda, CachedAttentionMatchesTheCpuKernel) {
  GTRON_REQUIRE_GPU();
  check_cached_attention(DType::kF32, 1e-5);
  check_cached_attention(DType::kBF16, 2e-2);
}

GPTConfig model_config() {
  GPTConfig c;
  c.vocab_size = 61;
  c.context_length = 96;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 40;
  c.mtp_depth = 2;
  c.init_std = 0.3;  // peaked distributions: no near-ties for argmax to split on
  return c;
}

TEST(GenerateCuda, GreedyTokensOnTheGpuEqualTheCpus) {
  GTRON_REQUIRE_GPU();
  GPT cpu_model(model_config(), DType::kF32, Device::cpu(), 5);
  GPT gpu_model(model_config(), DType::kF32, Device::cuda(0), 5);  // the same init (made on CPU)
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5}, {9, 8, 7, 6, 5}};
  for (bool speculative : {false, true}) {
    GenerateOptions o;
    o.max_new_tokens = 80;
    o.sampling.temperature = 0;
    o.speculative = speculative;
    const Generation want = generate(cpu_model, prompts, o);
    const Generation got = generate(gpu_model, prompts, o);
    EXPECT_EQ(got.tokens, want.tokens) << "speculative " << speculative;
    EXPECT_EQ(got.stats.accepted, want.stats.accepted);
  }
}

}  // namespace
}  // namespace gtron
