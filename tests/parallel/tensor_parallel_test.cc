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

// Note [replicated key/value heads]: a packed q | k | v of NH = 4 query heads and NKV key/value
// heads of HS = 2 rows, at TP a multiple of NKV: rank r holds k and v head r / (TP/NKV).
TEST(TpSlicing, ReplicatedRowGroupsHoldTheirHeadAndRoundTrip) {
  const int64_t HS = 2, q_rows = 4 * HS;
  for (auto [nkv, size] : {std::make_pair(1, 2), std::make_pair(1, 4), std::make_pair(2, 4)}) {
    const int R = size / nkv;
    const int64_t kv_rows = nkv * HS, n = q_rows + 2 * kv_rows;
    const Tensor full = iota({n, 3});
    const std::vector<double> f = full.to_vector();
    const TpSlice slice{TpSplit::kRows, 3, {q_rows, kv_rows, kv_rows}, {1, R, R}};
    const int64_t ql = q_rows / size;  // the part: ql query rows, then HS rows of k, HS of v
    std::vector<double> stacked;
    Shape local;
    for (int r = 0; r < size; ++r) {
      Tensor part = tp_local_of(full, slice, r, size);
      local = part.shape();
      ASSERT_EQ(local, Shape({ql + 2 * HS, 3})) << nkv << " kv heads, TP " << size;
      const std::vector<double> v = part.to_vector();
      const int64_t head = r / R;
      for (int64_t i = 0; i < HS * 3; ++i) {
        EXPECT_EQ(v[ql * 3 + i], f[(q_rows + head * HS) * 3 + i]) << "k of rank " << r;
        EXPECT_EQ(v[(ql + HS) * 3 + i], f[(q_rows + kv_rows + head * HS) * 3 + i])
            << "v of rank " << r;
      }
      EXPECT_EQ(v[0], f[r * ql * 3]) << "q of rank " << r;
      stacked.insert(stacked.end(), v.begin(), v.end());
    }
    EXPECT_EQ(tp_full_shape(local, slice, size), full.shape());
    const Tensor back = tp_full_of(
        Tensor::from_vector(stacked, {local.numel() * size}, DType::kF64), local, slice, size);
    EXPECT_EQ(back.to_vector(), f) << nkv << " kv heads, TP " << size;
    const std::vector<TpReplicatedRows> rows = tp_replicated_rows(slice, size);
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[0].begin, ql);
    EXPECT_EQ(rows[0].end, ql + HS);
    EXPECT_EQ(rows[1].begin, ql + HS);
    EXPECT_EQ(rows[1].end, ql + 2 * HS);
    EXPECT_EQ(rows[1].replicas, R);
    // A bias [n] is cut the same way.
    const Tensor bias = iota({n});
    EXPECT_EQ(tp_local_of(bias, slice, size - 1, size).to_vector()[static_cast<size_t>(ql)],
              bias.to_vector()[static_cast<size_t>(q_rows + (size - 1) / R * HS)]);
  }
  // Nothing replicated when TP divides NKV, nor at one rank.
  EXPECT_TRUE(tp_replicated_rows(TpSlice{TpSplit::kRows, 3, {8, 4, 4}, {1, 1, 1}}, 2).empty());
  EXPECT_TRUE(tp_replicated_rows(TpSlice{TpSplit::kRows, 3, {8, 2, 2}, {1, 2, 2}}, 1).empty());
}

TEST(TpOps, SumReplicatedAddsTheCopiesOfEachHead) {
  // Four ranks; copies shared by pairs (R = 2: ranks 0, 1 and 2, 3) and by all (R = 4).
  const int P = 4;
  run_ranks(P, [&](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "rep", rank, P);
    CommTensorParallel g(&comm);
    for (int R : {2, 4}) {
      auto value = [](int r, int i) { return 0.25 * (r + 1) + 0.125 * i; };
      std::vector<double> a(3), b(2);
      for (int i = 0; i < 3; ++i) a[i] = value(rank, i);
      for (int i = 0; i < 2; ++i) b[i] = value(rank, 3 + i);
      Tensor ta = Tensor::from_vector(a, {3}, DType::kF32);
      Tensor tb = Tensor::from_vector(b, {1, 2}, DType::kF32);
      g.sum_replicated({ta, tb}, R);
      const int first = rank - rank % R;
      for (int i = 0; i < 5; ++i) {
        double want = 0;
        for (int r = first; r < first + R; ++r) want += value(r, i);
        const double got = i < 3 ? ta.to_vector()[i] : tb.to_vector()[i - 3];
        EXPECT_EQ(got, want) << "rank " << rank << ", R " << R << ", element " << i;
      }
    }
  });
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

// A Qwen-style llama (q/k norms, qkv bias, MTP D=1) with NKV key/value heads at TP = P, a
// multiple of NKV: every gradient, once the replicated rows' copies are summed over the ranks
// sharing them (what ParallelState::finish_grads does), gathered, vs one process; the copies of
// each head come out bit-identical (tp_full_of checks it).
void check_replicated_kv_gradients(int nkv, int P) {
  GPTConfig c;
  c.arch = Arch::kLlama;
  c.vocab_size = 50;
  c.context_length = 8;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 24;
  c.n_kv_head = nkv;
  c.head_dim = 6;
  c.intermediate_size = 32;
  c.qk_norm = true;
  c.qkv_bias = true;
  c.mtp_depth = 1;
  GPT ref(c, DType::kF32, Device::cpu(), 7);
  GPTOutput ro = ref.forward(window(1));
  backward(ro.loss);
  const double ref_loss = ro.loss.value().item();
  std::mutex mu;
  double worst = 0;
  std::string worst_name;
  run_ranks(P, [&](int rank, StoreClient& store) {
    Grid grid = make_gloo_grid(store, rank, P, 1, P);
    GPTConfig pc = c;
    pc.tp_size = P;
    pc.tp_rank = grid.layout.tp_rank;
    GPT model(pc, DType::kF32, Device::cpu(), 7);
    CommTensorParallel tp(grid.tp.get());
    model.set_tensor_parallel(&tp);
    GPTOutput o = model.forward(window(1));
    backward(o.loss);
    const double loss = o.loss.value().item();
    for (Parameter* p : model.parameters()) {
      Tensor g = p->main_grad.clone();
      const TpSlice* s = model.tp_slice(p);
      if (s != nullptr) {
        const int64_t cols = g.rank() == 2 ? g.dim(1) : 1;
        Tensor flat = g.view({g.numel()});
        std::vector<Tensor> copies;
        int R = 1;
        for (const TpReplicatedRows& r : tp_replicated_rows(*s, P)) {
          copies.push_back(flat.rows(r.begin * cols, r.end * cols));
          R = r.replicas;
        }
        if (!copies.empty()) tp.sum_replicated(copies, R);
        g = tp.gather_full(g, *s);
      } else if (model.tp_partial_grad(p)) {  // the q/k norms: partial over TP
        grid.tp->all_reduce(g).synchronize();
      }
      const double d = norm_rel_diff(g.to_vector(), ref.find(p->name)->main_grad.to_vector());
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_LT(d, 1e-6) << p->name << " on rank " << rank;
      if (d > worst) worst_name = p->name;
      worst = std::max(worst, d);
    }
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_LT(std::abs(loss - ref_loss) / ref_loss, 1e-6) << rank;
  });
  std::printf(
      "llama NKV=%d at TP=%d (key/value heads replicated on %d ranks): worst gradient "
      "difference |diff| / |ref| %.3g (%s)\n",
      nkv, P, P / nkv, worst, worst_name.c_str());
}

TEST(TpGradients, ReplicatedKeyValueHeadsGradientsEqualOneProcess) {
  check_replicated_kv_gradients(1, 2);  // MQA
  check_replicated_kv_gradients(1, 4);
  check_replicated_kv_gradients(2, 4);
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
