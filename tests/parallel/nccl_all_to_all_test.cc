// NCCL's all_to_all (grouped ncclSend / ncclRecv): a world of one (the own block, f32 and bf16,
// an empty exchange) on GPU 0, and, where two GPUs exist, two ranks as threads with uneven and
// zero counts. Tagged "gpu".
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "model/device.h"
#include "model/stream.h"
#include "model/tensor.h"
#include "parallel/nccl_communicator.h"

namespace gtron::parallel {
namespace {

Tensor on_gpu(const std::vector<double>& v, DType dtype, Device d, Stream& s) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, dtype).to(d, &s);
}

TEST(NcclAllToAll, WorldOfOneCopiesItsOwnBlock) {
  ASSERT_GT(cuda_device_count(), 0) << "this test needs a GPU";
  StoreServer server;
  StoreClient store("127.0.0.1", server.port());
  NcclCommunicator comm(store, "a2a1", 0, 1, Device::cuda(0));
  Stream compute(Device::cuda(0));
  StreamGuard guard(compute);
  const std::vector<double> v = {1.5, -2.0, 3.25, 4.0, 8.0};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Tensor in = on_gpu(v, dtype, Device::cuda(0), compute);
    Tensor out = Tensor::zeros({5}, dtype, Device::cuda(0), &compute);
    comm.all_to_all(in, {5}, out, {5}).wait(compute);
    EXPECT_EQ(out.to(Device::cpu(), &compute).to_vector(), v) << dtype_name(dtype);
  }
  Tensor none = Tensor::zeros({0}, DType::kF32, Device::cuda(0), &compute);
  Tensor none_out = Tensor::zeros({0}, DType::kF32, Device::cuda(0), &compute);
  comm.all_to_all(none, {0}, none_out, {0}).synchronize();
  compute.synchronize();
}

TEST(NcclAllToAll, TwoGpusExchangeUnevenAndZeroBlocks) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  StoreServer server;
  // Rank r sends rank p (r + 2p) % 3 elements worth 100r + 10p + i: 0 → 0 none, 0 → 1 two,
  // 1 → 0 one, 1 → 1 none.
  auto count = [](int from, int to) -> int64_t { return (from + 2 * to) % 3; };
  std::vector<std::vector<double>> got(2), want(2);
  auto rank_fn = [&](int r) {
    const Device d = Device::cuda(r);
    StoreClient store("127.0.0.1", server.port());
    NcclCommunicator comm(store, "a2a2", r, 2, d);
    Stream compute(d);
    StreamGuard guard(compute);
    std::vector<double> send;
    std::vector<int64_t> sc, rc;
    int64_t received = 0;
    for (int p = 0; p < 2; ++p) {
      sc.push_back(count(r, p));
      rc.push_back(count(p, r));
      received += rc.back();
      for (int64_t i = 0; i < sc.back(); ++i) send.push_back(100.0 * r + 10.0 * p + i);
      for (int64_t i = 0; i < count(p, r); ++i) want[r].push_back(100.0 * p + 10.0 * r + i);
    }
    Tensor in = on_gpu(send, DType::kF32, d, compute);
    Tensor out = Tensor::zeros({received}, DType::kF32, d, &compute);
    comm.all_to_all(in, sc, out, rc).wait(compute);
    got[r] = out.to(Device::cpu(), &compute).to_vector();
    compute.synchronize();
  };
  std::thread t1(rank_fn, 1);
  rank_fn(0);
  t1.join();
  EXPECT_EQ(got[0], want[0]);
  EXPECT_EQ(got[1], want[1]);
}

}  // namespace
}  // namespace gtron::parallel
