// Generation on CUDA against the CPU (issue 14, acceptance 1 on the GPU, fp32): the cached
// attention kernel against its CPU twin over ragged windows, at odd sizes and over several key
// splits (f32 tight, bf16 loose); the decoder's captured greedy steps against its eager ones
// (Note [decode graphs]); and greedy decoding of a whole model on cuda:0 in fp32, plain and
// speculative, with graphs and without, token for token equal to the CPU's. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "graphs/decode_graphs.h"
#include "model/decode_cuda.h"
#include "model/decode_ops.h"
#include "model/decoder.h"
#include "model/generate.h"
#include "model/kv_cache.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/decode_check.h"

namespace gtron {
namespace {

using testing::max_abs_diff;
using testing::pseudo_random;

struct AttentionCase {
  int64_t NH, HS, Tc;
  std::vector<DecodeWindow> windows;  // over B = 3 rows
};

// Small: a ragged prefill, single slots with one row sitting out, and a window that rewrites
// rolled-back positions (NH = 3, HS = 5, 13 cached positions: one key split). Long: GPT-2's head
// size over 100 positions, windows whose last keys fall in the first, third and fourth splits.
const AttentionCase kSmall = {
    3, 5, 13, {{4, {0, 0, 0}, {4, 2, 3}}, {1, {4, 2, 3}, {1, 1, 0}}, {3, {3, 3, 3}, {3, 1, 2}}}};
const AttentionCase kLong = {2,
                             64,
                             100,
                             {{70, {0, 0, 0}, {70, 40, 9}},
                              {1, {70, 40, 9}, {1, 1, 0}},
                              {3, {66, 41, 9}, {3, 2, 3}},
                              {2, {97, 63, 64}, {2, 1, 2}}}};

void check_cached_attention(const AttentionCase& t, DType act, double tol) {
  const int64_t B = 3, NH = t.NH, HS = t.HS, C = NH * HS, Tc = t.Tc;
  const std::vector<DecodeWindow>& windows = t.windows;
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
  for (const AttentionCase* t : {&kSmall, &kLong}) {
    check_cached_attention(*t, DType::kF32, 1e-5);
    check_cached_attention(*t, DType::kBF16, 2e-2);
  }
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

// The fused small-row linear (Note [decode fast block]) against the composed training ops on the
// CPU: ln1 -> qkv, ln2 -> fc -> GELU, mlp_proj + residual, at 1, 5 and 8 rows (9 rows take the
// composed path on the GPU too), for C = 40 and for C = 272, whose mlp_proj (K = 1088) takes the
// kernel's long-row instance.
TEST(GenerateCuda, SmallLinearMatchesTheComposedOps) {
  GTRON_REQUIRE_GPU();
  for (int64_t C : {40, 272}) {
    GPTConfig c = model_config();
    c.n_embd = C;
    c.n_layer = 1;
    c.mtp_depth = 0;
    GPT cpu_model(c, DType::kF32, Device::cpu(), 5);
    GPT gpu_model(c, DType::kF32, Device::cuda(0), 5);
    const TransformerBlock& cb = cpu_model.block(0);
    const TransformerBlock& gb = gpu_model.block(0);
    NoGradGuard no_grad;
    uint64_t seed = 40;
    for (int64_t M : {1, 5, 8, 9}) {
      for (int which = 0; which < 3; ++which) {  // qkv, fc, mlp_proj
        const LinearLayer& cl = which == 0 ? cb.qkv : which == 1 ? cb.fc : cb.mlp_proj;
        const LinearLayer& gl = which == 0 ? gb.qkv : which == 1 ? gb.fc : gb.mlp_proj;
        const LayerNormLayer* cn = which == 0 ? &cb.ln1 : which == 1 ? &cb.ln2 : nullptr;
        const LayerNormLayer* gn = which == 0 ? &gb.ln1 : which == 1 ? &gb.ln2 : nullptr;
        const int64_t K = cl.weight->data.dim(1), N = cl.weight->data.dim(0);
        const Tensor x = Tensor::from_vector(pseudo_random(M * K, ++seed), {M, K}, DType::kF32);
        Var res_cpu, res_gpu;
        if (which == 2) {
          res_cpu =
              Var::constant(Tensor::from_vector(pseudo_random(M * N, ++seed), {M, N}, DType::kF32));
          res_gpu = Var::constant(res_cpu.value().to(Device::cuda(0)));
        }
        const bool up = which == 1;
        const Tensor want = decode_linear(Var::constant(x), cl, res_cpu, up, cn).value();
        const Tensor got = decode_linear(Var::constant(x.to(Device::cuda(0))), gl, res_gpu, up, gn)
                               .value()
                               .to(Device::cpu());
        ASSERT_EQ(got.shape().vec(), (std::vector<int64_t>{M, N}));
        const std::vector<double> w = want.to_vector();
        double scale = 1;
        for (double v : w) scale = std::max(scale, std::fabs(v));
        EXPECT_LE(max_abs_diff(got.to_vector(), w), 1e-5 * scale)
            << "C " << C << ", " << M << " rows, layer " << which;
      }
    }
  }
}

// The device argmax picks the first of equal maxima, as std::max_element does, and ignores the
// padding columns past V.
TEST(GenerateCuda, DeviceArgmaxTakesTheFirstMaximum) {
  GTRON_REQUIRE_GPU();
  const int64_t N = 4, V = 1000, ld = 1024;
  std::vector<double> v = pseudo_random(N * ld, 3);
  for (int64_t r = 0; r < N; ++r) v[r * ld + V + 5] = 9.0;   // padding: never picked
  v[0 * ld + 7] = v[0 * ld + 700] = 5.0;                     // a tie across threads
  v[1 * ld + 999] = 5.0;                                     // the last real column
  v[2 * ld + 300] = v[2 * ld + 556] = v[2 * ld + 44] = 5.0;  // the first is not the lowest thread
  const Tensor host = Tensor::from_vector(v, {N, ld}, DType::kF32);
  const Tensor dev = host.to(Device::cuda(0));
  Tensor ids = Tensor::empty({N}, DType::kI32, Device::cuda(0));
  cuda::argmax_rows(dev.raw(), ids.data<int32_t>(), N, V, ld, DType::kF32,
                    current_stream(Device::cuda(0)).native());
  const Tensor got = ids.to(Device::cpu());
  for (int64_t r = 0; r < N; ++r) {
    EXPECT_EQ(got.data<int32_t>()[r], argmax(host.data<float>() + r * ld, V)) << "row " << r;
  }
  EXPECT_EQ(got.data<int32_t>()[0], 7);
  EXPECT_EQ(got.data<int32_t>()[1], 999);
  EXPECT_EQ(got.data<int32_t>()[2], 44);
}

// Graph steps against eager steps over one history of windows (testing::graph_and_eager_steps).
TEST(GenerateCuda, GraphStepsEqualEagerSteps) {
  GTRON_REQUIRE_GPU();
  GPT model(model_config(), DType::kF32, Device::cuda(0), 5);
  graphs::DecodeGraphs step_graphs(Device::cuda(0));  // outlives the decoder it serves
  Decoder graphed(model, 3, true, 0, &step_graphs);
  Decoder eager(model, 3, true, 0, nullptr);
  const auto steps = testing::graph_and_eager_steps(graphed, eager);
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].graphed, steps[i].eager) << "step " << i;
    EXPECT_EQ(steps[i].graphed.size(), steps[i].wanted) << "step " << i;
  }
  EXPECT_EQ(graphed.graphs_captured(), 5);
  EXPECT_EQ(eager.graphs_captured(), 0);
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
    for (bool graphs : {true, false}) {
      graphs::DecodeGraphs step_graphs(Device::cuda(0));
      o.graphs = graphs ? &step_graphs : nullptr;
      const Generation got = generate(gpu_model, prompts, o);
      EXPECT_EQ(got.tokens, want.tokens) << "speculative " << speculative << " graphs " << graphs;
      EXPECT_EQ(got.stats.accepted, want.stats.accepted);
    }
  }
}

// bf16 decoding (Note [bf16 decoding]): with graphs (the training ops captured, not the fused
// block) and without, plain and speculative, the same tokens.
TEST(GenerateCuda, Bf16DecodingWithAndWithoutGraphsAgrees) {
  GTRON_REQUIRE_GPU();
  GPT model(model_config(), DType::kF32, Device::cuda(0), 5);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5}, {9, 8, 7}};
  GenerateOptions o;
  o.max_new_tokens = 40;
  o.sampling.temperature = 0;
  o.dtype = DType::kBF16;
  const Generation eager = generate(model, prompts, o);
  for (bool speculative : {false, true}) {
    graphs::DecodeGraphs step_graphs(Device::cuda(0));
    o.graphs = &step_graphs;
    o.speculative = speculative;
    const Generation graphed = generate(model, prompts, o);
    EXPECT_EQ(graphed.tokens, eager.tokens) << "speculative " << speculative;
  }
}

}  // namespace
}  // namespace gtron
