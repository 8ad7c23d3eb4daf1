// GPU benchmark of the residual add + LayerNorm of one block (Note [fused residual add and
// LayerNorm]): add → layernorm against add_layernorm, forward alone and forward + backward, on
// [N, C] bf16 rows with f32 gamma and beta (GPT-2 124M at B·T = 16k by default); with --rms 1,
// add → rmsnorm against add_rmsnorm (the llama block's, e.g. --N 8192 --C 2048). The backward
// runs the block's pattern: out = h + y, so h gets the residual gradient and y the norm's, and x
// and a start with empty gradient slots. Prints one JSON line per path and one with the ratios.
// Never a test: run it where there is a GPU (flags --N, --C, --iters, --rms).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/device.h"
#include "model/ops/add.h"
#include "model/ops/add_norm.h"
#include "model/stream.h"
#include "tests/model/bench_util.h"

namespace {

using namespace gtron;

using bench::arg;
using bench::filled;

struct Bench {
  Var x, a, gamma, beta;
  Tensor dout;
  bool rms = false;  // RMSNorm (beta unused) instead of LayerNorm
};

// One forward (+ backward) of the pattern through the fused op or the composed ops.
void step(const Bench& b, bool fused, bool with_backward) {
  Var h, y;
  if (fused) {
    const AddNorm r =
        b.rms ? add_rmsnorm(b.x, b.a, b.gamma) : add_layernorm(b.x, b.a, b.gamma, b.beta);
    h = r.h;
    y = r.y;
  } else {
    h = add(b.x, b.a);
    y = b.rms ? rmsnorm(h, b.gamma) : layernorm(h, b.gamma, b.beta);
  }
  if (!with_backward) return;
  backward_with(add(h, y), b.dout);
  b.x.set_grad(Tensor());  // the block's slots start empty every step
  b.a.set_grad(Tensor());
}

// Milliseconds per step over `iters` steps after a warm-up (the allocator reaches steady state).
double time_ms(const Bench& b, bool fused, bool with_backward, int iters) {
  Stream& s = current_stream(Device::cuda(0));
  auto run = [&](int n) {
    if (with_backward) {
      for (int i = 0; i < n; ++i) step(b, fused, true);
    } else {
      NoGradGuard no_grad;
      for (int i = 0; i < n; ++i) step(b, fused, false);
    }
  };
  run(5);
  s.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  run(iters);
  s.synchronize();
  const std::chrono::duration<double, std::milli> dt = std::chrono::steady_clock::now() - t0;
  return dt.count() / iters;
}

}  // namespace

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_add_norm: no CUDA device\n");
    return 2;
  }
  const int64_t N = arg(argc, argv, "N", 16384);
  const int64_t C = arg(argc, argv, "C", 768);
  const int iters = static_cast<int>(arg(argc, argv, "iters", 200));
  const Shape rows{N, C};
  Bench b{Var::leaf(filled(rows, DType::kBF16, 0.1)),
          Var::leaf(filled(rows, DType::kBF16, 0.2)),
          Var::external(filled(Shape{C}, DType::kF32, 0.05)),
          Var::external(filled(Shape{C}, DType::kF32, 0.01)),
          filled(rows, DType::kBF16, 0.03),
          arg(argc, argv, "rms", 0) != 0};
  b.gamma.set_grad(Tensor::zeros(Shape{C}, DType::kF32).to(Device::cuda(0)));
  b.beta.set_grad(Tensor::zeros(Shape{C}, DType::kF32).to(Device::cuda(0)));
  const char* fused_name = b.rms ? "add_rmsnorm" : "add_layernorm";
  const char* composed_name = b.rms ? "add+rmsnorm" : "add+layernorm";
  double ms[2][2];
  for (int fused = 0; fused < 2; ++fused) {
    ms[fused][0] = time_ms(b, fused != 0, false, iters);
    ms[fused][1] = time_ms(b, fused != 0, true, iters);
    std::printf(
        "{\"path\": \"%s\", \"N\": %lld, \"C\": %lld, \"dtype\": \"bf16\", \"forward_ms\": %.4f, "
        "\"forward_backward_ms\": %.4f}\n",
        fused ? fused_name : composed_name, static_cast<long long>(N), static_cast<long long>(C),
        ms[fused][0], ms[fused][1]);
  }
  std::printf(
      "{\"forward_saved_ms\": %.4f, \"forward_backward_saved_ms\": %.4f, \"forward_ratio\": %.3f, "
      "\"forward_backward_ratio\": %.3f}\n",
      ms[0][0] - ms[1][0], ms[0][1] - ms[1][1], ms[1][0] / ms[0][0], ms[1][1] / ms[0][1]);
  return 0;
}
