// embedding and add_positions on CUDA.
//
// Note [deterministic embedding scatter-add]
// Several rows may carry the same token, so dtable rows receive sums whose order must not depend
// on timing (no atomics). The rows are grouped by token with CUB's radix sort, which is stable:
// within one token the row indices stay ascending. Block j of the accumulate kernel starts at
// sorted position j; only the first position of each token's run does work, walking the run in
// order and adding each dy row into a register copy of the dtable row, then storing it once.
// For f32 this is the CPU kernel's exact sequence of additions. Cost: one sort of N keys of
// ceil(log2 V) bits, then each dy row is read once.
#include <climits>
#include <cstdio>
#include <cub/device/device_radix_sort.cuh>

#include "model/cuda/kernel_util.cuh"
#include "model/ops/embedding.h"

namespace gtron::cuda {

namespace {

constexpr int kThreads = 256;

// y[i, c0 : c0 + kV] = table[tokens[i], c0 : c0 + kV] (a bit copy). kZeroOutside (the
// vocab-parallel lookup): a token outside [0, V) gives a zero row instead of a trap.
template <typename T, int kV, bool kZeroOutside>
__global__ void embedding_forward_kernel(const int32_t* __restrict__ tokens,
                                         const T* __restrict__ table, T* __restrict__ y, int64_t N,
                                         int64_t V, int64_t C) {
  const int64_t packs_per_row = C / kV;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= N * packs_per_row) return;
  const int64_t i = p / packs_per_row;
  const int64_t c = (p % packs_per_row) * kV;
  const int32_t tok = tokens[i];
  if (kZeroOutside && (tok < 0 || tok >= V)) {
    const float zero[kV] = {};
    store_floats<kV>(y + i * C + c, zero);
    return;
  }
  if (tok < 0 || tok >= V) {
    printf("embedding: token %d at row %lld outside [0, %lld)\n", tok, static_cast<long long>(i),
           static_cast<long long>(V));
    __trap();
  }
  *reinterpret_cast<Pack<T, kV>*>(y + i * C + c) =
      *reinterpret_cast<const Pack<T, kV>*>(table + static_cast<int64_t>(tok) * C + c);
}

// local[i] = tokens[i] − v0 when in [0, Vl), else Vl (no row of this rank); traps on a token
// outside [0, Vfull).
__global__ void local_ids_kernel(const int32_t* __restrict__ tokens, int32_t* __restrict__ local,
                                 int64_t N, int64_t v0, int64_t Vl, int64_t Vfull) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const int32_t tok = tokens[i];
  if (tok < 0 || tok >= Vfull) {
    printf("vocab_parallel_embedding: token %d at row %lld outside [0, %lld)\n", tok,
           static_cast<long long>(i), static_cast<long long>(Vfull));
    __trap();
  }
  const int64_t r = tok - v0;
  local[i] = static_cast<int32_t>(r >= 0 && r < Vl ? r : Vl);
}

__global__ void iota_kernel(int32_t* v, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) v[i] = static_cast<int32_t>(i);
}

// Note [deterministic embedding scatter-add]. keys: tokens sorted; rows: their row indices.
template <typename T, typename G, int kV>
__global__ void embedding_backward_kernel(const uint32_t* __restrict__ keys,
                                          const int32_t* __restrict__ rows,
                                          const T* __restrict__ dy, G* __restrict__ dtable,
                                          int64_t N, int64_t V, int64_t C) {
  const int64_t j = blockIdx.x;
  const uint32_t v = keys[j];
  if ((j > 0 && keys[j - 1] == v) || v >= V) return;  // not the start of a run
  G* drow = dtable + static_cast<int64_t>(v) * C;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * kV; c < C;
       c += static_cast<int64_t>(blockDim.x) * kV) {
    float acc[kV];
    load_floats<kV>(drow + c, acc);
    for (int64_t p = j; p < N && keys[p] == v; ++p) {
      float g[kV];
      load_floats<kV>(dy + static_cast<int64_t>(rows[p]) * C + c, g);
#pragma unroll
      for (int k = 0; k < kV; ++k) acc[k] += g[k];
    }
    store_floats<kV>(drow + c, acc);
  }
}

template <typename T, typename P, int kV>
__global__ void add_positions_forward_kernel(const T* __restrict__ x, const P* __restrict__ wpe,
                                             T* __restrict__ y, int64_t n, int64_t TC) {
  const int64_t e = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (e >= n) return;
  float a[kV], b[kV];
  load_floats<kV>(x + e, a);
  load_floats<kV>(wpe + e % TC, b);
#pragma unroll
  for (int k = 0; k < kV; ++k) a[k] += b[k];
  store_floats<kV>(y + e, a);
}

// add_positions at given positions: row i = e / C reads wpe row pos[i] (traps outside [0, P)).
template <typename T, typename P, int kV>
__global__ void add_positions_at_forward_kernel(const T* __restrict__ x, const P* __restrict__ wpe,
                                                const int32_t* __restrict__ pos, T* __restrict__ y,
                                                int64_t n, int64_t rows, int64_t C) {
  const int64_t e = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (e >= n) return;
  const int64_t i = e / C;
  const int32_t p = pos[i];
  if (p < 0 || p >= rows) {
    printf("add_positions: position %d at row %lld outside [0, %lld)\n", p,
           static_cast<long long>(i), static_cast<long long>(rows));
    __trap();
  }
  float a[kV], b[kV];
  load_floats<kV>(x + e, a);
  load_floats<kV>(wpe + static_cast<int64_t>(p) * C + (e - i * C), b);
#pragma unroll
  for (int k = 0; k < kV; ++k) a[k] += b[k];
  store_floats<kV>(y + e, a);
}

// One thread per kV positions of [Tlen, C]; it walks b = 0..B-1 in order.
template <typename T, int kV>
__global__ void add_positions_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx,
                                              float* __restrict__ dwpe, int64_t B, int64_t TC) {
  const int64_t e = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (e >= TC) return;
  float acc[kV];
  if (dwpe != nullptr) load_floats<kV>(dwpe + e, acc);
  for (int64_t b = 0; b < B; ++b) {
    float g[kV];
    load_floats<kV>(dy + b * TC + e, g);
    if (dx != nullptr) add_floats<kV>(dx + b * TC + e, g);
    if (dwpe != nullptr) {
#pragma unroll
      for (int k = 0; k < kV; ++k) acc[k] += g[k];
    }
  }
  if (dwpe != nullptr) store_floats<kV>(dwpe + e, acc);
}

// Bits that hold every id in [0, V]: tokens, and V, the vocab-parallel id of a token outside the
// table (sorted last, skipped by the accumulate kernel).
int key_bits(int64_t V) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) <= V) ++bits;
  return bits;
}

size_t sort_temp_bytes(int64_t N, int64_t V) {
  size_t bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(N), 0,
      key_bits(V)));
  return bytes;
}

// The scratch layout: sorted keys, row indices in, row indices out, the sort's temp storage.
struct SortScratch {
  uint32_t* keys = nullptr;
  int32_t* rows_in = nullptr;
  int32_t* rows_out = nullptr;
  void* temp = nullptr;
  size_t temp_bytes = 0;
  size_t total = 0;
  SortScratch(void* base, int64_t N, int64_t V) : temp_bytes(sort_temp_bytes(N, V)) {
    ScratchCarver sc(base);
    keys = sc.take<uint32_t>(N);
    rows_in = sc.take<int32_t>(N);
    rows_out = sc.take<int32_t>(N);
    temp = sc.take<char>(static_cast<int64_t>(temp_bytes));
    total = sc.bytes();
  }
};

}  // namespace

namespace {

template <bool kZeroOutside>
void launch_embedding_forward(const int32_t* tokens, const void* table, void* y, int64_t N,
                              int64_t V, int64_t C, DType act, void* stream) {
  if (N == 0 || C == 0) return;
  dispatch_act("embedding", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* tp = static_cast<const T*>(table);
    auto* yp = static_cast<T*>(y);
    auto st = static_cast<cudaStream_t>(stream);
    if (C % kV == 0 && is_aligned(table, 16) && is_aligned(y, 16)) {
      const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(N * (C / kV), kThreads));
      embedding_forward_kernel<T, kV, kZeroOutside>
          <<<blocks, kThreads, 0, st>>>(tokens, tp, yp, N, V, C);
    } else {
      const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(N * C, kThreads));
      embedding_forward_kernel<T, 1, kZeroOutside>
          <<<blocks, kThreads, 0, st>>>(tokens, tp, yp, N, V, C);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void embedding_forward(const int32_t* tokens, const void* table, void* y, int64_t N, int64_t V,
                       int64_t C, DType act, void* stream) {
  launch_embedding_forward<false>(tokens, table, y, N, V, C, act, stream);
}

void embedding_forward_or_zero(const int32_t* ids, const void* table, void* y, int64_t N, int64_t V,
                               int64_t C, DType act, void* stream) {
  launch_embedding_forward<true>(ids, table, y, N, V, C, act, stream);
}

void embedding_local_ids(const int32_t* tokens, int32_t* local, int64_t N, int64_t v0, int64_t Vl,
                         int64_t Vfull, void* stream) {
  if (N == 0) return;
  local_ids_kernel<<<static_cast<unsigned>(ceil_div<int64_t>(N, kThreads)), kThreads, 0,
                     static_cast<cudaStream_t>(stream)>>>(tokens, local, N, v0, Vl, Vfull);
  CUDA_CHECK_LAUNCH();
}

int64_t embedding_backward_scratch_bytes(int64_t N, int64_t V) {
  if (N == 0) return 0;
  return static_cast<int64_t>(SortScratch(nullptr, N, V).total);
}

void embedding_backward(const int32_t* tokens, const void* dy, void* dtable, DType grad_dtype,
                        void* scratch, int64_t N, int64_t V, int64_t C, DType act, void* stream) {
  if (N == 0 || C == 0) return;
  GTRON_CHECK(N <= INT_MAX, "embedding: ", N, " rows exceed the sort's int range");
  GTRON_CHECK(scratch != nullptr, "embedding: backward needs scratch");
  auto st = static_cast<cudaStream_t>(stream);
  SortScratch ss(scratch, N, V);
  iota_kernel<<<static_cast<unsigned>(ceil_div<int64_t>(N, kThreads)), kThreads, 0, st>>>(
      ss.rows_in, N);
  CUDA_CHECK_LAUNCH();
  // Tokens were validated by the forward, so reading them as unsigned keys is exact.
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      ss.temp, ss.temp_bytes, reinterpret_cast<const uint32_t*>(tokens), ss.keys, ss.rows_in,
      ss.rows_out, static_cast<int>(N), 0, key_bits(V), st));
  dispatch_act_param("embedding", act, grad_dtype, [&](auto tag, auto gtag) {
    using T = decltype(tag);
    using G = decltype(gtag);
    constexpr int kV = kPack<T>;
    constexpr int kBlock = 128;
    const auto* dyp = static_cast<const T*>(dy);
    auto* dtp = static_cast<G*>(dtable);
    if (C % kV == 0 && is_aligned(dy, 16) && is_aligned(dtable, sizeof(G) * kV)) {
      embedding_backward_kernel<T, G, kV>
          <<<static_cast<unsigned>(N), kBlock, 0, st>>>(ss.keys, ss.rows_out, dyp, dtp, N, V, C);
    } else {
      embedding_backward_kernel<T, G, 1>
          <<<static_cast<unsigned>(N), kBlock, 0, st>>>(ss.keys, ss.rows_out, dyp, dtp, N, V, C);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void add_positions_forward(const void* x, const void* wpe, DType wpe_dtype, void* y, int64_t B,
                           int64_t Tlen, int64_t C, DType act, void* stream) {
  const int64_t n = B * Tlen * C;
  if (n == 0) return;
  dispatch_act_param("add_positions", act, wpe_dtype, [&](auto tag, auto ptag) {
    using T = decltype(tag);
    using P = decltype(ptag);
    constexpr int kV = kPack<T>;
    const auto* xp = static_cast<const T*>(x);
    const auto* pp = static_cast<const P*>(wpe);
    auto* yp = static_cast<T*>(y);
    auto st = static_cast<cudaStream_t>(stream);
    if (C % kV == 0 && is_aligned(x, 16) && is_aligned(y, 16) && is_aligned(wpe, sizeof(P) * kV)) {
      const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(n / kV, kThreads));
      add_positions_forward_kernel<T, P, kV><<<blocks, kThreads, 0, st>>>(xp, pp, yp, n, Tlen * C);
    } else {
      const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(n, kThreads));
      add_positions_forward_kernel<T, P, 1><<<blocks, kThreads, 0, st>>>(xp, pp, yp, n, Tlen * C);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void add_positions_at_forward(const void* x, const void* wpe, DType wpe_dtype, const int32_t* pos,
                              void* y, int64_t N, int64_t P, int64_t C, DType act, void* stream) {
  const int64_t n = N * C;
  if (n == 0) return;
  dispatch_act_param("add_positions", act, wpe_dtype, [&](auto tag, auto ptag) {
    using T = decltype(tag);
    using Q = decltype(ptag);
    constexpr int kV = kPack<T>;
    const auto* xp = static_cast<const T*>(x);
    const auto* pp = static_cast<const Q*>(wpe);
    auto* yp = static_cast<T*>(y);
    auto st = static_cast<cudaStream_t>(stream);
    if (C % kV == 0 && is_aligned(x, 16) && is_aligned(y, 16) && is_aligned(wpe, sizeof(Q) * kV)) {
      const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(n / kV, kThreads));
      add_positions_at_forward_kernel<T, Q, kV>
          <<<blocks, kThreads, 0, st>>>(xp, pp, pos, yp, n, P, C);
    } else {
      const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(n, kThreads));
      add_positions_at_forward_kernel<T, Q, 1>
          <<<blocks, kThreads, 0, st>>>(xp, pp, pos, yp, n, P, C);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void add_positions_backward(const void* dy, void* dx, float* dwpe, int64_t B, int64_t Tlen,
                            int64_t C, DType act, void* stream) {
  const int64_t TC = Tlen * C;
  if (TC == 0 || (dx == nullptr && dwpe == nullptr)) return;
  dispatch_act("add_positions", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* dyp = static_cast<const T*>(dy);
    auto* dxp = static_cast<T*>(dx);
    auto st = static_cast<cudaStream_t>(stream);
    if (C % kV == 0 && is_aligned(dy, 16) && is_aligned(dx, 16) &&
        is_aligned(dwpe, sizeof(float) * kV)) {
      const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(TC / kV, kThreads));
      add_positions_backward_kernel<T, kV><<<blocks, kThreads, 0, st>>>(dyp, dxp, dwpe, B, TC);
    } else {
      const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(TC, kThreads));
      add_positions_backward_kernel<T, 1><<<blocks, kThreads, 0, st>>>(dyp, dxp, dwpe, B, TC);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace gtron::cuda
