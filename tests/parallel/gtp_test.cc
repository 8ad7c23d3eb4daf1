// GTP with threads as ranks (Gloo): the recorded chain, prefetch and on-demand gathers, no dropped
// gradient, the send pool under repeated backwards (Note [GTP repeated backward]), the capture
// guard, and readiness of the prefetched weight.
#include "parallel/gtp.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <thread>

#include "model/gpt.h"
#include "parallel/gloo_communicator.h"
#include "tests/parallel/gpt_util.h"
#include "tests/parallel/ranks.h"

namespace gtron::parallel {
namespace {

using test_util::run_ranks;

GPTConfig config(int D, bool tied) {
  GPTConfig c;
  c.vocab_size = 50;  // padded to 64
  c.context_length = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 24;
  c.mtp_depth = D;
  c.tied_embeddings = tied;
  return c;
}

Tensor window(uint64_t seed) { return test_util::small_window(seed); }
std::vector<Parameter*> shardable(const GPT& m) { return test_util::gtp_shardable(m); }

// One forward + backward on `w` with loss seed `seed`; returns the loss.
double step(GPT& model, GtpWeights& gtp, const Tensor& w, double seed) {
  GPTOutput out = model.forward(w);
  backward(out.loss, seed);
  gtp.finish_backward();
  return out.loss.value().item();
}

TEST(Gtp, ChainPrefetchAndNoDroppedGradient) {
  // Reference: one process, G = 1.
  GPT ref(config(1, true), DType::kF32, Device::cpu(), 5);
  GPTOutput ro = ref.forward(window(1));
  backward(ro.loss);
  run_ranks(2, [&](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "gtp", rank, 2);
    GPT model(config(1, true), DType::kF32, Device::cpu(), 5);
    GtpWeights gtp(shardable(model), &comm);
    model.set_weight_access(&gtp);
    // Both ranks see the same batch with seed 1/2: the reduced shards equal G = 1's gradient.
    const double loss = step(model, gtp, window(1), 0.5);
    EXPECT_EQ(loss, ro.loss.value().item());
    const std::vector<std::string> want = {"wte.weight",
                                           "blocks.0.attn.qkv.weight",
                                           "blocks.0.attn.proj.weight",
                                           "blocks.0.mlp.fc.weight",
                                           "blocks.0.mlp.proj.weight",
                                           "blocks.1.attn.qkv.weight",
                                           "blocks.1.attn.proj.weight",
                                           "blocks.1.mlp.fc.weight",
                                           "blocks.1.mlp.proj.weight",
                                           "mtp.1.proj.weight",
                                           "mtp.1.block.attn.qkv.weight",
                                           "mtp.1.block.attn.proj.weight",
                                           "mtp.1.block.mlp.fc.weight",
                                           "mtp.1.block.mlp.proj.weight"};
    EXPECT_EQ(gtp.chain_names(), want);
    for (Parameter* p : shardable(model)) {
      Tensor full = gtp.gather_full(p, p->main_grad);
      auto got = full.to_vector();
      auto exp = ref.find(p->name)->main_grad.to_vector();
      double diff = 0, norm = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        diff += (got[i] - exp[i]) * (got[i] - exp[i]);
        norm += exp[i] * exp[i];
      }
      EXPECT_LT(std::sqrt(diff / norm), 1e-5) << p->name << " (the tied table has 4 uses)";
    }
    // Second pass: the chain is recorded, so uses are prefetched; a repeat use (the tied table)
    // gathers on demand. Each use is served by exactly one gather.
    const GtpStats before = gtp.stats();
    for (Parameter* p : model.parameters()) p->zero_grad();
    step(model, gtp, window(2), 0.5);
    const GtpStats after = gtp.stats();
    const int64_t uses = 2 * (14 + 3);  // forward and backward: 14 chain weights + 3 repeat uses
    EXPECT_EQ(after.gathers_issued - before.gathers_issued, uses);
    // Forward: chain weights 1..13 are each prefetched by their predecessor. Backward: chain
    // weights 12..0 by their successor (13's backward follows the heads: on demand).
    EXPECT_EQ(after.prefetch_hits - before.prefetch_hits, 13 + 13);
  });
}

// Note [GTP recompute rounds]: under full recompute each block's second forward gathers its
// weights again; after the first micro-batch recorded the rounds, every use of a round but the
// very first is prefetched (within the round, and the next round's first weight at a round's end),
// no gather is wasted, and the gradients are those of GTP without recompute, bit for bit.
TEST(Gtp, RecomputeRoundsArePrefetched) {
  std::vector<double> plain_grads[2];
  for (const bool recompute : {false, true}) {
    run_ranks(2, [&](int rank, StoreClient& store) {
      GlooCommunicator comm(store, recompute ? "rounds" : "plain", rank, 2);
      GPTConfig c = config(1, true);
      c.recompute = recompute ? Recompute::kFull : Recompute::kNone;
      GPT model(c, DType::kF32, Device::cpu(), 5);
      GtpWeights gtp(shardable(model), &comm);
      model.set_weight_access(&gtp);
      step(model, gtp, window(1), 0.5);  // records the chain (and the rounds)
      for (Parameter* p : model.parameters()) p->zero_grad();
      const GtpStats before = gtp.stats();
      step(model, gtp, window(2), 0.5);
      const GtpStats after = gtp.stats();
      // 14 chain weights + 3 repeat uses, forward and backward, + 2 blocks × 4 second uses.
      const int64_t second = recompute ? 2 * 4 : 0;
      EXPECT_EQ(after.gathers_issued - before.gathers_issued, 2 * (14 + 3) + second);
      // As without recompute (13 + 13), plus 7 of the 8 second uses (not the first round's first).
      EXPECT_EQ(after.prefetch_hits - before.prefetch_hits, 13 + 13 + (recompute ? 7 : 0));
      std::vector<double> grads;
      for (Parameter* p : shardable(model)) {
        const std::vector<double> g = p->main_grad.to_vector();
        grads.insert(grads.end(), g.begin(), g.end());
      }
      if (!recompute) {
        plain_grads[rank] = grads;
      } else {
        EXPECT_EQ(grads, plain_grads[rank]) << "rank " << rank;
      }
    });
  }
}

struct PoolResult {
  size_t head_buffers = 0, head_bytes = 0, pool_bytes = 0;
  int64_t reused = 0;
  std::vector<double> grad;  // the head's reduced gradient shard
};

PoolResult pool_run(int D, bool reuse) {
  PoolResult res[2];
  run_ranks(2, [&](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "pool", rank, 2);
    GPT model(config(D, /*tied=*/false), DType::kF32, Device::cpu(), 9);
    GtpWeights gtp(shardable(model), &comm, GtpOptions{reuse});
    model.set_weight_access(&gtp);
    for (int s = 0; s < 2; ++s) step(model, gtp, window(3 + rank), 0.5);
    Parameter* head = model.find("lm_head.weight");
    const int64_t key_numel = 64 * 24;
    for (const auto& k : gtp.pool_stats().keys) {
      if (k.key.numel == key_numel) {
        res[rank].head_buffers = k.held;
        res[rank].head_bytes = k.held * k.key.bytes();
        EXPECT_EQ(k.in_use, 0u);  // all released: a pop would not allocate (has_free)
      }
    }
    res[rank].pool_bytes = gtp.pool_stats().bytes_held;
    res[rank].reused = gtp.stats().reused_send_buffers;
    res[rank].grad = head->main_grad.to_vector();
  });
  EXPECT_EQ(res[0].head_buffers, res[1].head_buffers);
  return res[0];
}

TEST(Gtp, RepeatedBackwardReusesItsSendBuffer) {
  // wte and lm_head share the key (same shape): the embedding's backward is never consecutive with
  // the head's, so only the head's 1 + D consecutive backwards can grow the pool.
  for (int D : {0, 1, 2}) {
    PoolResult on = pool_run(D, true);
    PoolResult off = pool_run(D, false);
    EXPECT_EQ(on.head_buffers, 1u) << "D=" << D;
    EXPECT_EQ(off.head_buffers, static_cast<size_t>(1 + D)) << "D=" << D;
    EXPECT_EQ(on.reused, 2 * D) << "two steps, D reuses each";
    EXPECT_EQ(on.grad, off.grad) << "bit-identical gradients with and without reuse";
    std::printf(
        "D=%d: head-key send buffers %zu (%zu bytes) with reuse, %zu (%zu bytes) without; "
        "pool %zu vs %zu bytes\n",
        D, on.head_buffers, on.head_bytes, off.head_buffers, off.head_bytes, on.pool_bytes,
        off.pool_bytes);
  }
}

// Note [fp8 gathers]: with FP8 linears, a weight whose shard is whole 128-row blocks (here
// mlp.fc, [512, 128]: 256 rows a shard) gathers e4m3 codes and block scales; the others gather
// f32. The losses and gradients are those of gathering f32, bit for bit, and of one process at the
// first step; the gathers move fewer bytes.
TEST(Gtp, Fp8GathersMoveCodesAndKeepTheLoss) {
  GPTConfig c = config(0, true);
  c.n_embd = 128;
  c.fp8 = true;
  GPT ref(c, DType::kF32, Device::cpu(), 5);
  GPTOutput ro = ref.forward(window(1));
  backward(ro.loss);
  struct Result {
    double loss = 0;
    std::vector<double> grads;
    GtpStats stats;
  };
  Result res[2][2];  // [fp8 gathers][rank]
  for (const bool fp8_gathers : {false, true}) {
    run_ranks(2, [&](int rank, StoreClient& store) {
      GlooCommunicator comm(store, fp8_gathers ? "fp8" : "f32", rank, 2);
      GPT model(c, DType::kF32, Device::cpu(), 5);
      GtpOptions opt;
      if (fp8_gathers) opt.fp8_weights = model.fp8_weights();
      GtpWeights gtp(shardable(model), &comm, opt);
      model.set_weight_access(&gtp);
      Result& r = res[fp8_gathers][rank];
      r.loss = step(model, gtp, window(1), 0.5);
      step(model, gtp, window(2), 0.5);  // a second pass: prefetched gathers too
      r.stats = gtp.stats();
      for (Parameter* p : shardable(model)) {
        const std::vector<double> g = p->main_grad.to_vector();
        r.grads.insert(r.grads.end(), g.begin(), g.end());
      }
    });
  }
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(res[1][rank].loss, ro.loss.value().item()) << "rank " << rank;
    EXPECT_EQ(res[1][rank].loss, res[0][rank].loss);
    EXPECT_EQ(res[1][rank].grads, res[0][rank].grads) << "rank " << rank;
    EXPECT_EQ(res[0][rank].stats.fp8_gathers, 0);
    // Two blocks' mlp.fc, forward and backward, two passes.
    EXPECT_EQ(res[1][rank].stats.fp8_gathers, 2 * 2 * 2);
    EXPECT_EQ(res[1][rank].stats.gathers_issued, res[0][rank].stats.gathers_issued);
    // Each fc gather: a shard's 256x128 codes and its 2 block rows of scales (4 floats each, the
    // leading dimension padded to 4) from each of 2 ranks, instead of 512x128 f32.
    const int64_t saved = 8 * (int64_t{512} * 128 * 4 - 2 * (256 * 128 + 2 * 4 * 4));
    EXPECT_EQ(res[0][rank].stats.gathered_bytes - res[1][rank].stats.gathered_bytes, saved);
  }
}

TEST(Gtp, CaptureGuardFiresWhenThePoolIsEmpty) {
  run_ranks(2, [](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "guard", rank, 2);
    GPT model(config(0, true), DType::kF32, Device::cpu(), 3);
    GtpWeights gtp(shardable(model), &comm);
    model.set_weight_access(&gtp);
    gtp.set_capturing(true);  // no warmup filled the pool
    GPTOutput out = model.forward(window(1));
    EXPECT_THROW(backward(out.loss, 0.5), std::logic_error);
    clear_tape();
  });
}

TEST(Gtp, PrefetchMakesTheNextWeightReadyFirst) {
  // After the chain is recorded, using blocks.0.mlp.proj prefetches blocks.1.attn.qkv — the next
  // block's first weight. Its DP gather (simulated: the ready callback writes this step's values
  // into the shard) must land before the prefetch reads the shard.
  GPT ref(config(0, true), DType::kF32, Device::cpu(), 11);
  Parameter* ref_qkv = ref.find("blocks.1.attn.qkv.weight");
  {
    float* d = ref_qkv->data.data<float>();
    for (int64_t i = 0; i < ref_qkv->data.numel(); ++i) d[i] += 0.5f;
  }
  double want;
  {
    NoGradGuard ng;
    want = ref.forward(window(7)).loss.value().item();
  }
  run_ranks(2, [&](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "ready", rank, 2);
    GPT model(config(0, true), DType::kF32, Device::cpu(), 11);
    GtpWeights gtp(shardable(model), &comm);
    model.set_weight_access(&gtp);
    step(model, gtp, window(1), 0.5);  // records the chain
    Parameter* qkv = model.find("blocks.1.attn.qkv.weight");
    int calls = 0;
    qkv->ready = [&] {
      if (calls++ == 0) {
        float* d = qkv->data.data<float>();
        for (int64_t i = 0; i < qkv->data.numel(); ++i) d[i] += 0.5f;
      }
    };
    const int64_t hits = gtp.stats().prefetch_hits;
    NoGradGuard ng;
    const double got = model.forward(window(7)).loss.value().item();
    EXPECT_GE(calls, 1);
    EXPECT_GT(gtp.stats().prefetch_hits, hits);
    EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << "the prefetch read last step's values";
    qkv->ready = nullptr;
  });
}

}  // namespace
}  // namespace gtron::parallel
