// Communicator::all_to_all (all-to-all-v) with N threads acting as ranks over Gloo: uneven and zero
// counts, a rank with nothing to send or receive, dtypes, the order against other collectives, a
// capture that replays it, the one-rank communicators, and the "not built" error of a backend
// without it.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "model/stream.h"
#include "model/tensor.h"
#include "parallel/gloo_communicator.h"
#include "parallel/self_communicator.h"
#include "tests/parallel/ranks.h"

namespace gtron::parallel {
namespace {

GlooOptions test_options() {
  GlooOptions o;
  o.timeout = std::chrono::seconds(15);  // a failing rank fails the test instead of hanging it
  return o;
}

void run_ranks(int n, const std::function<void(int rank, StoreClient& store)>& fn) {
  test_util::run_ranks(n, fn, std::chrono::seconds(15));
}

// Elements rank `from` sends rank `to`: uneven, and zero for some pairs (from + 2·to ≡ 0 mod 3),
// the own block included on some ranks.
int64_t count(int from, int to) { return (from + 2 * to) % 3; }
// The i-th element rank `from` sends rank `to`: says where it came from and went.
double element(int from, int to, int64_t i) { return 1000.0 * from + 100.0 * to + i; }

struct Blocks {
  Tensor in, out;
  std::vector<int64_t> send, recv;
};

Blocks blocks(int rank, int n, DType dtype, const std::function<int64_t(int, int)>& counts) {
  Blocks b;
  std::vector<double> values;
  for (int p = 0; p < n; ++p) {
    b.send.push_back(counts(rank, p));
    b.recv.push_back(counts(p, rank));
    for (int64_t i = 0; i < b.send.back(); ++i) values.push_back(element(rank, p, i));
  }
  const int64_t received = [&] {
    int64_t s = 0;
    for (int64_t c : b.recv) s += c;
    return s;
  }();
  b.in = Tensor::from_vector(values, {static_cast<int64_t>(values.size())}, dtype);
  b.out = Tensor::from_vector(std::vector<double>(static_cast<size_t>(received), -1.0), {received},
                              dtype);
  return b;
}

std::vector<double> expected(int rank, int n, const std::function<int64_t(int, int)>& counts) {
  std::vector<double> want;
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < counts(q, rank); ++i) want.push_back(element(q, rank, i));
  return want;
}

class AllToAllTest : public testing::TestWithParam<int> {};

TEST_P(AllToAllTest, UnevenAndZeroCountsArriveInRankOrder) {
  const int n = GetParam();
  run_ranks(n, [n](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "a2a", rank, n, test_options());
    for (DType dtype : {DType::kF32, DType::kF64, DType::kI32}) {
      Blocks b = blocks(rank, n, dtype, count);
      comm.all_to_all(b.in, b.send, b.out, b.recv).synchronize();
      EXPECT_EQ(b.out.to_vector(), expected(rank, n, count))
          << "rank " << rank << " of " << n << ", " << dtype_name(dtype);
    }
  });
}

TEST_P(AllToAllTest, ARankWithNothingToSendOrReceiveStillTakesPart) {
  const int n = GetParam();
  // Rank 0 neither sends nor receives; the others send rank r + 1 (mod n, skipping 0) 5 elements.
  auto counts = [n](int from, int to) -> int64_t {
    if (from == 0 || to == 0) return 0;
    return to == (from % (n - 1)) + 1 ? 5 : 0;
  };
  run_ranks(n, [n, counts](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "empty", rank, n, test_options());
    Blocks b = blocks(rank, n, DType::kF32, counts);
    if (rank == 0) {
      EXPECT_EQ(b.in.numel(), 0);
      EXPECT_EQ(b.out.numel(), 0);
    }
    comm.all_to_all(b.in, b.send, b.out, b.recv).synchronize();
    EXPECT_EQ(b.out.to_vector(), expected(rank, n, counts)) << "rank " << rank;
    // The communicator still works afterwards.
    Tensor t = Tensor::from_vector({1.0}, {1}, DType::kF32);
    comm.all_reduce(t).synchronize();
    EXPECT_EQ(t.item(), n);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAllTest, testing::Values(2, 3, 4));

TEST(AllToAll, QueuedBetweenOtherCollectivesKeepsTheirOrder) {
  const int n = 3;
  run_ranks(n, [](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "order", rank, n, test_options());
    Tensor before = Tensor::from_vector({static_cast<double>(rank)}, {1}, DType::kF32);
    Blocks b = blocks(rank, n, DType::kF32, count);
    Tensor after = Tensor::from_vector({2.0 * rank}, {1}, DType::kF32);
    Work w1 = comm.all_reduce(before);
    Work w2 = comm.all_to_all(b.in, b.send, b.out, b.recv);
    Work w3 = comm.all_reduce(after);
    w3.synchronize();
    EXPECT_TRUE(w1.completed());
    EXPECT_TRUE(w2.completed());
    EXPECT_EQ(before.item(), 3.0);
    EXPECT_EQ(after.item(), 6.0);
    EXPECT_EQ(b.out.to_vector(), expected(rank, n, count));
  });
}

TEST(AllToAll, ACaptureReplaysItOverNewValues) {
  const int n = 2;
  run_ranks(n, [](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "capture", rank, n, test_options());
    Blocks b = blocks(rank, n, DType::kF32, count);
    Stream stream(Device::cpu());
    StreamGuard guard(stream);
    stream.begin_capture();
    Work w = comm.all_to_all(b.in, b.send, b.out, b.recv);
    w.wait(stream);
    std::vector<std::function<void()>> graph = stream.end_capture();
    EXPECT_EQ(b.out.to_vector(), std::vector<double>(static_cast<size_t>(b.out.numel()), -1.0))
        << "nothing runs while capturing";
    const std::vector<double> original = b.in.to_vector();
    for (int replay = 1; replay <= 2; ++replay) {
      std::vector<double> v = original;
      for (double& x : v) x += replay;
      b.in.copy_from(Tensor::from_vector(v, b.in.shape(), DType::kF32));
      for (auto& fn : graph) fn();
      std::vector<double> want = expected(rank, n, count);
      for (double& x : want) x += replay;
      EXPECT_EQ(b.out.to_vector(), want) << "replay " << replay;
    }
  });
}

TEST(AllToAll, OneRankCommunicatorsCopyTheirOwnBlock) {
  Tensor in = Tensor::from_vector({1, 2, 3}, {3}, DType::kF32);
  Tensor out = Tensor::zeros({3}, DType::kF32);
  SelfCommunicator self;
  self.all_to_all(in, {3}, out, {3}).synchronize();
  EXPECT_EQ(out.to_vector(), (std::vector<double>{1, 2, 3}));
  test_util::run_ranks(1, [&](int rank, StoreClient& store) {
    GlooCommunicator comm(store, "one", rank, 1, test_options());
    Tensor out1 = Tensor::zeros({3}, DType::kF32);
    comm.all_to_all(in, {3}, out1, {3}).synchronize();
    EXPECT_EQ(out1.to_vector(), (std::vector<double>{1, 2, 3}));
  });
}

// A backend that has not built all_to_all: the base class's answer.
class NoAllToAll final : public SelfCommunicator {
 public:
  Work all_to_all(const Tensor& in, const std::vector<int64_t>& send, Tensor& out,
                  const std::vector<int64_t>& recv) override {
    return Communicator::all_to_all(in, send, out, recv);
  }
};

TEST(AllToAll, ABackendWithoutItSaysSo) {
  NoAllToAll comm;
  Tensor in = Tensor::zeros({1}, DType::kF32), out = Tensor::zeros({1}, DType::kF32);
  try {
    comm.all_to_all(in, {1}, out, {1});
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("all_to_all is not built for communicator 'self'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace gtron::parallel
