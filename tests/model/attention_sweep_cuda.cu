// The attention sweep's device helpers (contract in tests/model/attention_sweep_cuda.h): plain
// grid-stride kernels, none of them timed.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/cuda/check.h"
#include "tests/model/attention_sweep_cuda.h"

namespace gtron::bench {

namespace {

using cuda::ceil_div;

constexpr int kThreads = 256;
constexpr int kSumBlocks = 1024;  // partials of err_sums, summed on the host in block order

// `bytes` of device memory for one call's results, freed by the destructor (which waits for the
// device). Non-copyable.
class Scratch {
 public:
  explicit Scratch(size_t bytes) { CUDA_CHECK(cudaMalloc(&ptr_, bytes)); }
  ~Scratch() { cudaFree(ptr_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(n, kThreads), 1 << 20));
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_normal_kernel(__nv_bfloat16* x, int64_t n, uint64_t seed, float stddev) {
  const uint64_t key = splitmix64(seed);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = splitmix64(key ^ static_cast<uint64_t>(i));
    // Two uniforms in (0, 1] and [0, 1) from the hash's halves, then Box–Muller.
    const float u1 = (static_cast<float>(h >> 40) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 = static_cast<float>((h >> 8) & 0xffffffu) * (1.0f / 16777216.0f);
    const float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    x[i] = __float2bfloat16_rn(stddev * z);
  }
}

__global__ void bf16_to_f32_kernel(const __nv_bfloat16* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = __bfloat162float(x[i]);
  }
}

template <typename G>
__global__ void err_sums_kernel(const G* got, int64_t got_ld, const float* ref, int64_t ref_ld,
                                int64_t rows, int64_t c0, int64_t width, double* partial) {
  double d2 = 0.0, r2 = 0.0;
  const int64_t n = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = c0 + i % width;
    double g;
    if constexpr (sizeof(G) == 2) {
      g = __bfloat162float(got[r * got_ld + c]);
    } else {
      g = got[r * got_ld + c];
    }
    const double e = ref[r * ref_ld + c];
    d2 += (g - e) * (g - e);
    r2 += e * e;
  }
  __shared__ double s2[2][kThreads];
  s2[0][threadIdx.x] = d2;
  s2[1][threadIdx.x] = r2;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      s2[0][threadIdx.x] += s2[0][threadIdx.x + half];
      s2[1][threadIdx.x] += s2[1][threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = s2[0][0];
    partial[2 * blockIdx.x + 1] = s2[1][0];
  }
}

__global__ void tile_column_sums_kernel(const __nv_bfloat16* x, int64_t rows, int64_t W,
                                        float* out) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t t = blockIdx.y;
  if (c >= W) return;
  const int64_t end = (t + 1) * 64 < rows ? (t + 1) * 64 : rows;
  float sum = 0.0f;
  for (int64_t r = t * 64; r < end; ++r) sum += __bfloat162float(x[r * W + c]);
  out[t * W + c] = sum;
}

__global__ void count_differences_kernel(const uint16_t* a, const uint16_t* b, int64_t n,
                                         unsigned long long* count) {
  unsigned long long mine = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    mine += a[i] != b[i];
  }
  if (mine > 0) atomicAdd(count, mine);  // an integer count: order does not matter
}

}  // namespace

void fill_normal_bf16(void* x, int64_t n, uint64_t seed, float stddev, void* stream) {
  if (n == 0) return;
  fill_normal_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<__nv_bfloat16*>(x), n, seed, stddev);
  CUDA_CHECK_LAUNCH();
}

void bf16_to_f32(const void* x, float* y, int64_t n, void* stream) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), y, n);
  CUDA_CHECK_LAUNCH();
}

ErrSums err_sums(const void* got, DType got_dt, int64_t got_ld, const float* ref, int64_t ref_ld,
                 int64_t rows, int64_t c0, int64_t c1, void* stream) {
  GTRON_CHECK(got_dt == DType::kF32 || got_dt == DType::kBF16, "err_sums: got is ",
              dtype_name(got_dt), ", expected f32 or bf16");
  GTRON_CHECK(c1 > c0 && c0 >= 0 && rows > 0, "err_sums: empty range");
  const auto st = static_cast<cudaStream_t>(stream);
  Scratch partial(2 * kSumBlocks * sizeof(double));
  auto* p = static_cast<double*>(partial.get());
  if (got_dt == DType::kBF16) {
    err_sums_kernel<<<kSumBlocks, kThreads, 0, st>>>(static_cast<const __nv_bfloat16*>(got), got_ld,
                                                     ref, ref_ld, rows, c0, c1 - c0, p);
  } else {
    err_sums_kernel<<<kSumBlocks, kThreads, 0, st>>>(static_cast<const float*>(got), got_ld, ref,
                                                     ref_ld, rows, c0, c1 - c0, p);
  }
  CUDA_CHECK_LAUNCH();
  std::vector<double> host(2 * kSumBlocks);
  CUDA_CHECK(
      cudaMemcpyAsync(host.data(), p, host.size() * sizeof(double), cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
  ErrSums s;
  for (int i = 0; i < kSumBlocks; ++i) {
    s.diff2 += host[2 * i];
    s.ref2 += host[2 * i + 1];
  }
  return s;
}

void tile_column_sums(const void* x, int64_t rows, int64_t W, float* out, void* stream) {
  if (rows == 0 || W == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(W, kThreads)),
                  static_cast<unsigned>(ceil_div<int64_t>(rows, 64)));
  tile_column_sums_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), rows, W, out);
  CUDA_CHECK_LAUNCH();
}

int64_t count_differences(const void* a, const void* b, int64_t bytes, void* stream) {
  GTRON_CHECK(bytes % 2 == 0, "count_differences: ", bytes, " bytes, expected an even count");
  if (bytes == 0) return 0;
  const auto st = static_cast<cudaStream_t>(stream);
  Scratch count(sizeof(unsigned long long));
  auto* c = static_cast<unsigned long long*>(count.get());
  CUDA_CHECK(cudaMemsetAsync(c, 0, sizeof(*c), st));
  const int64_t n = bytes / 2;
  count_differences_kernel<<<blocks_for(n), kThreads, 0, st>>>(
      static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n, c);
  CUDA_CHECK_LAUNCH();
  unsigned long long host = 0;
  CUDA_CHECK(cudaMemcpyAsync(&host, c, sizeof(host), cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
  return static_cast<int64_t>(host);
}

}  // namespace gtron::bench
