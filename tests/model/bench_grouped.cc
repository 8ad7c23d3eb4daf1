// The MoE experts' grouped GEMMs (model/ops/grouped_linear.h) at the Qwen3-MoE shape issue 50
// measures (L=12, C=2048, 64 experts of width 768, top 8, B=4, T=1024: 32,768 routed rows), every
// kernel (cuda::GroupedKernel: mma.sync, wgmma with 3 and 4 stages, and wgmma on the fp32 masters)
// for each product of each expert linear (gate|up: 2048 -> 1536, down: 768 -> 2048), in one
// command: one JSON line per (linear, product, kernel) with µs and TFLOP/s (the median of --reps
// timed launches after two warm-ups), and the largest relative difference from the mma.sync
// kernel's result (bf16 outputs; fp32 weight gradients).
// The group sizes are uneven like a trained router's: expert e gets a share proportional to
// 1 + 0.5·sin(e), rounded so the rows add up to 32,768 (a few groups of ~250, a few of ~750).
//
// Usage: bench_grouped [--rows N] [--reps R]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "model/dtype.h"
#include "model/ops/grouped_linear.h"
#include "model/ops/grouped_wgmma.h"

namespace {

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

void* upload_bf16(size_t n, unsigned seed, float scale) {
  std::vector<uint16_t> h(n);
  unsigned s = seed;
  for (auto& v : h) {
    s = s * 1664525u + 1013904223u;
    v = gtron::float_to_bf16(scale * (static_cast<float>((s >> 8) & 0xffff) / 32768.0f - 1.0f))
            .bits;
  }
  void* d = nullptr;
  CK(cudaMalloc(&d, n * 2));
  CK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
  return d;
}

// The bf16 values of `bf16` (n elements) as fp32, on the device.
float* widen(const void* bf16, size_t n) {
  std::vector<uint16_t> h(n);
  CK(cudaMemcpy(h.data(), bf16, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = gtron::bf16_to_float(gtron::BF16{h[i]});
  float* d = nullptr;
  CK(cudaMalloc(&d, n * 4));
  CK(cudaMemcpy(d, f.data(), n * 4, cudaMemcpyHostToDevice));
  return d;
}

std::vector<double> to_host(const void* p, size_t n, bool f32) {
  std::vector<double> out(n);
  if (f32) {
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) out[i] = h[i];
  } else {
    std::vector<uint16_t> h(n);
    CK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) out[i] = gtron::bf16_to_float(gtron::BF16{h[i]});
  }
  return out;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& ref) {
  double scale = 0, worst = 0;
  for (double r : ref) scale = std::max(scale, std::fabs(r));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - ref[i]));
  return scale > 0 ? worst / scale : worst;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gtron;
  long rows = 32768;
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rows")) {
      rows = std::atol(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--reps")) {
      reps = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: bench_grouped [--rows N] [--reps R]\n");
      return 2;
    }
  }
  if (rows <= 0 || reps <= 0) {
    std::fprintf(stderr, "bench_grouped: --rows and --reps must be positive\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int E = 64;
  std::vector<int32_t> off(E + 1, 0);
  {
    std::vector<double> share(E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += share[e] = 1.0 + 0.5 * std::sin(e);
    for (int e = 0; e < E; ++e) {
      const long want = off[e] + std::lround(static_cast<double>(rows) * share[e] / sum);
      off[e + 1] = static_cast<int32_t>(std::min(want, rows));
    }
    off[E] = static_cast<int32_t>(rows);  // the rounding's remainder goes to the last expert
  }
  int32_t* d_off = nullptr;
  CK(cudaMalloc(&d_off, (E + 1) * 4));
  CK(cudaMemcpy(d_off, off.data(), (E + 1) * 4, cudaMemcpyHostToDevice));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  std::printf(
      "{\"bench\": \"bench_grouped\", \"card\": \"%s\", \"rows\": %ld, \"experts\": %d, "
      "\"wgmma\": %d}\n",
      prop.name, rows, E, cuda::grouped_wgmma_usable() ? 1 : 0);
  struct Linear {
    const char* name;
    long cin, cout;
  };
  const Linear linears[] = {{"gate_up", 2048, 1536}, {"down", 768, 2048}};
  struct Kernel {
    const char* name;
    cuda::GroupedKernel k;
    bool masters;
  };
  const Kernel kernels[] = {{"mma", cuda::GroupedKernel::kMma, false},
                            {"wgmma3", cuda::GroupedKernel::kWgmma3, false},
                            {"wgmma4", cuda::GroupedKernel::kWgmma4, false},
                            {"wgmma4_f32w", cuda::GroupedKernel::kWgmma4, true}};
  for (const Linear& l : linears) {
    void* x = upload_bf16(static_cast<size_t>(rows) * l.cin, 1, 1.0f);
    void* dy = upload_bf16(static_cast<size_t>(rows) * l.cout, 2, 1.0f);
    void* wall = upload_bf16(static_cast<size_t>(E) * l.cout * l.cin, 3, 0.05f);
    float* wall32 = widen(wall, static_cast<size_t>(E) * l.cout * l.cin);
    void *y = nullptr, *dx = nullptr;
    float* dwall = nullptr;
    CK(cudaMalloc(&y, static_cast<size_t>(rows) * l.cout * 2));
    CK(cudaMalloc(&dx, static_cast<size_t>(rows) * l.cin * 2));
    CK(cudaMalloc(&dwall, static_cast<size_t>(E) * l.cout * l.cin * 4));
    std::vector<const void*> w16(E), w32(E);
    std::vector<float*> dw(E);
    std::vector<char> ow(E, 1);
    for (int e = 0; e < E; ++e) {
      const size_t at = static_cast<size_t>(e) * l.cout * l.cin;
      w16[e] = static_cast<const char*>(wall) + at * 2;
      w32[e] = wall32 + at;
      dw[e] = dwall + at;
    }
    const bool* owp = reinterpret_cast<const bool*>(ow.data());
    const double flops = 2.0 * rows * l.cin * l.cout;
    std::vector<double> ref[3];
    for (const Kernel& k : kernels) {
      if (k.k != cuda::GroupedKernel::kMma && !cuda::grouped_wgmma_usable()) continue;
      cuda::set_grouped_kernel(k.k);
      for (int p = 0; p < 3; ++p) {
        if (p == 2 && k.masters) continue;  // the weight gradient reads no weights
        const void* const* w = k.masters ? w32.data() : w16.data();
        auto run = [&] {
          if (p == 0) {
            cuda::grouped_linear_forward(x, w, y, d_off, rows, l.cin, l.cout, E, DType::kBF16, st,
                                         k.masters);
          } else if (p == 1) {
            cuda::grouped_linear_backward_data(dy, w, dx, d_off, rows, l.cin, l.cout, E,
                                               DType::kBF16, st, true, k.masters);
          } else {
            cuda::grouped_linear_backward_weight(x, dy, dw.data(), owp, d_off, rows, l.cin, l.cout,
                                                 E, DType::kBF16, st);
          }
        };
        run();
        run();
        std::vector<float> ms(reps);
        for (int r = 0; r < reps; ++r) {
          CK(cudaEventRecord(t0, st));
          run();
          CK(cudaEventRecord(t1, st));
          CK(cudaEventSynchronize(t1));
          CK(cudaEventElapsedTime(&ms[r], t0, t1));
        }
        std::sort(ms.begin(), ms.end());
        const double us = 1000.0 * ms[reps / 2];
        const void* out = p == 0 ? y : p == 1 ? dx : dwall;
        const size_t n = p == 0   ? static_cast<size_t>(rows) * l.cout
                         : p == 1 ? static_cast<size_t>(rows) * l.cin
                                  : static_cast<size_t>(E) * l.cout * l.cin;
        std::vector<double> got = to_host(out, n, p == 2);
        if (k.k == cuda::GroupedKernel::kMma) ref[p] = got;
        const char* prod = p == 0 ? "fwd" : p == 1 ? "dgrad" : "wgrad";
        std::printf(
            "{\"linear\": \"%s\", \"product\": \"%s\", \"kernel\": \"%s\", \"us\": %.1f, "
            "\"tflops\": %.1f, \"max_rel_vs_mma\": %.3g}\n",
            l.name, prod, k.name, us, flops / us * 1e-6, max_rel(got, ref[p]));
        std::fflush(stdout);
      }
    }
    cuda::set_grouped_kernel(cuda::GroupedKernel::kMma);
    CK(cudaFree(x));
    CK(cudaFree(dy));
    CK(cudaFree(wall));
    CK(cudaFree(wall32));
    CK(cudaFree(y));
    CK(cudaFree(dx));
    CK(cudaFree(dwall));
  }
  return 0;
}
