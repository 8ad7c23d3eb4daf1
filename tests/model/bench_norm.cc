// GPU benchmark of the LayerNorm kernels at one shape (GPT-2 124M at B·T = 16k by default: [N, C]
// bf16 rows, f32 gamma and beta): layernorm forward, add + layernorm forward, layernorm backward
// (dx added into, dgamma and dbeta: the ln1 backward of model/ops/norm_linear) and the add +
// layernorm backward (dh added into, the second slot written: the ln2 backward), each timed with
// CUDA events over --iters calls, with the fast kernels (Note [register-resident norm forward],
// Note [staged norm backward]) and with the reference kernels (cuda::set_norm_fast(false)),
// alternating,
// --rounds times. Prints one JSON line per kernel, path and round (µs per call, GB/s of the
// [N, C] streams and the row statistics; the ≤ 1.6 MB of parameter-gradient partials left out)
// and one line per kernel with the best-of-rounds ratio fast / reference.
// Never a test: run it where there is a GPU (flags --N, --C, --iters, --rounds).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "model/cuda/check.h"
#include "model/device.h"
#include "model/ops/add_norm.h"
#include "model/ops/norm.h"
#include "model/stream.h"
#include "model/tensor.h"
#include "tests/model/bench_util.h"

namespace {

using namespace gtron;

using bench::arg;
using bench::filled;

struct Kernel {
  std::string name;
  double bytes;  // the [N, C] streams and the row statistics one call moves
  std::function<void()> call;
};

// Microseconds per call of k over `iters` calls, after a warm-up.
double time_us(const Kernel& k, bool fast, int iters, void* stream) {
  cuda::set_norm_fast(fast);
  auto st = static_cast<cudaStream_t>(stream);
  for (int i = 0; i < 5; ++i) k.call();
  cudaEvent_t t0, t1;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  CUDA_CHECK(cudaEventRecord(t0, st));
  for (int i = 0; i < iters; ++i) k.call();
  CUDA_CHECK(cudaEventRecord(t1, st));
  CUDA_CHECK(cudaEventSynchronize(t1));
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  CUDA_CHECK(cudaEventDestroy(t0));
  CUDA_CHECK(cudaEventDestroy(t1));
  return 1e3 * ms / iters;
}

}  // namespace

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_norm: no CUDA device\n");
    return 2;
  }
  const int64_t N = arg(argc, argv, "N", 16384);
  const int64_t C = arg(argc, argv, "C", 768);
  const int iters = static_cast<int>(arg(argc, argv, "iters", 200));
  const int rounds = static_cast<int>(arg(argc, argv, "rounds", 3));
  if (N <= 0 || C <= 0 || iters <= 0 || rounds <= 0) {
    std::fprintf(stderr, "bench_norm: --N, --C, --iters and --rounds must be positive\n");
    return 2;
  }
  const Shape rows{N, C};
  const DType act = DType::kBF16, param = DType::kF32;
  Tensor x = filled(rows, act, 0.1, 0.2), a = filled(rows, act, 0.2), dy = filled(rows, act, 0.03);
  Tensor h = filled(rows, act, 0.0), y = filled(rows, act, 0.0);
  Tensor dx = filled(rows, act, 0.0), also = filled(rows, act, 0.0);
  Tensor gamma = filled(Shape{C}, param, 0.05, 1.0), beta = filled(Shape{C}, param, 0.01);
  Tensor dgamma = filled(Shape{C}, DType::kF32, 0.0), dbeta = filled(Shape{C}, DType::kF32, 0.0);
  Tensor mean = filled(Shape{N}, DType::kF32, 0.0), rstd = filled(Shape{N}, DType::kF32, 0.0);
  Tensor scratch = filled(Shape{cuda::layernorm_backward_scratch_floats(N, C)}, DType::kF32, 0.0);
  Stream& s = current_stream(Device::cuda(0));
  void* st = s.native();
  auto f = [](const Tensor& t) { return t.data<float>(); };
  const double stream_bytes = static_cast<double>(N * C) * 2.0, stats = N * 8.0;
  // The statistics the backwards read: one forward first.
  cuda::layernorm_forward(x.raw(), gamma.raw(), beta.raw(), param, y.raw(), f(mean), f(rstd), N, C,
                          kLayerNormEps, act, st);
  const std::vector<Kernel> kernels = {
      {"layernorm_forward", 2 * stream_bytes + stats,
       [&] {
         cuda::layernorm_forward(x.raw(), gamma.raw(), beta.raw(), param, y.raw(), f(mean), f(rstd),
                                 N, C, kLayerNormEps, act, st);
       }},
      {"add_layernorm_forward", 4 * stream_bytes + stats,
       [&] {
         cuda::add_layernorm_forward(x.raw(), a.raw(), gamma.raw(), beta.raw(), param, h.raw(),
                                     y.raw(), f(mean), f(rstd), N, C, kLayerNormEps, act, st);
       }},
      {"layernorm_backward", 4 * stream_bytes + stats,
       [&] {
         cuda::layernorm_backward(x.raw(), gamma.raw(), param, f(mean), f(rstd), dy.raw(), dx.raw(),
                                  f(dgamma), f(dbeta), f(scratch), N, C, act, st);
       }},
      {"add_layernorm_backward", 5 * stream_bytes + stats,
       [&] {
         cuda::add_layernorm_backward(x.raw(), gamma.raw(), param, f(mean), f(rstd), dy.raw(),
                                      dx.raw(), also.raw(), false, f(dgamma), f(dbeta), f(scratch),
                                      N, C, act, st);
       }},
  };
  for (const Kernel& k : kernels) {
    double best[2] = {1e30, 1e30};
    for (int r = 0; r < rounds; ++r) {
      for (int fast = 0; fast < 2; ++fast) {
        const double us = time_us(k, fast != 0, iters, st);
        best[fast] = std::min(best[fast], us);
        std::printf(
            "{\"kernel\": \"%s\", \"fast\": %d, \"round\": %d, \"N\": %lld, \"C\": %lld, "
            "\"dtype\": \"bf16\", \"us\": %.2f, \"gbps\": %.1f}\n",
            k.name.c_str(), fast, r, static_cast<long long>(N), static_cast<long long>(C), us,
            k.bytes / (us * 1e3));
      }
    }
    std::printf(
        "{\"kernel\": \"%s\", \"best_reference_us\": %.2f, \"best_fast_us\": %.2f, "
        "\"fast_over_reference\": %.3f}\n",
        k.name.c_str(), best[0], best[1], best[1] / best[0]);
  }
  cuda::set_norm_fast(true);
  return 0;
}
