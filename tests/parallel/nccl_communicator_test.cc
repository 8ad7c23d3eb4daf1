// NCCL on one GPU: a world of one rank runs all four collectives (and a barrier) with the
// communicator's stream ordered against the caller's. Tagged "gpu".
#include "parallel/nccl_communicator.h"

#include <gtest/gtest.h>

#include <vector>

#include "model/device.h"
#include "model/stream.h"
#include "model/tensor.h"

namespace gtron::parallel {
namespace {

Tensor on_gpu(const std::vector<double>& v, DType dtype, Stream& s) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, dtype).to(Device::cuda(0), &s);
}

TEST(NcclCommunicatorTest, WorldOfOneRunsEveryCollective) {
  ASSERT_GT(cuda_device_count(), 0) << "this test needs a GPU";
  StoreServer server;
  StoreClient store("127.0.0.1", server.port());
  NcclCommunicator comm(store, "nccl1", 0, 1, Device::cuda(0));
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.device(), Device::cuda(0));

  Stream compute(Device::cuda(0));
  StreamGuard guard(compute);
  const std::vector<double> v = {1.5, -2.0, 3.25, 4.0};

  Tensor in = on_gpu(v, DType::kF32, compute);
  Tensor gathered = Tensor::zeros({4}, DType::kF32, Device::cuda(0), &compute);
  Work w1 = comm.all_gather(in, gathered);
  w1.wait(compute);

  Tensor rs_in = on_gpu(v, DType::kBF16, compute);
  Tensor rs_out = Tensor::zeros({4}, DType::kBF16, Device::cuda(0), &compute);
  Work w2 = comm.reduce_scatter(rs_in, rs_out);
  w2.wait(compute);

  Tensor ar = on_gpu(v, DType::kF64, compute);
  Work w3 = comm.all_reduce(ar, ReduceOp::kMax);
  w3.wait(compute);

  Tensor bc = on_gpu(v, DType::kF32, compute);
  Work w4 = comm.broadcast(bc, 0);
  w4.synchronize();
  EXPECT_TRUE(w4.completed());
  comm.barrier();

  EXPECT_EQ(gathered.to(Device::cpu(), &compute).to_vector(), v);
  EXPECT_EQ(rs_out.to(Device::cpu(), &compute).to_vector(), v);
  EXPECT_EQ(ar.to(Device::cpu(), &compute).to_vector(), v);
  EXPECT_EQ(bc.to(Device::cpu(), &compute).to_vector(), v);
  compute.synchronize();
}

// The collective runs after work already queued on the caller's stream: a copy queued just before
// the all_gather must be what the all_gather reads.
TEST(NcclCommunicatorTest, CollectivesFollowTheCallersStream) {
  ASSERT_GT(cuda_device_count(), 0) << "this test needs a GPU";
  StoreServer server;
  StoreClient store("127.0.0.1", server.port());
  NcclCommunicator comm(store, "nccl2", 0, 1, Device::cuda(0));
  Stream compute(Device::cuda(0));
  StreamGuard guard(compute);
  const int64_t n = 1 << 22;  // a copy long enough to still be running when NCCL is called
  Tensor src = Tensor::from_vector(std::vector<double>(n, 7.0), {n}, DType::kF32)
                   .to(Device::cuda(0), &compute);
  Tensor in = Tensor::zeros({n}, DType::kF32, Device::cuda(0), &compute);
  Tensor out = Tensor::zeros({n}, DType::kF32, Device::cuda(0), &compute);
  in.copy_from(src, &compute);
  comm.all_gather(in, out).wait(compute);
  std::vector<double> got = out.to(Device::cpu(), &compute).to_vector();
  EXPECT_EQ(got.front(), 7.0);
  EXPECT_EQ(got.back(), 7.0);
}

}  // namespace
}  // namespace gtron::parallel
