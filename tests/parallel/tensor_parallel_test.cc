// Tensor parallelism with threads as ranks (Gloo): the slicing between full tensors and TP parts,
// the TP ops against their single-process twins (f64), and — acceptance 2 of the TP issue — the
// gradient of every parameter of a GPT with MTP at TP = 2 × GTP = 2, gathered, against one
// process on the same global batch.
#include "parallel/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <mutex>

#include "model/gpt.h"
#include "model/ops/embedding.h"
#include "model/ops/loss.h"
#include "model/ops/vocab_parallel.h"
#include "parallel/gloo_communicator.h"
#include "parallel/gtp.h"
#include "tests/parallel/gpt_util.h"
#include "tests/parallel/ranks.h"

namespace gtron::parallel {
namespace {

using test_util::run_ranks;

Tensor iota(const Shape& s, DType dt = DType::kF64) {
  std::vector<double> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + 0.1);
  return Tensor::from_vector(v, s, dt);
}

// ‖a − b‖ / ‖b‖ (Euclidean).
double norm_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    n += b[i] * b[i];
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

// max |a − b| / max |b|.
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::abs(a[i] - b[i]));
    n = std::max(n, std::abs(b[i]));
  }
  return n > 0 ? d / n : d;
}

TEST(TpSlicing, PartsOfRowGroupsAndColumnsRoundTrip) {
  const Tensor full = iota({12, 6});
  for (int size : {1, 2, 3}) {
    for (TpSlice slice : {TpSlice{TpSplit::kRows, 1}, TpSlice{TpSplit::kRows, 2},
                          TpSlice{TpSplit::kColumns, 1}, TpSlice{TpSplit::kNone, 1}}) {
      std::vector<double> stacked;
      Shape local;
      for (int r = 0; r < size; ++r) {
        Tensor part = tp_local_of(full, slice, r, size);
        local = part.shape();
        std::vector<double> v = part.to_vector();
        stacked.insert(stacked.end(), v.begin(), v.end());
      }
      EXPECT_EQ(tp_full_shape(local, slice, slice.split == TpSplit::kNone ? 1 : size),
                full.shape());
      const int parts = slice.split == TpSplit::kNone ? 1 : size;
      stacked.resize(static_cast<size_t>(local.numel() * parts));
      Tensor back = tp_full_of(Tensor::from_vector(stacked, {local.numel() * parts}, DType::kF64),
                               local, slice, parts);
      EXPECT_EQ(back.to_vector(), full.to_vector()) << size;
    }
  }
  // Row groups: rank 1 of 2 holds rows 3..5 and 9..11 of two groups of six (q|k|v-style).
  Tensor part = tp_local_of(full, TpSlice{TpSplit::kRows, 2}, 1, 2);
  EXPECT_EQ(part.shape(), Shape({6, 6}));
  EXPECT_EQ(part.to_vector()[0], full.to_vector()[3 * 6]);
  EXPECT_EQ(part.to_vector()[3 * 6], full.to_vector()[9 * 6]);
}

// The vocab-parallel embedding and cross-entropy, and the gathered features, at P ranks against
// the full ops (f64): values and gradients. Padded vocab (V < Vp) and masked rows included.
void check_vocab_parallel(int P) {
  const int64_t N = 6, C = 8, V = 13, Vp = 16, Vl = Vp / P;
  const Tensor full_logits = iota({N, Vp});
  const Tensor table = iota({Vp, C});
  const Tensor targets = Tensor::from_ints({3, 12, kMaskedTarget, 0, 7, 8}, {N});
  const Tensor tokens = Tensor::from_ints({15, 3, 3, 12, 0, 8}, {2, 3});
  Var lf = Var::leaf(full_logits.clone());
  Var ref_ce = cross_entropy(lf, targets, V);
  backward(ref_ce, 0.7);
  Var tf = Var::leaf(table.clone());
  Var ref_emb = embedding(tokens, tf);
  const Tensor dy = iota({2, 3, C});
  backward_with(ref_emb, dy);
  std::mutex mu;
  run_ranks(P, [&](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "tp", rank, P);
    CommTensorParallel g(&comm);
    const TpSlice rows{TpSplit::kRows, 1}, cols{TpSplit::kColumns, 1};
    Var ll = Var::leaf(tp_local_of(full_logits, cols, rank, P));
    Var ce = vocab_parallel_cross_entropy(ll, targets, V, rank * Vl, g);
    backward(ce, 0.7);
    Var tl = Var::leaf(tp_local_of(table, rows, rank, P));
    Var emb = vocab_parallel_embedding(tokens, tl, rank * Vl, g);
    backward_with(emb, dy);
    Var x = Var::leaf(tp_local_of(table, cols, rank, P));  // [Vp, C/P] features of this rank
    Var gathered = tp_gather_features(x, g);
    const Tensor dg = iota({Vp, C});
    backward_with(gathered, dg);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_LT(std::abs(ce.value().item() - ref_ce.value().item()), 1e-14) << P;
    EXPECT_LT(rel_diff(ll.grad().to_vector(), tp_local_of(lf.grad(), cols, rank, P).to_vector()),
              1e-13);
    EXPECT_EQ(emb.value().to_vector(), ref_emb.value().to_vector());
    EXPECT_EQ(tl.grad().to_vector(), tp_local_of(tf.grad(), rows, rank, P).to_vector());
    EXPECT_EQ(gathered.value().to_vector(), table.to_vector());
    EXPECT_EQ(x.grad().to_vector(), tp_local_of(dg, cols, rank, P).to_vector());
  });
}

TEST(TpOps, VocabParallelOpsMatchTheFullOnes) {
  check_vocab_parallel(2);
  check_vocab_parallel(4);
}

TEST(TpOps, SequenceParallelTokenOpsGatherScatterAndSplit) {
  // [B, T, C] = [2, 6, 3] over P = 3 ranks: rank r holds positions [2r, 2r + 2) of both rows.
  const int P = 3;
  const int64_t B = 2, T = 6, C = 3, Tc = T / P;
  const Tensor full = iota({B, T, C});
  const Tensor dy = iota({B, T, C}, DType::kF64);
  auto chunk_of = [&](const Tensor& t, int r) {  // [B, Tc, C] positions [r·Tc, (r+1)·Tc)
    std::vector<double> v = t.to_vector(), out;
    for (int64_t b = 0; b < B; ++b)
      out.insert(out.end(), v.begin() + (b * T + r * Tc) * C,
                 v.begin() + (b * T + (r + 1) * Tc) * C);
    return out;
  };
  std::mutex mu;
  run_ranks(P, [&](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "sp", rank, P);
    CommTensorParallel g(&comm);
    std::vector<double> mine = chunk_of(full, rank);
    Var x = Var::leaf(Tensor::from_vector(mine, {B, Tc, C}, DType::kF64));
    Var gathered = tp_gather_tokens(x, g);
    backward_with(gathered, dy);            // every rank's dy: x gets P × its chunk of dy
    Var partial = Var::leaf(full.clone());  // every rank contributes `full`: the sum is P·full
    Var scattered = tp_scatter_tokens(partial, g);
    Tensor dchunk = Tensor::from_vector(chunk_of(dy, rank), {B, Tc, C}, DType::kF64);
    backward_with(scattered, dchunk);
    Var whole = Var::leaf(full.clone());
    Var split = tp_split_tokens(whole, g);
    backward_with(split, dchunk);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(gathered.value().to_vector(), full.to_vector());
    std::vector<double> want = chunk_of(dy, rank);
    for (double& v : want) v *= P;
    EXPECT_EQ(x.grad().to_vector(), want);
    std::vector<double> sum = chunk_of(full, rank);
    for (double& v : sum) v *= P;
    EXPECT_EQ(scattered.value().to_vector(), sum);
    EXPECT_EQ(partial.grad().to_vector(), dy.to_vector());  // the all-gather of every chunk's dy
    EXPECT_EQ(split.value().to_vector(), chunk_of(full, rank));
    EXPECT_EQ(whole.grad().to_vector(), dy.to_vector());
  });
}

GPTConfig model_config(bool tied) {
  GPTConfig c;
  c.tied_embeddings = tied;
  c.vocab_size = 50;  // padded to 64: rank 1 of TP 2 holds the padding rows 50..63
  c.context_length = 8;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 24;
  c.mtp_depth = 2;
  return c;
}

Tensor window(uint64_t seed) { return test_util::small_window(seed); }
std::vector<Parameter*> shardable(const GPT& m) { return test_util::gtp_shardable(m); }

// TP = 2 × GTP = 2, with or without sequence parallelism, with a tied or untied head: every
// gradient, gathered, vs one process.
void check_tp2_gtp2_gradients(bool sequence_parallel, bool tied = true) {
  // One process on the global batch: both windows, each with seed 1/2 (the mean over 2 windows).
  GPT ref(model_config(tied), DType::kF32, Device::cpu(), 7);
  std::vector<double> ref_loss;
  for (uint64_t w : {1, 2}) {
    GPTOutput o = ref.forward(window(w));
    backward(o.loss, 0.5);
    ref_loss.push_back(o.loss.value().item());
  }
  std::mutex mu;
  double worst = 0, worst_max = 0;
  std::string worst_name;
  // World 4 = GTP 2 × TP 2 (rank = gtp_rank · 2 + tp_rank): GTP peers see different windows,
  // TP peers the same one. DP = 1, so the data group is the GTP group.
  run_ranks(4, [&](int rank, StoreClient& store) {
    Grid grid = make_gloo_grid(store, rank, 4, 2, 2);
    const GridLayout& l = grid.layout;
    GPTConfig c = model_config(tied);
    c.tp_size = 2;
    c.tp_rank = l.tp_rank;
    c.sequence_parallel = sequence_parallel;
    GPT model(c, DType::kF32, Device::cpu(), 7);
    CommTensorParallel tp(grid.tp.get());
    model.set_tensor_parallel(&tp);
    GtpWeights gtp(shardable(model), grid.gtp.get());
    model.set_weight_access(&gtp);
    GPTOutput o = model.forward(window(1 + l.gtp_rank));
    backward(o.loss, 0.5);
    gtp.finish_backward();  // sharded weights: main_grad = Σ over the GTP (data) group
    const double loss = o.loss.value().item();
    for (Parameter* p : model.parameters()) {
      Tensor g = p->main_grad;
      if (gtp.is_sharded(p)) {
        g = gtp.gather_full(p, g);
      } else {  // whole parameters: Σ over the data group (and TP under SP), as DDP does
        g = g.clone();
        const bool partial = sequence_parallel && model.tp_slice(p) == nullptr;
        (partial ? grid.world : grid.data)->all_reduce(g).synchronize();
      }
      if (const TpSlice* s = model.tp_slice(p)) g = tp.gather_full(g, *s);
      const std::vector<double> want = ref.find(p->name)->main_grad.to_vector();
      const double d = norm_rel_diff(g.to_vector(), want);
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_LT(d, 1e-6) << p->name << " on rank " << rank;
      if (d > worst) worst_name = p->name;
      worst = std::max(worst, d);
      worst_max = std::max(worst_max, rel_diff(g.to_vector(), want));
    }
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_LT(std::abs(loss - ref_loss[l.gtp_rank]) / ref_loss[l.gtp_rank], 1e-6) << rank;
    model.set_weight_access(nullptr);
  });
  std::printf(
      "TP=2 x GTP=2%s%s: worst gradient difference |diff| / |ref| %.3g (%s); max |diff| / max "
      "|ref| %.3g\n",
      sequence_parallel ? " with sequence parallelism" : "", tied ? "" : ", untied head", worst,
      worst_name.c_str(), worst_max);
}

TEST(TpGradients, Tp2Gtp2GradientsGatheredEqualOneProcess) { check_tp2_gtp2_gradients(false); }

TEST(TpGradients, Tp2Gtp2SequenceParallelGradientsGatheredEqualOneProcess) {
  check_tp2_gtp2_gradients(true);
}

TEST(TpGradients, Tp2Gtp2UntiedHeadGradientsGatheredEqualOneProcess) {
  check_tp2_gtp2_gradients(false, /*tied=*/false);
}

}  // namespace
}  // namespace gtron::parallel
