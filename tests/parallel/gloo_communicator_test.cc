// Gloo collectives with N threads acting as ranks (each with its own store client): exact results,
// asynchrony, queue order, CPU capture/replay, failure reporting, and the DP x GTP grid.
#include "parallel/gloo_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "model/check.h"
#include "model/stream.h"
#include "model/tensor.h"
#include "tests/parallel/ranks.h"

namespace gtron::parallel {
namespace {

using std::chrono::milliseconds;

GlooOptions test_options() {
  GlooOptions o;
  o.timeout = std::chrono::seconds(15);  // a failing rank fails the test instead of hanging it
  return o;
}

// Ranks as threads; a failing rank fails the test instead of hanging it.
void run_ranks(int n, const std::function<void(int rank, StoreClient& store)>& fn) {
  test_util::run_ranks(n, fn, std::chrono::seconds(15));
}

std::vector<double> values(const Tensor& t) { return t.to_vector(); }

class GlooCollectivesTest : public testing::TestWithParam<int> {};

TEST_P(GlooCollectivesTest, ResultsAreExact) {
  const int n = GetParam();
  run_ranks(n, [n](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "c", rank, n, test_options());
    EXPECT_EQ(comm.rank(), rank);
    EXPECT_EQ(comm.size(), n);

    // all_gather, f32 and i32 (bytes move whatever the dtype).
    Tensor in =
        Tensor::from_vector({rank * 10.0, rank * 10.0 + 1, rank * 10.0 + 2}, {3}, DType::kF32);
    Tensor out = Tensor::zeros({n, 3}, DType::kF32);
    Tensor in_i = Tensor::from_ints({rank, -rank}, {2});
    Tensor out_i = Tensor::zeros({2 * n}, DType::kI32);
    Work w1 = comm.all_gather(in, out);
    Work w2 = comm.all_gather(in_i, out_i);
    w1.synchronize();
    w2.synchronize();
    std::vector<double> want, want_i;
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < 3; ++i) want.push_back(r * 10.0 + i);
      want_i.push_back(r);
      want_i.push_back(-r);
    }
    EXPECT_EQ(values(out), want);
    EXPECT_EQ(values(out_i), want_i);

    // reduce_scatter sum (f32): in[j] = (rank + 1) * (j + 1) / 2, exact in binary.
    std::vector<double> rs_in;
    for (int j = 0; j < 3 * n; ++j) rs_in.push_back((rank + 1) * (j + 1) * 0.5);
    Tensor rs = Tensor::from_vector(rs_in, {3 * n}, DType::kF32);
    Tensor chunk = Tensor::zeros({3}, DType::kF32);
    comm.reduce_scatter(rs, chunk).synchronize();
    const double ranks_sum = n * (n + 1) / 2.0;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(values(chunk)[i], ranks_sum * (rank * 3 + i + 1) * 0.5);
    EXPECT_EQ(values(rs), rs_in) << "reduce_scatter must not modify its input";

    // reduce_scatter max (f64): the largest contribution comes from the last rank.
    Tensor mx_in =
        Tensor::from_vector(std::vector<double>(2 * n, rank - 0.25), {2 * n}, DType::kF64);
    Tensor mx = Tensor::zeros({2}, DType::kF64);
    comm.reduce_scatter(mx_in, mx, ReduceOp::kMax).synchronize();
    EXPECT_EQ(values(mx), std::vector<double>(2, n - 1.25));

    // all_reduce sum (f64) and max (f32).
    Tensor s = Tensor::from_vector({1.0 * rank, 2.0, -0.5 * rank}, {3}, DType::kF64);
    comm.all_reduce(s).synchronize();
    EXPECT_EQ(values(s), (std::vector<double>{ranks_sum - n, 2.0 * n, -0.5 * (ranks_sum - n)}));
    Tensor m = Tensor::from_vector({1.0 * rank, -1.0 * rank}, {2}, DType::kF32);
    comm.all_reduce(m, ReduceOp::kMax).synchronize();
    EXPECT_EQ(values(m), (std::vector<double>{n - 1.0, 0.0}));

    // broadcast from the last rank.
    Tensor b = Tensor::from_vector({rank + 0.5, rank * 2.0}, {2}, DType::kF32);
    comm.broadcast(b, n - 1).synchronize();
    EXPECT_EQ(values(b), (std::vector<double>{n - 0.5, 2.0 * (n - 1)}));
    comm.barrier();
  });
}

TEST_P(GlooCollectivesTest, ReducedValuesAreBitIdenticalOnEveryRank) {
  const int n = GetParam();
  const int64_t numel = 3000;  // several ring segments per rank, sums that round
  std::vector<std::vector<float>> sums(n), chunks(n);
  run_ranks(n, [&](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "c", rank, n, test_options());
    std::mt19937 gen(1234 + rank);
    std::uniform_real_distribution<double> dist(-1.0, 1.0);
    std::vector<double> v(numel);
    for (double& x : v) x = dist(gen) * std::pow(10.0, static_cast<int>(dist(gen) * 4));
    Tensor a = Tensor::from_vector(v, {numel}, DType::kF32);
    Tensor in = a.clone();
    Tensor chunk = Tensor::zeros({numel / n}, DType::kF32);
    Work w1 = comm.all_reduce(a);
    Work w2 = comm.reduce_scatter(in, chunk);
    w1.synchronize();
    w2.synchronize();
    sums[rank].assign(a.data<float>(), a.data<float>() + numel);
    chunks[rank].assign(chunk.data<float>(), chunk.data<float>() + numel / n);
  });
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(std::memcmp(sums[r].data(), sums[0].data(), numel * sizeof(float)), 0) << r;
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(std::memcmp(chunks[r].data(), sums[0].data() + r * (numel / n),
                          (numel / n) * sizeof(float)),
              0)
        << "rank " << r << "'s chunk differs from the all_reduce result";
  }
}

TEST_P(GlooCollectivesTest, CallsReturnBeforePeersJoin) {
  const int n = GetParam();
  std::promise<void> issued;
  std::shared_future<void> issued_future = issued.get_future().share();
  run_ranks(n, [&](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "c", rank, n, test_options());
    Tensor x = Tensor::from_vector({rank + 1.0}, {1}, DType::kF32);
    if (rank == 0) {
      // No peer can have joined yet: they wait for `issued`, set only after the call returns.
      Work w = comm.all_reduce(x);
      EXPECT_FALSE(w.completed());
      issued.set_value();
      w.synchronize();
      EXPECT_TRUE(w.completed());
    } else {
      EXPECT_EQ(issued_future.wait_for(std::chrono::seconds(10)), std::future_status::ready)
          << "rank 0's all_reduce blocked until its peers joined";
      comm.all_reduce(x).synchronize();
    }
    EXPECT_EQ(values(x)[0], n * (n + 1) / 2.0);
  });
}

TEST_P(GlooCollectivesTest, QueuedCollectivesRunInSubmissionOrder) {
  const int n = GetParam();
  run_ranks(n, [n](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "c", rank, n, test_options());
    // Each step reads the previous one's output: any reordering changes the numbers.
    Tensor x = Tensor::from_vector({rank + 1.0, 1.0}, {2}, DType::kF64);
    Tensor y = Tensor::zeros({2 * n}, DType::kF64);
    Tensor z = Tensor::zeros({2}, DType::kF64);
    std::vector<Work> works;
    works.push_back(comm.all_reduce(x));         // x = [S, n]
    works.push_back(comm.all_gather(x, y));      // y = [S, n] * n
    works.push_back(comm.reduce_scatter(y, z));  // z = [n S, n^2]
    works.push_back(comm.broadcast(z, 0));
    works.push_back(comm.all_reduce(z, ReduceOp::kMax));
    works.back().synchronize();
    for (size_t i = 0; i < works.size(); ++i) EXPECT_TRUE(works[i].completed()) << i;
    const double s = n * (n + 1) / 2.0;
    EXPECT_EQ(values(x), (std::vector<double>{s, 1.0 * n}));
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(values(y)[2 * r], s);
      EXPECT_EQ(values(y)[2 * r + 1], n);
    }
    EXPECT_EQ(values(z), (std::vector<double>{n * s, 1.0 * n * n}));
  });
}

TEST_P(GlooCollectivesTest, CapturedCollectivesReissueAtEveryReplay) {
  const int n = GetParam();
  run_ranks(n, [n](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "c", rank, n, test_options());
    Stream stream(Device::cpu());
    StreamGuard guard(stream);
    Tensor x = Tensor::from_vector({1.0}, {1}, DType::kF64);
    stream.begin_capture();
    Work w = comm.all_reduce(x);
    w.wait(stream);
    std::vector<std::function<void()>> graph = stream.end_capture();
    EXPECT_EQ(values(x)[0], 1.0) << "nothing runs while capturing";
    for (int replay = 1; replay <= 3; ++replay) {
      for (auto& fn : graph) fn();
      EXPECT_EQ(values(x)[0], std::pow(n, replay)) << "replay " << replay;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooCollectivesTest, testing::Values(2, 4));

TEST(GlooFailureTest, ATimeoutBreaksTheCommunicatorWithAClearError) {
  std::promise<void> done;
  std::shared_future<void> done_future = done.get_future().share();
  run_ranks(2, [&](int rank, StoreClient& store) {
    GlooOptions o;
    o.timeout = milliseconds(300);
    GlooCommunicator comm(store, "fails", rank, 2, o);
    if (rank == 1) {  // never joins: rank 0's collective times out
      EXPECT_EQ(done_future.wait_for(std::chrono::seconds(20)), std::future_status::ready);
      return;
    }
    Tensor x = Tensor::from_vector({1.0}, {1}, DType::kF32);
    Work w = comm.all_reduce(x);
    std::string first;
    try {
      w.synchronize();
      ADD_FAILURE() << "all_reduce without its peer completed";
    } catch (const CommError& e) {
      first = e.what();
    }
    EXPECT_NE(first.find("Gloo all_reduce on communicator 'fails' (rank 0 of 2) failed"),
              std::string::npos)
        << first;
    // Later collectives fail at once, with the first error.
    Stream stream(Device::cpu());
    try {
      comm.broadcast(x, 0).wait(stream);
      ADD_FAILURE() << "a broken communicator ran a broadcast";
    } catch (const CommError& e) {
      EXPECT_EQ(std::string(e.what()), first);
    }
    done.set_value();
  });
}

TEST(GridTest, LayoutIsTheSameArithmeticOnEveryRank) {
  GridLayout l = grid_layout(5, 8, 2);
  EXPECT_EQ(l.dp_size, 4);
  EXPECT_EQ(l.gtp_group, 2);
  EXPECT_EQ(l.gtp_rank, 1);
  EXPECT_EQ(l.dp_group, 1);
  EXPECT_EQ(l.dp_rank, 2);
  EXPECT_EQ(l.gtp_members, (std::vector<int>{4, 5}));
  EXPECT_EQ(l.dp_members, (std::vector<int>{1, 3, 5, 7}));
  try {
    grid_layout(0, 4, 3);
    ADD_FAILURE() << "gtp 3 accepted for a world of 4";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("parallel gtp = 3 does not divide the world size 4", 0),
              0u)
        << e.what();
  }
  EXPECT_THROW(grid_layout(0, 4, 0), UserError);
}

TEST(GridTest, TensorParallelIsTheMostLocalAxis) {
  // World 8 = DP 2 x GTP 2 x TP 2: rank = (dp * 2 + gtp) * 2 + tp.
  GridLayout l = grid_layout(5, 8, 2, 2);  // dp 1, gtp 0, tp 1
  EXPECT_EQ(l.tp_size, 2);
  EXPECT_EQ(l.tp_rank, 1);
  EXPECT_EQ(l.tp_group, 2);
  EXPECT_EQ(l.gtp_rank, 0);
  EXPECT_EQ(l.dp_rank, 1);
  EXPECT_EQ(l.dp_size, 2);
  EXPECT_EQ(l.data_size, 4);
  EXPECT_EQ(l.data_rank, 2);
  EXPECT_EQ(l.tp_members, (std::vector<int>{4, 5}));
  EXPECT_EQ(l.gtp_members, (std::vector<int>{5, 7}));
  EXPECT_EQ(l.dp_members, (std::vector<int>{1, 5}));
  EXPECT_EQ(l.data_members, (std::vector<int>{1, 3, 5, 7}));
  // TP = 1 keeps the DP x GTP layout of before.
  GridLayout one = grid_layout(5, 8, 2, 1);
  EXPECT_EQ(one.gtp_members, (std::vector<int>{4, 5}));
  EXPECT_EQ(one.dp_members, (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(one.data_members, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  try {
    grid_layout(0, 4, 2, 4);
    ADD_FAILURE() << "gtp 2 x tp 4 accepted for a world of 4";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel tp = 4"), std::string::npos) << e.what();
  }
}

TEST(GridTest, World4Tp2GroupsCommunicateAmongTheirMembers) {
  run_ranks(4, [](int rank, StoreClient& store) {
    Grid grid = make_gloo_grid(store, rank, 4, 1, 2, test_options());
    ASSERT_NE(grid.tp, nullptr);
    ASSERT_NE(grid.data, nullptr);
    EXPECT_EQ(grid.data_group(), grid.data.get());
    Tensor t = Tensor::from_vector({1.0 * rank}, {1}, DType::kF64);
    Tensor d = Tensor::from_vector({1.0 * rank}, {1}, DType::kF64);
    Work wt = grid.tp->all_reduce(t);
    Work wd = grid.data->all_reduce(d);
    wt.synchronize();
    wd.synchronize();
    EXPECT_EQ(values(t)[0], rank / 2 * 4 + 1);  // {0, 1} or {2, 3}
    EXPECT_EQ(values(d)[0], rank % 2 * 2 + 2);  // {0, 2} or {1, 3}
  });
}

TEST(GridTest, World4Gtp2GroupsCommunicateAmongTheirMembers) {
  run_ranks(4, [](int rank, StoreClient& store) {
    Grid grid = make_gloo_grid(store, rank, 4, 2, 1, test_options());
    const GridLayout& l = grid.layout;
    const std::vector<int> gtp_members = {rank / 2 * 2, rank / 2 * 2 + 1};
    const std::vector<int> dp_members = {rank % 2, rank % 2 + 2};
    EXPECT_EQ(l.gtp_members, gtp_members);
    EXPECT_EQ(l.dp_members, dp_members);
    EXPECT_EQ(grid.world->size(), 4);
    EXPECT_EQ(grid.world->rank(), rank);
    EXPECT_EQ(grid.gtp->size(), 2);
    EXPECT_EQ(grid.gtp->rank(), rank % 2);
    EXPECT_EQ(grid.dp->size(), 2);
    EXPECT_EQ(grid.dp->rank(), rank / 2);

    // Membership as seen by the communicators: gather every member's world rank.
    Tensor me = Tensor::from_vector({1.0 * rank}, {1}, DType::kF32);
    Tensor gtp_ranks = Tensor::zeros({2}, DType::kF32);
    Tensor dp_ranks = Tensor::zeros({2}, DType::kF32);
    grid.gtp->all_gather(me, gtp_ranks).synchronize();
    grid.dp->all_gather(me, dp_ranks).synchronize();
    EXPECT_EQ(values(gtp_ranks), std::vector<double>(gtp_members.begin(), gtp_members.end()));
    EXPECT_EQ(values(dp_ranks), std::vector<double>(dp_members.begin(), dp_members.end()));

    // A reduce over each group sums exactly its members' contributions.
    Tensor g = Tensor::from_vector({1.0 * rank}, {1}, DType::kF64);
    Tensor d = Tensor::from_vector({1.0 * rank}, {1}, DType::kF64);
    Tensor w = Tensor::from_vector({1.0 * rank}, {1}, DType::kF64);
    Work wg = grid.gtp->all_reduce(g);
    Work wd = grid.dp->all_reduce(d);
    Work ww = grid.world->all_reduce(w);
    wg.synchronize();
    wd.synchronize();
    ww.synchronize();
    EXPECT_EQ(values(g)[0], gtp_members[0] + gtp_members[1]);
    EXPECT_EQ(values(d)[0], dp_members[0] + dp_members[1]);
    EXPECT_EQ(values(w)[0], 6.0);
  });
}

TEST(GridTest, DegenerateGroupsOfOneRankWork) {
  // gtp == 1: every GTP group is a single rank; the DP group is the world.
  run_ranks(2, [](int rank, StoreClient& store) {
    Grid grid = make_gloo_grid(store, rank, 2, 1, 1, test_options());
    EXPECT_EQ(grid.gtp->size(), 1);
    EXPECT_EQ(grid.dp->size(), 2);
    Tensor in = Tensor::from_vector({1.0 + rank, 2.0 + rank}, {2}, DType::kF32);
    Tensor out = Tensor::zeros({2}, DType::kF32);
    Tensor half = Tensor::zeros({2}, DType::kF32);
    grid.gtp->all_gather(in, out).synchronize();
    grid.gtp->reduce_scatter(in, half).synchronize();
    EXPECT_EQ(values(out), values(in));
    EXPECT_EQ(values(half), values(in));
    grid.gtp->all_reduce(in).synchronize();
    grid.gtp->broadcast(in, 0).synchronize();
    grid.gtp->barrier();
    EXPECT_EQ(values(in), (std::vector<double>{1.0 + rank, 2.0 + rank}));
    grid.dp->all_reduce(in).synchronize();
    EXPECT_EQ(values(in), (std::vector<double>{3.0, 5.0}));
  });
}

}  // namespace
}  // namespace gtron::parallel
