// Generation for the llama family on CUDA (issue 27 item 3): the grouped-query cached attention
// and the per-row RoPE of a decode window against their CPU twins (f32 tight, bf16 loose), and
// the rotation reading its starts on the device against the per-row one (bit for bit); a tiny
// model's incremental logits on cuda:0 (ragged windows, every position, main model and both MTP
// depths) against the CPU's full forward, in fp32 (1e-4 relative) and with bf16 weights and
// activations (5e-2 relative); greedy decoding on the GPU, plain and speculative, with and without
// CUDA graphs (Note [decode graphs] in model/decoder.h), giving the same tokens (fp32: also the
// CPU's); and graphed steps against eager ones over a history of windows. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "graphs/decode_graphs.h"
#include "model/decoder.h"
#include "model/generate.h"
#include "model/kv_cache.h"
#include "model/ops/embedding.h"
#include "model/ops/linear.h"
#include "model/ops/rope.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/decode_check.h"

namespace gtron {
namespace {

using testing::max_abs_diff;
using testing::pseudo_random;
using testing::tokens_of;

// Windows over B = 3 rows: a ragged prefill, single slots with one row sitting out, a window
// that rewrites rolled-back positions, and windows whose last keys fall past the first split.
const std::vector<DecodeWindow> kWindows = {{40, {0, 0, 0}, {40, 23, 9}},
                                            {1, {40, 23, 9}, {1, 1, 0}},
                                            {3, {38, 22, 9}, {3, 2, 3}},
                                            {2, {41, 24, 12}, {2, 1, 2}}};

// rope_window then cached_attention on the GPU against the CPU (f32), for NH query heads over
// NKV key/value heads of HS.
void check_rotated_attention(int NH, int NKV, int HS, DType act, double tol) {
  const int64_t B = 3, Tc = 64, width = static_cast<int64_t>(NH + 2 * NKV) * HS;
  const std::vector<double> freq = rope_inv_freq(HS, 10000);
  const Tensor cpu_freq = rope_table(freq, Device::cpu(), DType::kF32);
  const Tensor gpu_freq = rope_table(freq, Device::cuda(0), act);
  KVCache cpu_cache(B, Tc, NKV, HS, DType::kF32, Device::cpu());
  KVCache gpu_cache(B, Tc, NKV, HS, act, Device::cuda(0));
  NoGradGuard no_grad;
  uint64_t seed = 17;
  for (const DecodeWindow& win : kWindows) {
    Tensor qkv = Tensor::from_vector(pseudo_random(B * win.width * width, ++seed),
                                     {B, win.width, width}, DType::kF32);
    if (act == DType::kBF16) qkv = qkv.to(DType::kBF16).to(DType::kF32);  // the GPU's inputs
    const Tensor ref = cached_attention(rope_window(Var::constant(qkv), cpu_freq, NH, NKV, HS, win),
                                        cpu_cache, win)
                           .value();
    const Tensor dev_in = (act == DType::kBF16 ? qkv.to(DType::kBF16) : qkv).to(Device::cuda(0));
    Tensor got = cached_attention(rope_window(Var::constant(dev_in), gpu_freq, NH, NKV, HS, win),
                                  gpu_cache, win)
                     .value()
                     .to(Device::cpu());
    if (act == DType::kBF16) got = got.to(DType::kF32);
    // The rotation with the rows' starts read on the device (rope_window on CUDA) is the
    // training kernel's at each row's pos0, bit for bit.
    const Tensor at_once = rope_window(Var::constant(dev_in), gpu_freq, NH, NKV, HS, win).value();
    Tensor per_row = Tensor::empty(dev_in.shape(), dev_in.dtype(), Device::cuda(0));
    const size_t row_bytes = dtype_size(act) * static_cast<size_t>(win.width * width);
    for (int64_t b = 0; b < B; ++b) {
      cuda::rope_forward(static_cast<const char*>(dev_in.raw()) + b * row_bytes,
                         gpu_freq.data<float>(), static_cast<char*>(per_row.raw()) + b * row_bytes,
                         1, win.width, NH, NKV, HS, win.start[static_cast<size_t>(b)], act,
                         current_stream(Device::cuda(0)).native());
    }
    EXPECT_EQ(per_row.to(Device::cpu()).to_vector(), at_once.to(Device::cpu()).to_vector())
        << dtype_name(act) << " NH " << NH << " NKV " << NKV << " HS " << HS;
    ASSERT_EQ(got.shape().vec(), (std::vector<int64_t>{B, win.width, NH * HS}));
    EXPECT_LE(max_abs_diff(got.to_vector(), ref.to_vector()), tol)
        << dtype_name(act) << " NH " << NH << " NKV " << NKV << " HS " << HS;
  }
}

TEST(GenerateLlamaCuda, RotatedGqaCachedAttentionMatchesTheCpu) {
  GTRON_REQUIRE_GPU();
  for (int NKV : {1, 2, 4}) {
    check_rotated_attention(4, NKV, 6, DType::kF32, 1e-5);
    check_rotated_attention(4, NKV, 64, DType::kF32, 1e-5);
    check_rotated_attention(4, NKV, 64, DType::kBF16, 3e-2);
  }
}

GPTConfig model_config() {
  GPTConfig c;
  c.arch = Arch::kLlama;
  c.vocab_size = 61;
  c.context_length = 96;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 32;
  c.head_dim = 6;  // not C / NH
  c.qk_norm = true;
  c.tied_embeddings = false;
  c.intermediate_size = 40;
  c.mtp_depth = 2;
  c.rope_theta = 10000;
  c.rope_llama3 = true;
  c.rope_scaling = {4.0, 1.0, 4.0, 16};
  c.init_std = 0.25;  // peaked distributions: no near-ties for argmax to split on
  return c;
}

// The GPU decoder's logits at every position of seqs (module k: 0 main, else depth k fed the
// tokens k ahead), fed in ragged windows, against the CPU's full forward, relative to the
// largest reference logit.
void expect_incremental_logits_match(DType act, double rel_tol) {
  const GPTConfig c = model_config();
  GPT cpu(c, DType::kF32, Device::cpu(), 5);
  GPT gpu(c, DType::kF32, Device::cuda(0), 5);  // the same init (made on the CPU)
  const int64_t V = c.vocab_size;
  const std::vector<std::vector<int32_t>> seqs = {tokens_of(50, 1, V), tokens_of(33, 2, V)};
  const std::vector<std::vector<int64_t>> plan = {{7, 1, 1, 3, 1, 5}, {1, 2, 4}};
  Decoder dec(gpu, 2, /*keep_hidden=*/true, 0, nullptr, act);
  for (int k = 0; k <= c.mtp_depth; ++k) {
    std::vector<int64_t> pos(2, 0);
    std::vector<size_t> step(2, 0);
    double worst = 0;
    while (true) {
      WindowInput in;
      in.tokens.resize(2);
      in.start = pos;
      in.want.resize(2);
      bool any = false;
      for (size_t b = 0; b < 2; ++b) {
        const auto n = static_cast<int64_t>(seqs[b].size()) - k;
        const int64_t chunk = std::min(plan[b][step[b]++ % plan[b].size()], n - pos[b]);
        for (int64_t i = 0; i < chunk; ++i) {
          in.tokens[b].push_back(seqs[b][pos[b] + i + k]);
          in.want[b].push_back(i);
        }
        any = any || chunk > 0;
      }
      if (!any) break;
      const std::vector<float> got = k == 0 ? dec.main(in) : dec.depth(k, in);
      size_t r = 0;
      for (size_t b = 0; b < 2; ++b) {
        const auto ref = testing::llama_reference_logits(cpu, seqs[b], k);
        for (size_t i = 0; i < in.tokens[b].size(); ++i, ++r) {
          const std::vector<double>& want = ref[static_cast<size_t>(pos[b]) + i];
          double scale = 1;
          for (double v : want) scale = std::max(scale, std::fabs(v));
          for (int64_t v = 0; v < V; ++v) {
            worst = std::max(worst, std::fabs(got[r * V + v] - want[v]) / scale);
          }
        }
        pos[b] += static_cast<int64_t>(in.tokens[b].size());
      }
    }
    EXPECT_LE(worst, rel_tol) << dtype_name(act) << " module " << k;
  }
}

TEST(GenerateLlamaCuda, IncrementalLogitsEqualTheCpuFullForwardFp32) {
  GTRON_REQUIRE_GPU();
  expect_incremental_logits_match(DType::kF32, 1e-4);
}

TEST(GenerateLlamaCuda, IncrementalLogitsEqualTheCpuFullForwardBf16) {
  GTRON_REQUIRE_GPU();
  // bf16 weights (rounded once), activations and caches: 3.1e-2 measured on the H200.
  expect_incremental_logits_match(DType::kBF16, 5e-2);
}

// Greedy decoding on the GPU, plain and speculative, with graphs and without: the same tokens;
// in fp32 also the CPU's.
void expect_greedy_speculative_equals_plain(DType act) {
  const GPTConfig c = model_config();
  GPT gpu(c, DType::kF32, Device::cuda(0), 5);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5}, {9, 8, 7}};
  GenerateOptions o;
  o.max_new_tokens = 40;
  o.sampling.temperature = 0;
  const Generation want_f32 = generate(gpu, prompts, o);
  o.dtype = act;
  const Generation plain = generate(gpu, prompts, o);
  if (act == DType::kBF16) {  // bf16 rounding may part the two late, not at once
    EXPECT_EQ(std::vector<int32_t>(plain.tokens[0].begin(), plain.tokens[0].begin() + 4),
              std::vector<int32_t>(want_f32.tokens[0].begin(), want_f32.tokens[0].begin() + 4));
  }
  Generation want;
  if (act == DType::kF32) {
    GPT cpu(c, DType::kF32, Device::cpu(), 5);
    o.dtype = DType::kF32;
    want = generate(cpu, prompts, o);
    EXPECT_EQ(plain.tokens, want.tokens);
    o.speculative = true;
    want = generate(cpu, prompts, o);
  }
  o.speculative = true;
  const Generation spec = generate(gpu, prompts, o);
  EXPECT_EQ(spec.tokens, plain.tokens) << dtype_name(act);
  EXPECT_GT(spec.stats.proposed, 0);
  if (act == DType::kF32) {
    EXPECT_EQ(spec.tokens, want.tokens);
    EXPECT_EQ(spec.stats.accepted, want.stats.accepted);
  }
  for (bool speculative : {false, true}) {
    graphs::DecodeGraphs step_graphs(Device::cuda(0));
    o.graphs = &step_graphs;
    o.speculative = speculative;
    const Generation graphed = generate(gpu, prompts, o);
    EXPECT_EQ(graphed.tokens, plain.tokens)
        << dtype_name(act) << " graphs, speculative " << speculative;
    if (speculative) {
      EXPECT_EQ(graphed.stats.accepted, spec.stats.accepted) << dtype_name(act);
    }
  }
}

// Graph steps against eager steps over one history of windows (testing::graph_and_eager_steps):
// the rotation of a captured step reads its rows' starts on the device (rope_forward_at).
void expect_graph_steps_equal_eager_steps(DType act) {
  GPT model(model_config(), DType::kF32, Device::cuda(0), 5);
  graphs::DecodeGraphs step_graphs(Device::cuda(0));  // outlives the decoder it serves
  Decoder graphed(model, 3, true, 0, &step_graphs, act);
  Decoder eager(model, 3, true, 0, nullptr, act);
  const auto steps = testing::graph_and_eager_steps(graphed, eager);
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].graphed, steps[i].eager) << dtype_name(act) << " step " << i;
    EXPECT_EQ(steps[i].graphed.size(), steps[i].wanted) << "step " << i;
  }
  EXPECT_EQ(graphed.graphs_captured(), 5);
  EXPECT_EQ(eager.graphs_captured(), 0);
}

TEST(GenerateLlamaCuda, GraphStepsEqualEagerStepsFp32) {
  GTRON_REQUIRE_GPU();
  expect_graph_steps_equal_eager_steps(DType::kF32);
}

TEST(GenerateLlamaCuda, GraphStepsEqualEagerStepsBf16) {
  GTRON_REQUIRE_GPU();
  expect_graph_steps_equal_eager_steps(DType::kBF16);
}

TEST(GenerateLlamaCuda, GreedySpeculativeEqualsPlainFp32) {
  GTRON_REQUIRE_GPU();
  expect_greedy_speculative_equals_plain(DType::kF32);
}

TEST(GenerateLlamaCuda, GreedySpeculativeEqualsPlainBf16) {
  GTRON_REQUIRE_GPU();
  expect_greedy_speculative_equals_plain(DType::kBF16);
}

}  // namespace
}  // namespace gtron
