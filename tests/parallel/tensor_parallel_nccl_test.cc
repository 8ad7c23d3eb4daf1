// The TP group's collectives over NCCL on one GPU (a world of one rank): all-reduce (sum, max) and
// all-gather of CUDA tensors through CommTensorParallel, ordered on the caller's stream with no
// host sync of their own. Tagged "gpu".
#include <gtest/gtest.h>

#include <vector>

#include "model/device.h"
#include "model/stream.h"
#include "model/tensor.h"
#include "parallel/nccl_communicator.h"
#include "parallel/tensor_parallel.h"

namespace gtron::parallel {
namespace {

TEST(TensorParallelNccl, WorldOfOneRunsTheTpCollectivesInStreamOrder) {
  ASSERT_GT(cuda_device_count(), 0) << "this test needs a GPU";
  StoreServer server;
  StoreClient store("127.0.0.1", server.port());
  NcclCommunicator comm(store, "tp1", 0, 1, Device::cuda(0));
  CommTensorParallel tp(&comm);
  EXPECT_EQ(tp.size(), 1);
  EXPECT_EQ(tp.rank(), 0);

  Stream compute(Device::cuda(0));
  StreamGuard guard(compute);
  const std::vector<double> v = {1.5, -2.0, 3.25, 4.0};
  const std::vector<double> w = {-1.0, 7.0, 0.5, 2.0};
  Tensor host = Tensor::from_vector(v, {4}, DType::kF32);
  Tensor sum = Tensor::zeros({4}, DType::kF32, Device::cuda(0), &compute);
  Tensor mx = Tensor::zeros({4}, DType::kF32, Device::cuda(0), &compute);
  Tensor in = Tensor::zeros({4}, DType::kF32, Device::cuda(0), &compute);
  Tensor out = Tensor::zeros({4}, DType::kF32, Device::cuda(0), &compute);
  // Copies queued just before each collective are what it reads; what is queued after it sees
  // its result.
  sum.copy_from(host, &compute);
  tp.all_reduce(sum, TpReduce::kSum);
  mx.copy_from(Tensor::from_vector(w, {4}, DType::kF32), &compute);
  tp.all_reduce(mx, TpReduce::kMax);
  in.copy_from(host, &compute);
  tp.all_gather(in, out);
  EXPECT_EQ(sum.to(Device::cpu(), &compute).to_vector(), v);
  EXPECT_EQ(mx.to(Device::cpu(), &compute).to_vector(), w);
  EXPECT_EQ(out.to(Device::cpu(), &compute).to_vector(), v);
  compute.synchronize();
}

}  // namespace
}  // namespace gtron::parallel
