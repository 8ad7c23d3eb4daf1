// The vocabulary-parallel embedding and cross-entropy on CUDA (issue 17, acceptance 5), against
// their single-GPU twins on random data: over a one-rank NCCL TP group they give embedding() and
// cross_entropy() bit for bit (values and gradients, f32 and bf16, accumulating and in place);
// and a table split over two shards (a fake two-rank group whose sums are done by hand) gives the
// full lookup and the full table gradient, shard by shard. Tagged "gpu".
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "model/ops/embedding.h"
#include "model/ops/loss.h"
#include "model/ops/vocab_parallel.h"
#include "model/stream.h"
#include "parallel/nccl_communicator.h"
#include "parallel/tensor_parallel.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

// A one-rank TP group over NCCL (the trainer's at GTRON_TEST_GRID_OF_ONE=tp).
struct NcclGroupOfOne {
  parallel::StoreServer server;
  parallel::StoreClient store{"127.0.0.1", server.port()};
  parallel::NcclCommunicator comm{store, "vp1", 0, 1, Device::cuda(0)};
  parallel::CommTensorParallel group{&comm};
};

// Rank `rank` of a two-rank group whose reductions do nothing: each shard's op returns its own
// part, and the test sums the parts itself (the lookup's only reduction is that sum).
class ShardGroup final : public TensorParallelGroup {
 public:
  explicit ShardGroup(int rank) : rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  void all_reduce(Tensor&, TpReduce) override {}
  void all_gather(const Tensor&, Tensor&) override { GTRON_CHECK(false, "not used here"); }

 private:
  int rank_;
};

// [4, 29] ids in [0, V) with repeats (several rows add into one table row), or for targets every
// fifth masked.
Tensor ids(int64_t V, bool mask) {
  std::vector<int32_t> v;
  for (int i = 0; i < 4 * 29; ++i) {
    const int32_t id = static_cast<int32_t>((i * 37 + i / 3) % V);
    v.push_back(mask && i % 5 == 0 ? kMaskedTarget : id);
  }
  return Tensor::from_ints(v, {4, 29});
}

// V = 181 real columns of Vp = 192 (a padded tail), N = 116 rows.
constexpr int64_t kV = 181, kVp = 192;

testing::OpCase ce_case(bool parallel, bool overwrite, TensorParallelGroup* g) {
  const Tensor targets = ids(kV, /*mask=*/true);
  testing::OpCase c;
  c.f = [=](const std::vector<Var>& in, const std::vector<Var>&) {
    Var scaled = scale(in[0], 1.0);  // an op output: the in-place gradient may take its buffer
    return parallel ? vocab_parallel_cross_entropy(scaled, targets, kV, 0, *g, overwrite)
                    : cross_entropy(scaled, targets, kV, overwrite);
  };
  c.inputs = {testing::randn_tensor({4, 29, kVp}, 5, 3.0)};
  return c;
}

TEST(VocabParallelCuda, CrossEntropyAtOneRankIsTheSingleGpuOne) {
  GTRON_REQUIRE_GPU();
  NcclGroupOfOne one;
  for (DType act : {DType::kF32, DType::kBF16}) {
    for (bool overwrite : {false, true}) {
      const testing::OpValues plain =
          testing::run_case(ce_case(false, overwrite, nullptr), Device::cuda(0), act, {});
      const testing::OpValues tp =
          testing::run_case(ce_case(true, overwrite, &one.group), Device::cuda(0), act, {});
      ASSERT_EQ(plain.size(), tp.size());
      EXPECT_EQ(tp[0], plain[0]) << dtype_name(act) << " loss, overwrite " << overwrite;
      EXPECT_EQ(tp[1], plain[1]) << dtype_name(act) << " dlogits, overwrite " << overwrite;
    }
  }
}

testing::OpCase embedding_case(bool parallel, TensorParallelGroup* g) {
  const Tensor tokens = ids(kVp, /*mask=*/false);
  testing::OpCase c;
  c.f = [=](const std::vector<Var>&, const std::vector<Var>& p) {
    return parallel ? vocab_parallel_embedding(tokens, p[0], 0, *g) : embedding(tokens, p[0]);
  };
  c.params = {testing::randn_tensor({kVp, 72}, 6)};
  return c;
}

TEST(VocabParallelCuda, EmbeddingAtOneRankIsTheSingleGpuOne) {
  GTRON_REQUIRE_GPU();
  NcclGroupOfOne one;
  for (DType act : {DType::kF32, DType::kBF16}) {
    // Pre-filled gradients: the table gradient accumulates (+=) in both.
    const testing::OpValues plain =
        testing::run_case(embedding_case(false, nullptr), Device::cuda(0), act, {});
    const testing::OpValues tp =
        testing::run_case(embedding_case(true, &one.group), Device::cuda(0), act, {});
    EXPECT_EQ(tp, plain) << dtype_name(act);
  }
}

// One shard's lookup of every token and its table gradient for the upstream gradient dy.
struct ShardRun {
  std::vector<double> y, dtable;
};

ShardRun run_shard(const Tensor& tokens, const Tensor& table, int64_t v0, TensorParallelGroup* g,
                   const Tensor& dy) {
  const Device gpu = Device::cuda(0);
  Parameter p("table", table.to(gpu), false);
  Var out = g ? vocab_parallel_embedding(tokens, Var::param(p), v0, *g)
              : embedding(tokens, Var::param(p));
  backward_with(out, dy.to(gpu));
  current_stream(gpu).synchronize();
  return {out.value().to(Device::cpu()).to_vector(), p.main_grad.to(Device::cpu()).to_vector()};
}

TEST(VocabParallelCuda, TwoShardsSumToTheFullLookup) {
  GTRON_REQUIRE_GPU();
  const int64_t C = 40, half = kVp / 2;
  const Tensor tokens = ids(kVp, /*mask=*/false);
  const Tensor table = testing::randn_tensor({kVp, C}, 7, 1.0, DType::kF32);
  const Tensor dy = testing::randn_tensor({4, 29, C}, 8, 1.0, DType::kF32);
  const ShardRun full = run_shard(tokens, table, 0, nullptr, dy);
  ShardGroup g0(0), g1(1);
  const ShardRun s0 = run_shard(tokens, table.rows(0, half).clone(), 0, &g0, dy);
  const ShardRun s1 = run_shard(tokens, table.rows(half, kVp).clone(), half, &g1, dy);
  // Lookups: exactly one shard holds each token's row, the other gives zeros.
  std::vector<double> sum(full.y.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = s0.y[i] + s1.y[i];
  EXPECT_EQ(sum, full.y);
  int64_t zeros = 0;
  for (size_t i = 0; i < s0.y.size(); ++i) zeros += s0.y[i] == 0 && s1.y[i] != 0;
  EXPECT_GT(zeros, 0);  // shard 0 really gave zero rows for shard 1's tokens
  // Gradients: shard r's table gradient is rows [r·Vp/2, (r+1)·Vp/2) of the full one, bit for
  // bit (each row adds the same dy rows in the same order).
  std::vector<double> joined = s0.dtable;
  joined.insert(joined.end(), s1.dtable.begin(), s1.dtable.end());
  EXPECT_EQ(joined, full.dtable);
}

}  // namespace
}  // namespace gtron
