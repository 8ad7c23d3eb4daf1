// The GTP send pool over NCCL symmetric memory at world size 1 (GPU): buffers come from
// ncclMemAlloc, are registered as symmetric windows, serve a reduce-scatter, come back LIFO, and
// are deregistered before the communicator goes.
#include <gtest/gtest.h>

#include "memory/symmetric_pool.h"
#include "model/device.h"
#include "parallel/nccl_communicator.h"

namespace gtron::parallel {
namespace {

TEST(NcclSymmetricPool, RegisteredBuffersServeReduceScatterAndComeBackLifo) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  StoreServer server;
  StoreClient store("127.0.0.1", server.port());
  const Device dev = Device::cuda(0);
  NcclCommunicator comm(store, "sym", 0, 1, dev);
  {
    memory::SymmetricPool pool(make_nccl_symmetric_backend(comm));
    const memory::PoolKey key{1024, {static_cast<int32_t>(DType::kF32), 4}, 7};
    void* a = pool.acquire(key);
    void* b = pool.acquire(key);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(a, b);
    EXPECT_NE(pool.window(a), nullptr) << "not registered as a symmetric window";
    EXPECT_FALSE(pool.has_free(key));

    // A reduce-scatter reads the registered buffer (world 1: the result is the input).
    Tensor host = Tensor::from_vector(std::vector<double>(1024, 1.5), {1024}, DType::kF32);
    Tensor send = Tensor::from_blob(a, {1024}, DType::kF32, dev);
    send.copy_from(host);
    Tensor out = Tensor::zeros({1024}, DType::kF32, dev);
    comm.reduce_scatter(send, out).synchronize();
    EXPECT_EQ(out.to_vector(), std::vector<double>(1024, 1.5));

    pool.release(key, a);
    pool.release(key, b);
    EXPECT_TRUE(pool.has_free(key));
    EXPECT_EQ(pool.acquire(key), b) << "LIFO: the last released comes back first";
    EXPECT_EQ(pool.stats().allocations, 2u);
    EXPECT_EQ(pool.stats().bytes_held, 2u * 1024 * 4);
  }  // the pool deregisters its windows here, before the communicator is destroyed
}

}  // namespace
}  // namespace gtron::parallel
