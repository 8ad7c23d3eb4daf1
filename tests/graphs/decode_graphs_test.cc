// graphs::DecodeGraphs, the decoder's step capture (model/step_graphs.h), on the CPU backend
// (recorded closures): the body's stream work replays, not the body; what the body allocates comes
// from the private pool, so eager allocations never land on memory a replay writes; a throwing
// body leaves the stream out of capture and the object usable. The CUDA path is exercised by
// tests/model/generate_cuda_test (the decoder's captured steps against eager ones).
#include "graphs/decode_graphs.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "model/tensor.h"

namespace gtron::graphs {
namespace {

constexpr int64_t kN = 64;  // floats in the scratch tensors

TEST(DecodeGraphs, ReplaysTheStreamWorkOfTheBodyNotTheBody) {
  const Device cpu = Device::cpu();
  Stream stream(cpu);
  DecodeGraphs graphs(cpu);
  int body_runs = 0, kernel_runs = 0;
  const std::unique_ptr<StepGraph> step = graphs.capture(stream, [&] {
    ++body_runs;
    stream.run([&] { ++kernel_runs; });
  });
  EXPECT_EQ(body_runs, 1);
  EXPECT_EQ(kernel_runs, 0);  // recorded, not run
  EXPECT_FALSE(stream.capturing());
  step->replay(stream);
  step->replay(stream);
  EXPECT_EQ(body_runs, 1);
  EXPECT_EQ(kernel_runs, 2);
}

TEST(DecodeGraphs, MemoryTheBodyAllocatesIsNeverHandedToEagerWork) {
  const Device cpu = Device::cpu();
  Stream stream(cpu);
  DecodeGraphs graphs(cpu);
  float* captured = nullptr;
  const std::unique_ptr<StepGraph> step = graphs.capture(stream, [&] {
    // Freed when the body ends, as a step's intermediates are; the replay still writes it.
    Tensor scratch = Tensor::empty({kN}, DType::kF32, cpu, &stream);
    captured = scratch.data<float>();
    float* p = captured;
    stream.run([p] {
      for (int64_t i = 0; i < kN; ++i) p[i] = -1.0f;
    });
  });
  // An eager tensor of the same size on the same stream: without the pool it would reuse the
  // freed block, and the replay would overwrite it.
  Tensor eager = Tensor::empty({kN}, DType::kF32, cpu, &stream);
  EXPECT_NE(eager.data<float>(), captured);
  for (int64_t i = 0; i < kN; ++i) eager.data<float>()[i] = static_cast<float>(i);
  step->replay(stream);
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(eager.data<float>()[i], static_cast<float>(i));
}

TEST(DecodeGraphs, AThrowingBodyAbandonsTheCaptureAndLeavesItUsable) {
  const Device cpu = Device::cpu();
  Stream stream(cpu);
  DecodeGraphs graphs(cpu);
  int kernel_runs = 0;
  EXPECT_THROW(graphs.capture(stream,
                              [&] {
                                stream.run([&] { kernel_runs += 100; });
                                throw std::runtime_error("step failed");
                              }),
               std::runtime_error);
  EXPECT_FALSE(stream.capturing());
  const std::unique_ptr<StepGraph> step =
      graphs.capture(stream, [&] { stream.run([&] { ++kernel_runs; }); });
  step->replay(stream);
  EXPECT_EQ(kernel_runs, 1);  // the abandoned capture's work never ran
}

}  // namespace
}  // namespace gtron::graphs
