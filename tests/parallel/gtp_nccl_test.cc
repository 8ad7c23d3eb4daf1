// GTP over NCCL on one GPU (G = 1, a world of one rank), tagged "gpu": the CUDA path of GtpWeights
// — device gather buffers, bf16 gathers of f32 shards, wgrads into send buffers of the NCCL
// symmetric pool (ncclMemAlloc + window registration), reduce-scatters on the communicator's
// stream, finalize on the compute stream — trains a GPT + MTP the same as the plain bf16 path, and
// CUDA graphs (layers, full) over it, with the NCCL stream forked and joined inside each capture,
// reproduce its eager losses and gradients bit for bit. The multi-rank logic is tested on CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "graphs/model_graphs.h"
#include "model/device.h"
#include "model/gpt.h"
#include "model/mixed_precision.h"
#include "model/stream.h"
#include "parallel/gtp.h"
#include "parallel/nccl_communicator.h"
#include "parallel/store.h"

namespace gtron::parallel {
namespace {

struct Curve {
  std::vector<double> losses;
  std::vector<std::vector<double>> grads;  // every parameter's main_grad after the last backward
  std::string pool_backend;
  int64_t replays = 0;
  CommTiming timing;  // of the GTP communicator (eager collectives only)
};

// `gtp`: GtpWeights over NCCL (else the plain single-GPU access); `bf16`: bf16 gathers / shadows
// (else fp32 throughout); `symmetric`: send buffers in NCCL windows (else plain device memory).
Curve train(bool gtp, graphs::Scope scope, int micro_batches, bool bf16 = true,
            bool symmetric = true) {
  const Device dev = Device::cuda(0);
  Stream& stream = current_stream(dev);
  StoreServer server;
  StoreClient store("127.0.0.1", server.port());
  GPTConfig c;
  c.vocab_size = 64;
  c.context_length = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.mtp_depth = 2;
  GPT model(c, DType::kF32, dev, 7);
  std::unique_ptr<NcclCommunicator> comm;
  std::unique_ptr<GtpWeights> weights;
  Bf16Weights shadows;
  if (gtp) {
    comm = std::make_unique<NcclCommunicator>(store, "gtp", 0, 1, dev);
    comm->set_timing(true);
    std::vector<Parameter*> sharded;
    for (Parameter* p : model.parameters()) {
      if (p->data.rank() == 2 && p->name != "wpe.weight") sharded.push_back(p);
    }
    weights = std::make_unique<GtpWeights>(
        sharded, comm.get(), GtpOptions{true, bf16 ? DType::kBF16 : DType::kF32},
        symmetric ? make_nccl_symmetric_backend(*comm) : nullptr);
    model.set_weight_access(weights.get());
  } else if (bf16) {
    model.set_weight_access(&shadows);
  }
  graphs::ModelGraphs graphed(model, scope, dev);

  const int64_t B = 2, T = 16;
  Tensor window = Tensor::empty({B, T + 1}, DType::kI32, dev, &stream);
  Tensor seed = Tensor::from_vector({1.0}, Shape{}, DType::kF32).to(dev, &stream);
  Curve curve;
  for (int m = 0; m < micro_batches; ++m) {
    std::vector<int32_t> tok(static_cast<size_t>(B * (T + 1)));
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>((i * 7 + m * 13) % 64);
    window.copy_from(Tensor::from_ints(tok, {B, T + 1}), &stream);
    for (Parameter* p : model.parameters()) p->zero_grad();
    GPTOutput out = graphed.forward(window);
    backward_with(out.loss, seed);
    if (weights) weights->finish_backward();
    curve.losses.push_back(out.loss.value().item());
  }
  for (Parameter* p : model.parameters()) curve.grads.push_back(p->main_grad.to_vector());
  if (weights) curve.pool_backend = weights->pool_backend();
  if (comm) curve.timing = comm->take_timing();
  curve.replays = graphed.stats().replays;
  stream.synchronize();
  model.set_weight_access(nullptr);
  return curve;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(a[i]));
  }
  return den > 0 ? num / den : num;
}

TEST(GtpNccl, OneRankGtpTrainsLikeThePlainBf16Path) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  const Curve plain = train(false, graphs::Scope::kNone, 4);
  const Curve gtp = train(true, graphs::Scope::kNone, 4);
  EXPECT_NE(gtp.pool_backend.find("nccl"), std::string::npos) << gtp.pool_backend;
  // log.comm_timing's instrument: every eager gather and reduce-scatter was timed.
  EXPECT_GT(gtp.timing.collectives, 0);
  EXPECT_GT(gtp.timing.all_gather_ms, 0);
  EXPECT_GT(gtp.timing.reduce_scatter_ms, 0);
  EXPECT_GE(gtp.timing.exposed_ms, 0);
  std::printf(
      "timed %ld collectives: all-gather %.3f ms, reduce-scatter %.3f ms, exposed %.3f ms\n",
      static_cast<long>(gtp.timing.collectives), gtp.timing.all_gather_ms,
      gtp.timing.reduce_scatter_ms, gtp.timing.exposed_ms);
  ASSERT_EQ(plain.losses.size(), gtp.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) {
    EXPECT_NEAR(gtp.losses[i], plain.losses[i], 1e-6 * std::abs(plain.losses[i])) << i;
  }
  ASSERT_EQ(plain.grads.size(), gtp.grads.size());
  double worst = 0;
  for (size_t i = 0; i < plain.grads.size(); ++i)
    worst = std::max(worst, max_rel(plain.grads[i], gtp.grads[i]));
  std::printf("GTP(G=1, NCCL, bf16 gathers) vs plain bf16: worst relative grad difference %.3g\n",
              worst);
  EXPECT_LT(worst, 1e-5);
}

TEST(GtpNccl, PlainSendBuffersAndFp32GathersMatchToo) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  const Curve symmetric = train(true, graphs::Scope::kNone, 3);
  const Curve plain = train(true, graphs::Scope::kNone, 3, true, /*symmetric=*/false);
  EXPECT_EQ(plain.pool_backend, "cuda:0");
  EXPECT_EQ(plain.losses, symmetric.losses);  // where the send buffers live changes no value
  for (size_t i = 0; i < plain.grads.size(); ++i) EXPECT_EQ(plain.grads[i], symmetric.grads[i]);
  // fp32 end to end: GTP's f32 gathers against the direct fp32 path.
  const Curve direct = train(false, graphs::Scope::kNone, 3, /*bf16=*/false);
  const Curve f32 = train(true, graphs::Scope::kNone, 3, /*bf16=*/false);
  for (size_t i = 0; i < direct.losses.size(); ++i) {
    EXPECT_NEAR(f32.losses[i], direct.losses[i], 1e-6 * std::abs(direct.losses[i])) << i;
  }
  double worst = 0;
  for (size_t i = 0; i < direct.grads.size(); ++i)
    worst = std::max(worst, max_rel(direct.grads[i], f32.grads[i]));
  EXPECT_LT(worst, 1e-5);
}

TEST(GtpNccl, CudaGraphsOverGtpMatchEagerBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  const Curve eager = train(true, graphs::Scope::kNone, 6);
  for (graphs::Scope scope : {graphs::Scope::kLayers, graphs::Scope::kFull}) {
    const Curve g = train(true, scope, 6);
    EXPECT_GT(g.replays, 0);
    EXPECT_EQ(g.losses, eager.losses);
    ASSERT_EQ(g.grads.size(), eager.grads.size());
    for (size_t i = 0; i < g.grads.size(); ++i) EXPECT_EQ(g.grads[i], eager.grads[i]) << i;
  }
}

}  // namespace
}  // namespace gtron::parallel
