// The whole GPT + MTP (D = 2) model on CUDA against the CPU, on a tiny config with odd sizes:
// the loss and every parameter gradient after one forward + backward, in fp32 (tight) and in bf16
// mixed precision (Bf16Weights: bf16 shadows, bf16 activations, fp32 main_grad). Also the device
// window path (shifted inputs and targets cut on the GPU) against the host one, the llama
// family's tiny model the same way, and both with document masking.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "model/cuda/column_finish.h"
#include "model/gpt.h"
#include "model/layers.h"
#include "model/mixed_precision.h"
#include "model/ops/column_scratch.h"
#include "tests/model/cuda_op_check.h"

namespace gtron {
namespace {

GPTConfig tiny_config() {
  GPTConfig c;
  c.vocab_size = 61;  // padded to 64: the padded rows and the masked CE tail are exercised
  c.context_length = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 40;  // head size 20: not a power of two
  c.mtp_depth = 2;
  return c;
}

Tensor random_window(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  std::vector<int32_t> tok(static_cast<size_t>(B * (T + 1)));
  for (auto& t : tok) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((seed >> 33) % static_cast<uint64_t>(V));
  }
  return Tensor::from_ints(tok, {B, T + 1});
}

// ||a − b|| / ||b|| (0 when both are zero).
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

struct Result {
  std::vector<double> losses;              // total, main, mtp_1..D
  std::vector<std::vector<double>> grads;  // per parameter, registration order
  std::vector<std::string> names;
};

// One forward + backward; `seed` (a device scalar): backward_with(loss, *seed), as the trainer.
Result run(GPT& model, const Tensor& window, const Tensor* seed = nullptr) {
  for (Parameter* p : model.parameters()) p->zero_grad();
  GPTOutput out = model.forward(window);
  if (seed != nullptr) {
    backward_with(out.loss, *seed);
  } else {
    backward(out.loss);
  }
  Result r;
  r.losses.push_back(out.loss.value().item());
  r.losses.push_back(out.main_loss.value().item());
  for (const Var& l : out.mtp_losses) r.losses.push_back(l.value().item());
  for (Parameter* p : model.parameters()) {
    EXPECT_EQ(p->main_grad.dtype(), DType::kF32) << p->name;
    r.grads.push_back(p->main_grad.to_vector());
    r.names.push_back(p->name);
  }
  return r;
}

// A window of 3 sequences of 11 tokens and the trainer's loss seed (0.125), both on `dev`.
std::pair<Tensor, Tensor> window_and_seed(const GPTConfig& c, const Device& dev) {
  return {random_window(3, 11, c.vocab_size, 3).to(dev),
          Tensor::from_vector({0.125}, Shape{}, DType::kF32).to(dev)};
}

// The tiny model on `dev`, with bf16 shadows (mixed precision) when `bf16`.
struct TinyModel {
  GPT model;
  Bf16Weights shadows;
  TinyModel(const GPTConfig& c, const Device& dev, bool bf16) : model(c, DType::kF32, dev, 5) {
    if (bf16) model.set_weight_access(&shadows);
  }
};

void expect_close(const Result& gpu, const Result& cpu, double loss_tol, double grad_tol) {
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t k = 0; k < cpu.losses.size(); ++k) {
    EXPECT_LT(std::abs(gpu.losses[k] - cpu.losses[k]), loss_tol)
        << "loss " << k << ": gpu " << gpu.losses[k] << " cpu " << cpu.losses[k];
  }
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    double norm = 0;
    for (double g : cpu.grads[i]) norm += g * g;
    EXPECT_GT(norm, 0) << cpu.names[i] << ": the CPU gradient is zero, the check would be empty";
    EXPECT_LT(rel_diff(gpu.grads[i], cpu.grads[i]), grad_tol) << cpu.names[i];
  }
}

TEST(GptCuda, DeviceWindowMatchesHost) {
  GTRON_REQUIRE_GPU();
  const Tensor w = random_window(3, 11, 61, 7);
  const Tensor wd = w.to(Device::cuda(0));
  for (int shift = 0; shift <= 3; ++shift) {
    EXPECT_EQ(window_inputs(wd, shift).to_vector(), window_inputs(w, shift).to_vector()) << shift;
    EXPECT_EQ(window_targets(wd, shift).to_vector(), window_targets(w, shift).to_vector()) << shift;
  }
}

// fp32 on the GPU runs the same math as the CPU in another summation order (true fp32 GEMMs, no
// TF32): each op agrees to ~1e-7..1e-6 normwise (the op tests hold 1e-5); through ~40 chained
// ops forward and backward the model stays well under 1e-4. The loss is a mean of O(1) values:
// 1e-5 absolute.
TEST(GptCuda, Fp32MatchesCpu) {
  GTRON_REQUIRE_GPU();
  const GPTConfig c = tiny_config();
  const Tensor window = random_window(3, 11, c.vocab_size, 3);
  GPT cpu(c, DType::kF32, Device::cpu(), 5);
  GPT gpu(c, DType::kF32, Device::cuda(0), 5);
  const Result ref = run(cpu, window);
  const Result got = run(gpu, window.to(Device::cuda(0)));  // the device window path
  expect_close(got, ref, 1e-5, 1e-4);
}

// bf16: weights and activations are rounded to bf16 (relative error up to 2^-9 ≈ 2e-3 per value,
// ~1e-3 normwise per stored tensor) and every op re-rounds its output; the op tests bound one op
// at 1e-2 normwise. Gradients pass through ~20 such roundings per path, which compound roughly
// like a random walk: a few 1e-2 at most; 0.1 still catches a wrong formula, a dropped use or a
// gradient in the wrong slot (all O(1) errors). The loss (≈ log 61 ≈ 4.1) comes from fp32
// statistics over bf16 logits of size ~0.1: 1e-2 nats is ~2e-3 relative, well above the
// expected ~1e-3.
TEST(GptCuda, Bf16MatchesCpu) {
  GTRON_REQUIRE_GPU();
  const GPTConfig c = tiny_config();
  const Tensor window = random_window(3, 11, c.vocab_size, 3);
  GPT cpu(c, DType::kF32, Device::cpu(), 5);
  GPT gpu(c, DType::kF32, Device::cuda(0), 5);
  Bf16Weights bf16;
  gpu.set_weight_access(&bf16);
  const Result ref = run(cpu, window);
  const Result got = run(gpu, window);  // host window: the ops copy the ids
  expect_close(got, ref, 1e-2, 0.1);
  // One shadow per weight and linear bias read through the access (tied embedding/head: one),
  // each cast once although the head is used 1 + D times.
  int64_t weights = 0;
  for (Parameter* p : gpu.parameters()) {
    const bool linear_bias =
        p->name.find(".attn.") != std::string::npos || p->name.find(".mlp.") != std::string::npos;
    weights += (p->data.rank() == 2 && p->name != "wpe.weight") ||
               (linear_bias && p->name.size() > 5 && p->name.substr(p->name.size() - 5) == ".bias");
  }
  EXPECT_EQ(bf16.casts(), weights);
  // A second pass without refresh() casts nothing; after refresh() every shadow once more.
  run(gpu, window);
  EXPECT_EQ(bf16.casts(), weights);
  bf16.refresh();
  run(gpu, window);
  EXPECT_EQ(bf16.casts(), 2 * weights);
}

// The llama config c on CUDA against the CPU (LlamaMatchesCpuWithEitherResidualPath below).
void expect_llama_matches_cpu(const GPTConfig& c) {
  const Tensor window = random_window(3, 11, c.vocab_size, 3);
  GPT cpu(c, DType::kF32, Device::cpu(), 5);
  const Result ref = run(cpu, window);
  for (bool in_gemm : {true, false}) {
    set_residual_in_gemm_for_testing(in_gemm);
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(std::string(in_gemm ? "residual in GEMM" : "add_rmsnorm") +
                   (bf16 ? ", bf16" : ", fp32") + ", HS " + std::to_string(c.head_dim));
      TinyModel tiny(c, Device::cuda(0), bf16);
      const Result got = run(tiny.model, window.to(Device::cuda(0)));
      if (bf16) {
        expect_close(got, ref, 1e-2, 0.1);
      } else {
        expect_close(got, ref, 1e-5, 1e-4);
      }
      const Result again = run(tiny.model, window.to(Device::cuda(0)));
      EXPECT_EQ(again.losses, got.losses) << "a rerun repeats the losses bit for bit";
      for (size_t i = 0; i < got.grads.size(); ++i) EXPECT_EQ(again.grads[i], got.grads[i]);
    }
    set_residual_in_gemm_for_testing(true);  // the default
  }
}

// The llama family (GQA, Qwen3's q/k norms, a head size that is not C / NH, an untied head, MTP
// D = 2) on CUDA against the CPU, with the block's residuals in the GEMM epilogues (the default)
// and with set_residual_in_gemm_for_testing(false) (h = x + o_proj(·) and mlp_norm(h) as
// add_rmsnorm, the MLP's add after down; Note [llama block residuals] in model/llama.h): fp32 and
// bf16, held to the GPT-2 tests' bounds. The two CUDA paths round the residual differently (once
// in the epilogue, twice when added after), so they agree to within those bounds too, not bit for
// bit. Head size 12 takes the composed attention, 64 the flash kernels in bf16.
TEST(GptCuda, LlamaMatchesCpuWithEitherResidualPath) {
  GTRON_REQUIRE_GPU();
  for (int64_t HS : {12, 64}) {
    GPTConfig c = tiny_config();
    c.arch = Arch::kLlama;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.head_dim = HS;
    c.intermediate_size = 56;
    c.qk_norm = true;
    c.tied_embeddings = false;
    c.rope_theta = 10000;
    expect_llama_matches_cpu(c);
  }
}

// train.recompute = "selective" (GPTConfig::recompute), bf16 (where the fused ops run), D = 2:
// the llama family's SwiGLU outputs re-formed in the backward (Note [recomputing the SwiGLU
// output] in model/ops/fused_mlp.h) give the same losses and every parameter gradient bit for
// bit. GPT-2's ln1 rows are re-formed bit for bit too, but its GELU output is re-formed by the
// elementwise GELU kernel, which rounds differently from the GEMM's GELU epilogue that formed it
// in the forward (Note [keeping g]): the forward and every gradient but mlp.proj's weight (the one
// reader of g) stay bit for bit, and those weights agree to bf16 rounding.
TEST(GptCuda, SelectiveRecomputeKeepsLossesAndGradients) {
  GTRON_REQUIRE_GPU();
  GPTConfig llama = tiny_config();
  llama.arch = Arch::kLlama;
  llama.n_head = 4;
  llama.n_kv_head = 2;
  llama.head_dim = 64;
  llama.intermediate_size = 56;
  llama.qk_norm = true;
  for (const GPTConfig& base : {tiny_config(), llama}) {
    SCOPED_TRACE(base.llama() ? "llama" : "gpt2");
    const Tensor window = random_window(3, 11, base.vocab_size, 3).to(Device::cuda(0));
    TinyModel keep(base, Device::cuda(0), /*bf16=*/true);
    GPTConfig rc = base;
    rc.recompute = Recompute::kSelective;
    TinyModel recompute(rc, Device::cuda(0), /*bf16=*/true);
    const Result a = run(keep.model, window);
    const Result b = run(recompute.model, window);
    EXPECT_EQ(a.losses, b.losses);
    ASSERT_EQ(a.grads.size(), b.grads.size());
    double norm = 0;
    int rounded = 0;
    for (size_t i = 0; i < a.grads.size(); ++i) {
      for (double g : a.grads[i]) norm += g * g;
      const bool reads_gelu_output =
          !base.llama() && a.names[i].find("mlp.proj.weight") != std::string::npos;
      if (reads_gelu_output) {
        ++rounded;
        EXPECT_LT(rel_diff(b.grads[i], a.grads[i]), 2e-2) << a.names[i];
      } else {
        EXPECT_EQ(a.grads[i], b.grads[i]) << a.names[i];
      }
    }
    EXPECT_EQ(rounded, base.llama() ? 0 : base.n_layer + base.mtp_depth);
    EXPECT_GT(norm, 0);
  }
}

// The trainer's promise (GPT::set_loss_seed): the heads' cross-entropies write their gradient in
// the forward (one pass over the logits) for seed·1 (main) and seed·λ/D (depths). Losses and every
// parameter gradient equal the two-pass path's bit for bit, fp32 and bf16, D = 2, padded vocab
// (fp32 logits keep the two-pass kernels under the promise too: model/ops/loss.cc).
TEST(GptCuda, LossSeedPromiseKeepsLossesAndGradientsBitForBit) {
  GTRON_REQUIRE_GPU();
  const GPTConfig c = tiny_config();
  const Device gpu = Device::cuda(0);
  const auto [window, seed] = window_and_seed(c, gpu);
  for (bool bf16 : {false, true}) {
    TinyModel tiny(c, gpu, bf16);
    GPT& model = tiny.model;
    const Result two = run(model, window, &seed);
    model.set_loss_seed(seed);
    setenv("GTRON_CLASSIFIER_ROWS", "0", 1);  // the one-pass CE over whole logits
    const Result one = run(model, window, &seed);
    unsetenv("GTRON_CLASSIFIER_ROWS");
    EXPECT_EQ(one.losses, two.losses) << (bf16 ? "bf16" : "fp32");
    ASSERT_EQ(one.grads.size(), two.grads.size());
    for (size_t i = 0; i < two.grads.size(); ++i) {
      EXPECT_EQ(one.grads[i], two.grads[i]) << two.names[i] << (bf16 ? " bf16" : " fp32");
    }
    double norm = 0;  // the head's (tied embedding's) gradient: the check is not empty
    for (double g : two.grads[0]) norm += g * g;
    EXPECT_GT(norm, 0.0);
    if (!bf16) continue;
    // bf16 under the promise takes the blocked classifier (model/ops/classifier.h): the same
    // losses, and gradients within bf16 rounding; only the head's sum over its uses and blocks
    // runs in another order.
    setenv("GTRON_CLASSIFIER_ROWS", "16", 1);  // 33 rows: blocks of 16, 16 and 1
    const Result blocked = run(model, window, &seed);
    unsetenv("GTRON_CLASSIFIER_ROWS");
    for (size_t k = 0; k < two.losses.size(); ++k)
      EXPECT_NEAR(blocked.losses[k], two.losses[k], 1e-5 * std::fabs(two.losses[k])) << k;
    for (size_t i = 0; i < two.grads.size(); ++i) {  // relative L2 error per parameter
      double num = 0, den = 0;
      for (size_t j = 0; j < two.grads[i].size(); ++j) {
        const double d = blocked.grads[i][j] - two.grads[i][j];
        num += d * d;
        den += two.grads[i][j] * two.grads[i][j];
      }
      EXPECT_LE(std::sqrt(num), 1e-2 * std::sqrt(den) + 1e-9) << two.names[i];
    }
  }
}

// Note [deferred column finishes]: the bias and norm-parameter gradients finished in one batch at
// the end of the backward equal the separately launched finishes bit for bit (fp32 and bf16; D = 2
// shares ln_f between three heads: one output queued three times), and a grad-ready hook that
// fires mid-backward reads its final gradient.
TEST(GptCuda, DeferredColumnFinishesKeepGradientsBitForBit) {
  GTRON_REQUIRE_GPU();
  const GPTConfig c = tiny_config();
  const Device gpu = Device::cuda(0);
  const auto [window, seed] = window_and_seed(c, gpu);
  for (bool bf16 : {false, true}) {
    TinyModel tiny(c, gpu, bf16);
    GPT& model = tiny.model;
    model.set_loss_seed(seed);
    set_column_finish_deferral_for_testing(false);
    const int64_t before = cuda::batched_finish_count();
    const Result now = run(model, window, &seed);
    EXPECT_EQ(cuda::batched_finish_count(), before);
    set_column_finish_deferral_for_testing(true);
    const Result later = run(model, window, &seed);
    // Every linear bias and LayerNorm/RMSNorm parameter went through a batch.
    EXPECT_GE(cuda::batched_finish_count() - before, 4 * c.n_layer + 4 * c.n_layer);
    EXPECT_EQ(later.losses, now.losses);
    ASSERT_EQ(later.grads.size(), now.grads.size());
    for (size_t i = 0; i < now.grads.size(); ++i) {
      EXPECT_EQ(later.grads[i], now.grads[i]) << now.names[i] << (bf16 ? " bf16" : " fp32");
    }
    std::vector<Parameter*> params = model.parameters();
    std::vector<std::vector<double>> seen(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      Parameter* p = params[i];
      p->grad_ready = [p, &seen, i] { seen[i] = p->main_grad.to_vector(); };
    }
    const Result hooked = run(model, window, &seed);
    for (size_t i = 0; i < params.size(); ++i) {
      params[i]->grad_ready = nullptr;
      EXPECT_EQ(seen[i], hooked.grads[i]) << params[i]->name << (bf16 ? " bf16" : " fp32");
    }
  }
}

// Document masking (GPTConfig::document_start, Note [document masking] in model/ops/segments.h):
// the segment ids and GPT-2's restarted positions made on the device, the masked reference
// kernels (fp32; GPT-2's head size 20 in bf16 too) and flash kernels (llama HS 64 in bf16), MTP
// D = 2, against the CPU; reruns repeat bit for bit, from a device or a host window; the mask
// changes the loss.
TEST(GptCuda, DocumentMaskingMatchesCpu) {
  GTRON_REQUIRE_GPU();
  GPTConfig llama = tiny_config();
  llama.arch = Arch::kLlama;
  llama.n_head = 4;
  llama.n_kv_head = 2;
  llama.head_dim = 64;
  llama.intermediate_size = 56;
  llama.qk_norm = true;
  llama.rope_theta = 10000;
  for (GPTConfig c : {tiny_config(), llama}) {
    SCOPED_TRACE(c.llama() ? "llama" : "gpt2");
    c.document_start = 60;
    Tensor window = random_window(3, 11, c.vocab_size, 3);
    // Documents open at positions 3, 4 and 9 of row 0, 6 of row 1 (and 0, which opens nothing
    // more), none in row 2.
    for (int64_t i : {3, 4, 9, 12 + 6, 12 + 0}) window.data<int32_t>()[i] = 60;
    GPT cpu(c, DType::kF32, Device::cpu(), 5);
    const Result ref = run(cpu, window);
    GPTConfig open_cfg = c;
    open_cfg.document_start = -1;
    GPT open(open_cfg, DType::kF32, Device::cpu(), 5);
    EXPECT_GT(std::abs(run(open, window).losses[1] - ref.losses[1]), 1e-4);
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(bf16 ? "bf16" : "fp32");
      TinyModel tiny(c, Device::cuda(0), bf16);
      const Result got = run(tiny.model, window.to(Device::cuda(0)));
      if (bf16) {
        expect_close(got, ref, 1e-2, 0.1);
      } else {
        expect_close(got, ref, 1e-5, 1e-4);
      }
      const Result again = run(tiny.model, window.to(Device::cuda(0)));
      EXPECT_EQ(again.losses, got.losses);
      for (size_t i = 0; i < got.grads.size(); ++i) EXPECT_EQ(again.grads[i], got.grads[i]);
      // A host window (evaluation's, after the training steps filled this shape's segment
      // buffers on the device): the segments are still made on the device, the same bits.
      const Result host = run(tiny.model, window);
      EXPECT_EQ(host.losses, got.losses);
      for (size_t i = 0; i < got.grads.size(); ++i) EXPECT_EQ(host.grads[i], got.grads[i]);
    }
  }
}

}  // namespace
}  // namespace gtron
