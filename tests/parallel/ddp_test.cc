// DataParallel with threads as ranks (Gloo): gradient buckets reduce during backward, owned shards
// hold the DP sum, parameters come back through lazy gathers, and readiness: a parameter read ahead
// of its owner sees last step's values without its ready callback and this step's with it.
#include "parallel/ddp.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>

#include "model/ops/linear.h"
#include "parallel/gloo_communicator.h"
#include "parallel/self_communicator.h"
#include "tests/parallel/ranks.h"

namespace gtron::parallel {
namespace {

using test_util::run_ranks;

// Counts the reductions a DataParallel starts (decorates a real communicator).
class Counting : public Communicator {
 public:
  explicit Counting(Communicator* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Device device() const override { return inner_->device(); }
  const std::string& name() const override { return inner_->name(); }
  Work all_gather(const Tensor& in, Tensor& out) override {
    ++gathers;
    return inner_->all_gather(in, out);
  }
  Work reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    ++reductions;
    return inner_->reduce_scatter(in, out, op);
  }
  Work all_reduce(Tensor& t, ReduceOp op) override {
    ++reductions;
    return inner_->all_reduce(t, op);
  }
  Work broadcast(Tensor& t, int root) override { return inner_->broadcast(t, root); }
  void barrier() override { inner_->barrier(); }
  int reductions = 0, gathers = 0;

 private:
  Communicator* inner_;
};

std::vector<double> seq(int n, double start) {
  std::vector<double> v(n);
  for (int i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

// Two weights in separate buckets (tiny bucket size); rank r's gradient is (r + 1) * w_index.
struct TwoWeights {
  Parameter a{"a", Tensor::from_vector(seq(6, 0), {2, 3}, DType::kF32)};
  Parameter b{"b", Tensor::from_vector(seq(5, 100), {5}, DType::kF32)};
  std::vector<Parameter*> all() { return {&a, &b}; }
};

Parameter* a_param = nullptr;  // backward_through_a's weight

DdpOptions tiny_buckets(bool distributed, bool overlap) {
  DdpOptions o;
  o.distributed_optimizer = distributed;
  o.overlap_param_gather = overlap;
  o.bucket_bytes = 4;  // one parameter per bucket
  return o;
}

TEST(DataParallel, OwnedShardsHoldTheSumOverRanks) {
  for (bool distributed : {true, false}) {
    run_ranks(2, [&](int rank, StoreClient& store) {
      GlooCommunicator comm(store, distributed ? "d" : "a", rank, 2);
      TwoWeights w;
      DataParallel dp(w.all(), &comm, tiny_buckets(distributed, false));
      dp.zero_grads();
      w.a.main_grad.copy_from(
          Tensor::from_vector(std::vector<double>(6, rank + 1.0), {2, 3}, DType::kF32));
      w.b.main_grad.copy_from(
          Tensor::from_vector(std::vector<double>(5, 10.0 * (rank + 1)), {5}, DType::kF32));
      dp.finish_grads();
      int64_t owned = 0;
      for (const OwnedSegment& s : dp.owned()) {
        const double want = s.param == &w.a ? 3.0 : 30.0;
        for (int64_t i = 0; i < s.n; ++i) EXPECT_EQ(s.g[i], want);
        owned += s.n;
      }
      // Distributed: the owned segments of the two ranks partition the 11 elements.
      EXPECT_EQ(owned, distributed ? (rank == 0 ? 6 : 5) : 11) << "rank " << rank;
      // Σ g² is the same global value on every rank: 6·9 + 5·900.
      EXPECT_DOUBLE_EQ(dp.grad_square_sum(), 6 * 9.0 + 5 * 900.0);
    });
  }
}

TEST(DataParallel, BucketsReduceDuringBackward) {
  run_ranks(2, [](int rank, StoreClient& store) {
    GlooCommunicator gloo(store, "bw", rank, 2);
    Counting comm(&gloo);
    TwoWeights w;
    DataParallel dp(w.all(), &comm, tiny_buckets(true, true));
    dp.zero_grads();
    // Two micro-batches: only the last one reduces, and it does so inside backward.
    for (int m = 0; m < 2; ++m) {
      dp.set_last_microbatch(m == 1);
      Var x = Var::constant(Tensor::from_vector(seq(3, 1), {1, 3}, DType::kF32));
      Var y = linear(x, Var::param(w.a), Var());
      Var z = linear(y, Var::constant(Tensor::from_vector(seq(2, 1), {1, 2}, DType::kF32)), Var());
      Var bias_use = Var::param(w.b);  // used, with no gradient flowing in
      (void)bias_use;
      backward_with(z, Tensor::from_vector({1.0}, {1, 1}, DType::kF32));
      EXPECT_EQ(comm.reductions, m == 1 ? 2 : 0) << "micro-batch " << m;
    }
    dp.finish_grads();
    EXPECT_EQ(comm.reductions, 2);
  });
}

TEST(DataParallel, ReadinessAheadOfTheOwner) {
  // After the update, bucket "b" is stale: rank 1 owns its tail, so rank 0's copy of those elements
  // is last step's until the gather. A consumer reading b before its owner (the way the GTP
  // prefetch reads the next weight) must call make_ready() first.
  for (bool callbacks : {true, false}) {
    run_ranks(2, [&](int rank, StoreClient& store) {
      GlooCommunicator comm(store, callbacks ? "on" : "off", rank, 2);
      TwoWeights w;
      DataParallel dp(w.all(), &comm, tiny_buckets(true, true));
      dp.readiness_callbacks(callbacks);
      dp.zero_grads();
      dp.finish_grads();
      for (const OwnedSegment& s : dp.owned()) {
        for (int64_t i = 0; i < s.n; ++i) s.w[i] += 1000.f;  // "this step's" values
      }
      dp.after_update();
      const std::vector<double> old_b = seq(5, 100);
      std::vector<double> new_b = old_b;
      for (double& v : new_b) v += 1000;
      // Read without the callback: only this rank's own shard is new.
      std::vector<double> raw = w.b.data.to_vector();
      EXPECT_NE(raw, new_b) << "rank " << rank << " saw other ranks' updates without a gather";
      w.b.make_ready();
      if (callbacks) {
        EXPECT_EQ(w.b.data.to_vector(), new_b) << "rank " << rank;
      } else {
        EXPECT_NE(w.b.data.to_vector(), new_b) << "rank " << rank;
      }
      dp.ensure_all_ready();  // keep the ranks' collective sequences equal before teardown
      EXPECT_EQ(w.b.data.to_vector(), new_b);
    });
  }
}

TEST(DataParallel, GatherAndScatterOwnedState) {
  run_ranks(2, [](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "state", rank, 2);
    TwoWeights w;
    DataParallel dp(w.all(), &comm, tiny_buckets(true, false));
    Tensor owned = Tensor::zeros({dp.owned_numel()}, DType::kF32);
    for (const OwnedSegment& s : dp.owned()) {
      for (int64_t i = 0; i < s.n; ++i) owned.data<float>()[s.state_offset + i] = s.w[i] * 2;
    }
    Tensor full = dp.gather_owned(owned);
    for (Parameter* p : w.all()) {
      auto v = p->data.to_vector();
      for (size_t i = 0; i < v.size(); ++i) {
        EXPECT_EQ(full.data<float>()[dp.flat_offset(p) + i], v[i] * 2) << p->name;
      }
    }
    Tensor back = Tensor::zeros({dp.owned_numel()}, DType::kF32);
    dp.scatter_to_owned(full, back);
    EXPECT_EQ(back.to_vector(), owned.to_vector());
  });
}

TEST(DataParallel, OneRankDistributedOptimizerCopiesNothing) {
  // Note [one-rank DP group]: with distributed_optimizer on, a one-rank group still reduces in
  // place, updates the flat buffers directly and never gathers.
  SelfCommunicator self;
  Counting comm(&self);
  TwoWeights w;
  DataParallel dp(w.all(), &comm, tiny_buckets(true, true));
  ASSERT_EQ(dp.owned().size(), 2u);
  for (const OwnedSegment& s : dp.owned()) {
    EXPECT_EQ(s.g, s.param->main_grad.data<float>()) << s.param->name;  // no shard buffer
    EXPECT_EQ(s.w, s.param->data.data<float>()) << s.param->name;
    EXPECT_EQ(s.n, s.param->data.numel()) << s.param->name;
  }
  dp.zero_grads();
  w.a.main_grad.copy_from(Tensor::from_vector(std::vector<double>(6, 2.0), {2, 3}, DType::kF32));
  dp.finish_grads();
  EXPECT_EQ(dp.owned()[0].param == &w.a ? dp.owned()[0].g[5] : dp.owned()[1].g[5], 2.f);
  EXPECT_EQ(comm.reductions, 2);  // each bucket once
  dp.after_update();
  w.a.make_ready();
  w.b.make_ready();
  dp.ensure_all_ready();
  EXPECT_EQ(comm.gathers, 0);
  EXPECT_EQ(dp.param_gathers_issued(), 0);
}

// One step's backward on TwoWeights: a gets x·dzᵀ through a linear, b a use with no gradient.
void backward_through_a() {
  Var x = Var::constant(Tensor::from_vector(seq(3, 1), {1, 3}, DType::kF32));
  Var y = linear(x, Var::param(*a_param), Var());
  Var z = linear(y, Var::constant(Tensor::from_vector(seq(2, 1), {1, 2}, DType::kF32)), Var());
  backward_with(z, Tensor::from_vector({1.0}, {1, 1}, DType::kF32));
}

TEST(DataParallel, TransientBucketsLiveFromFirstWriteToTheUpdate) {
  // Note [transient gradients]: the same gradients as the persistent buffer, held only from the
  // first write of a step (or the bucket's reduction) to after_update().
  std::vector<double> persistent_a;
  for (bool transient : {false, true}) {
    SelfCommunicator self;
    TwoWeights w;
    DdpOptions o = tiny_buckets(false, false);
    o.transient_grads = transient;
    DataParallel dp(w.all(), &self, o);
    a_param = &w.a;
    EXPECT_EQ(dp.grad_bytes(), transient ? 0 : 11 * 4);
    EXPECT_EQ(w.a.main_grad.defined(), !transient);
    for (int step = 0; step < 2; ++step) {
      dp.zero_grads();
      for (int m = 0; m < 2; ++m) {  // two micro-batches accumulate
        dp.set_last_microbatch(m == 1);
        backward_through_a();
      }
      if (transient) {
        EXPECT_TRUE(w.a.main_grad.defined());
        EXPECT_FALSE(w.b.main_grad.defined());  // nobody wrote it
        EXPECT_EQ(dp.grad_bytes(), 6 * 4);
      }
      dp.finish_grads();
      const std::vector<OwnedSegment>& owned = dp.owned();
      ASSERT_EQ(owned.size(), 2u);
      for (const OwnedSegment& s : owned) {
        ASSERT_NE(s.g, nullptr) << s.param->name;
        EXPECT_EQ(s.g, s.param->main_grad.data<float>()) << s.param->name;
      }
      EXPECT_EQ(w.b.main_grad.to_vector(), std::vector<double>(5, 0.0));
      const std::vector<double> a = w.a.main_grad.to_vector();
      if (!transient) persistent_a = a;
      EXPECT_EQ(a, persistent_a) << "step " << step;  // zeroed at the first write, not summed on
      EXPECT_NE(a, std::vector<double>(6, 0.0));
      dp.after_update();
      EXPECT_EQ(w.a.main_grad.defined(), !transient);
      EXPECT_EQ(dp.grad_bytes(), transient ? 0 : 11 * 4);
    }
    EXPECT_EQ(dp.grad_generation() > 0, transient);
  }
}

TEST(DataParallel, TransientFirstWriteOverwritesAndUnwrittenSlicesReadZero) {
  // Note [first gradient write]: a touched bucket is not zero-filled; the first writer of a
  // parameter is told to overwrite, an adding writer gets its slice zeroed first, and the slices
  // nobody wrote are zeroed before the reduction reads them.
  SelfCommunicator self;
  TwoWeights w;
  DdpOptions o;
  o.transient_grads = true;  // the default bucket size: a and b share one bucket
  o.eager_zero_numel = 0;    // every parameter waits for its first writer
  DataParallel dp(w.all(), &self, o);
  auto vec = [](const std::vector<double>& v) {
    return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::kF32);
  };
  for (int step = 0; step < 2; ++step) {
    dp.zero_grads();
    bool overwrite = false;
    Tensor& ga = w.a.grad_for_write(&overwrite);  // the step's first write: touches the bucket
    EXPECT_TRUE(overwrite) << "step " << step;
    ASSERT_TRUE(w.b.main_grad.defined());
    // Stand in for what the allocator left in the bucket: it is not zero-filled.
    ga.copy_from(vec(std::vector<double>(6, 7.0)).view({2, 3}));
    w.b.main_grad.copy_from(vec(std::vector<double>(5, 9.0)));
    ga.copy_from(vec(seq(6, 1)).view({2, 3}));  // a's writer writes every element
    w.a.grad_for_write(&overwrite);
    EXPECT_FALSE(overwrite) << "a second write adds";
    if (step == 0) {
      Tensor& gb = w.b.grad();  // an adding writer: the slice is zeroed first
      EXPECT_EQ(gb.to_vector(), std::vector<double>(5, 0.0));
      gb.copy_from(vec(seq(5, 1)));
      EXPECT_EQ(w.b.grad().to_vector(), seq(5, 1)) << "zeroed once, not at every grad()";
    }
    dp.finish_grads();
    EXPECT_EQ(w.a.main_grad.to_vector(), seq(6, 1));
    // Step 1: nobody wrote b, so its slice was zeroed for the reduction.
    EXPECT_EQ(w.b.main_grad.to_vector(), step == 0 ? seq(5, 1) : std::vector<double>(5, 0.0))
        << "step " << step;
    EXPECT_FALSE(w.a.grad_unwritten || w.b.grad_unwritten);
    dp.after_update();
  }
  // Small parameters (the default: up to 65536 elements) are zeroed together at the touch.
  TwoWeights e;
  DdpOptions eager;
  eager.transient_grads = true;
  DataParallel edp(e.all(), &self, eager);
  for (int step = 0; step < 2; ++step) {
    edp.zero_grads();
    e.a.grad();  // touches the bucket
    EXPECT_FALSE(e.a.grad_unwritten || e.b.grad_unwritten);
    // Zero at the touch, though step 0 left 9s in the memory the allocator hands out again.
    EXPECT_EQ(e.b.main_grad.to_vector(), std::vector<double>(5, 0.0)) << "step " << step;
    bool written = true;
    Tensor& gb = e.b.grad_for_write(&written);
    EXPECT_FALSE(written) << "a small parameter's writers add";
    gb.copy_from(vec(std::vector<double>(5, 9.0)));
    e.a.grad().copy_from(vec(std::vector<double>(6, 9.0)).view({2, 3}));
    edp.finish_grads();
    EXPECT_EQ(e.b.main_grad.to_vector(), std::vector<double>(5, 9.0));
    edp.after_update();
  }
  // The persistent buffer is zeroed by zero_grads() and never marked: every write adds.
  TwoWeights p;
  DataParallel persistent(p.all(), &self, DdpOptions());
  persistent.zero_grads();
  bool overwrite = true;
  p.a.grad_for_write(&overwrite);
  EXPECT_FALSE(overwrite);
}

TEST(DataParallel, TransientBucketsReduceOverRanks) {
  for (bool distributed : {true, false}) {
    run_ranks(2, [&](int rank, StoreClient& store) {
      GlooCommunicator comm(store, distributed ? "td" : "ta", rank, 2);
      TwoWeights w;
      DdpOptions o = tiny_buckets(distributed, false);
      o.transient_grads = true;
      DataParallel dp(w.all(), &comm, o);
      dp.zero_grads();
      w.a.grad().copy_from(
          Tensor::from_vector(std::vector<double>(6, rank + 1.0), {2, 3}, DType::kF32));
      dp.finish_grads();  // b's bucket: allocated and zeroed for its reduction
      for (const OwnedSegment& s : dp.owned()) {
        const double want = s.param == &w.a ? 3.0 : 0.0;
        for (int64_t i = 0; i < s.n; ++i) EXPECT_EQ(s.g[i], want) << s.param->name;
      }
      EXPECT_DOUBLE_EQ(dp.grad_square_sum(), 6 * 9.0);
      dp.after_update();
      EXPECT_EQ(dp.grad_bytes(), 0);
    });
  }
}

TEST(DataParallel, SingleRankIsThePlainPath) {
  SelfCommunicator self;
  TwoWeights w;
  DataParallel dp(w.all(), &self, DdpOptions{});
  EXPECT_EQ(dp.owned_numel(), 11);
  EXPECT_EQ(w.a.data.to_vector(), seq(6, 0));  // values survive the rebinding
  EXPECT_EQ(w.b.data.to_vector(), seq(5, 100));
}

}  // namespace
}  // namespace gtron::parallel
