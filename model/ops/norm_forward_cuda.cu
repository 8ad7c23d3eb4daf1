// The layernorm and rmsnorm forwards on CUDA (the backwards: model/ops/norm_cuda.cu). RMSNorm is
// LayerNorm without centering and without beta, so one kernel template (kLN) serves both.
//
// Rows: one warp per row, 8 rows per block. A lane walks its columns in packs (16-byte loads when
// C is a multiple of the pack and every pointer is aligned, else one element): columns
// (lane + 32·j)·kV + e for pack j. Statistics are fp32, the variance two-pass as on the CPU, and
// the warp sums are xor butterflies (deterministic). The residual add before a LayerNorm or an
// RMSNorm rides in the same row pass (Note [fused residual add and LayerNorm],
// model/ops/add_norm.h).
//
// Note [register-resident norm forward]
// The streaming kernel (kPacks = 0, the reference and the path of wide rows) reads the row three
// times — the sum, the centred sum of squares, the output — with a dependent warp reduction
// between the passes; the re-reads hit L1/L2, but each warp then waits on memory three times in
// a row. Where a lane's share of the row fits in kPacks ≤ 8 packs (bf16 C ≤ 2048, f32 C ≤ 1024
// with 16-byte packs; C ≤ 256 one element at a time), the lane loads its packs once, into
// registers, and both reductions and the output read them there: one global read of the row, all
// of a lane's loads in flight at once. The arithmetic is the streaming kernel's, element by
// element in the same order (a lane sums its columns pack by pack, element by element, then the
// same butterfly; likewise the centred squares and the output expression), so y, mean and rstd
// are the same bits (tests/model/norm_fast_cuda_test.cc checks them against the streaming kernel
// through the switch). For the fused add, the lane keeps h = x + a rounded to T, which is what
// the streaming kernel recomputes on each visit. cuda::set_norm_fast(false) keeps the streaming
// kernels (tests and benchmarks: the reference, with the backward's of Note [staged norm
// backward]).
#include <atomic>
#include <type_traits>

#include "model/cuda/kernel_util.cuh"
#include "model/ops/add.h"
#include "model/ops/add_norm.h"
#include "model/ops/fp8.h"
#include "model/ops/fp8_tile.cuh"
#include "model/ops/norm.h"
#include "model/ops/norm_cuda.cuh"

namespace gtron::cuda {

namespace {

constexpr int kResidentElems = 8;  // elements a lane holds on the one-element resident path

// Where a forward row comes from: first() on the first visit of each column pack, again() on the
// later two (streaming kernel); pack() on the only visit (Note [register-resident norm forward]).
template <typename T, int kV>
struct PlainRow {  // the row of x
  const T* x;
  __device__ void first(int c, float (&v)[kV]) const { load_floats<kV>(x + c, v); }
  __device__ void again(int c, float (&v)[kV]) const { load_floats<kV>(x + c, v); }
  __device__ void pack(int c, Pack<T, kV>& p) const {
    p = *reinterpret_cast<const Pack<T, kV>*>(x + c);
  }
};

template <typename T, int kV>
struct SumRow {  // h = x + a, rounded to T as add's kernel rounds it; first() also stores h
  const T* x;
  const T* a;
  T* h;
  __device__ void again(int c, float (&v)[kV]) const {
    float w[kV];
    load_floats<kV>(x + c, v);
    load_floats<kV>(a + c, w);
#pragma unroll
    for (int k = 0; k < kV; ++k) v[k] = to_float(from_float<T>(v[k] + w[k]));
  }
  __device__ void first(int c, float (&v)[kV]) const {
    again(c, v);
    store_floats<kV>(h + c, v);
  }
  __device__ void pack(int c, Pack<T, kV>& p) const {
    float v[kV], w[kV];
    load_floats<kV>(x + c, v);
    load_floats<kV>(a + c, w);
#pragma unroll
    for (int k = 0; k < kV; ++k) p.v[k] = from_float<T>(v[k] + w[k]);
    *reinterpret_cast<Pack<T, kV>*>(h + c) = p;
  }
};

// yr[c, c + kV) = (v − mu)·rs·gamma (+ beta): one pack of a row's output; with kQ also its FP8
// codes, from the values as stored (Note [fp8 fused producers] in model/ops/fp8.h: a half-warp's
// 16 packs of 8 are one 1x128 tile of the row).
template <int kV, bool kLN, bool kQ, typename T, typename P>
__device__ __forceinline__ void store_normalized(const float (&v)[kV], const P* __restrict__ gamma,
                                                 const P* __restrict__ beta, T* __restrict__ yr,
                                                 int c, float mu, float rs, const RowCodes& codes,
                                                 int64_t row) {
  float g[kV], out[kV];
  load_floats<kV>(gamma + c, g);
#pragma unroll
  for (int k = 0; k < kV; ++k) out[k] = (v[k] - mu) * rs * g[k];
  if constexpr (kLN) {
    float b[kV];
    load_floats<kV>(beta + c, b);
#pragma unroll
    for (int k = 0; k < kV; ++k) out[k] += b[k];
  }
  store_floats<kV>(yr + c, out);
  if constexpr (kQ) {
    static_assert(kV == 8, "fp8 codes from 16-byte bf16 packs only");
#pragma unroll
    for (int k = 0; k < kV; ++k) out[k] = to_float(from_float<T>(out[k]));
    codes.put(out, row, c);
  }
}

// One warp normalizes one row: y = (v − mean)·rstd·gamma (+ beta) of the row `src` yields;
// returns mean (0 for RMS) and rstd in *m and *r (every lane). Streaming: three reads of the row.
template <typename T, typename P, int kV, bool kLN, bool kQ, typename Row>
__device__ __forceinline__ void norm_row_forward(const Row& src, const P* __restrict__ gamma,
                                                 const P* __restrict__ beta, T* __restrict__ yr,
                                                 int C, float eps, int lane, float* m, float* r,
                                                 const RowCodes& codes, int64_t row) {
  float mu = 0.0f;
  if constexpr (kLN) {
    float sum = 0.0f;
    for (int c = lane * kV; c < C; c += 32 * kV) {
      float v[kV];
      src.first(c, v);
#pragma unroll
      for (int k = 0; k < kV; ++k) sum += v[k];
    }
    mu = warp_sum(sum) / static_cast<float>(C);
  }
  float sq = 0.0f;
  for (int c = lane * kV; c < C; c += 32 * kV) {
    float v[kV];
    if constexpr (kLN) {
      src.again(c, v);
    } else {
      src.first(c, v);
    }
#pragma unroll
    for (int k = 0; k < kV; ++k) sq += (v[k] - mu) * (v[k] - mu);
  }
  const float rs = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
  for (int c = lane * kV; c < C; c += 32 * kV) {
    float v[kV];
    src.again(c, v);
    store_normalized<kV, kLN, kQ>(v, gamma, beta, yr, c, mu, rs, codes, row);
  }
  *m = mu;
  *r = rs;
}

// norm_row_forward with the lane's kPacks packs read once into registers (Note
// [register-resident norm forward]): the same expressions in the same order.
template <typename T, typename P, int kV, int kPacks, bool kLN, bool kQ, typename Row>
__device__ __forceinline__ void norm_row_resident(const Row& src, const P* __restrict__ gamma,
                                                  const P* __restrict__ beta, T* __restrict__ yr,
                                                  int C, float eps, int lane, float* m, float* r,
                                                  const RowCodes& codes, int64_t row) {
  Pack<T, kV> v[kPacks];
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    if ((lane + 32 * j) * kV < C) src.pack((lane + 32 * j) * kV, v[j]);
  }
  float mu = 0.0f;
  if constexpr (kLN) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if ((lane + 32 * j) * kV >= C) break;
#pragma unroll
      for (int k = 0; k < kV; ++k) sum += to_float(v[j].v[k]);
    }
    mu = warp_sum(sum) / static_cast<float>(C);
  }
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    if ((lane + 32 * j) * kV >= C) break;
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      const float f = to_float(v[j].v[k]);
      sq += (f - mu) * (f - mu);
    }
  }
  const float rs = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int c = (lane + 32 * j) * kV;
    if (c >= C) break;
    float f[kV];
#pragma unroll
    for (int k = 0; k < kV; ++k) f[k] = to_float(v[j].v[k]);
    store_normalized<kV, kLN, kQ>(f, gamma, beta, yr, c, mu, rs, codes, row);
  }
  *m = mu;
  *r = rs;
}

// The row of warp `threadIdx.x / 32`, streamed (kPacks = 0) or register-resident; with kQ also
// its FP8 codes into `codes`.
template <typename T, typename P, int kV, int kPacks, bool kLN, bool kQ = false, typename Row>
__device__ __forceinline__ void normalize_row(const Row& src, const P* __restrict__ gamma,
                                              const P* __restrict__ beta, T* __restrict__ y,
                                              float* __restrict__ mean, float* __restrict__ rstd,
                                              int64_t row, int C, float eps,
                                              const RowCodes& codes = RowCodes{}) {
  const int lane = threadIdx.x % 32;
  float m, r;
  if constexpr (kPacks == 0) {
    norm_row_forward<T, P, kV, kLN, kQ>(src, gamma, beta, y + row * C, C, eps, lane, &m, &r, codes,
                                        row);
  } else {
    norm_row_resident<T, P, kV, kPacks, kLN, kQ>(src, gamma, beta, y + row * C, C, eps, lane, &m,
                                                 &r, codes, row);
  }
  if (lane == 0) {
    if constexpr (kLN) mean[row] = m;
    rstd[row] = r;
  }
}

// y = (x − mean)·rstd·gamma (+ beta); writes mean (LN only) and rstd per row, and with kQ y's FP8
// codes. Streaming.
template <typename T, typename P, int kV, bool kLN, bool kQ>
__global__ void norm_forward_kernel(const T* __restrict__ x, const P* __restrict__ gamma,
                                    const P* __restrict__ beta, T* __restrict__ y,
                                    float* __restrict__ mean, float* __restrict__ rstd, int64_t N,
                                    int C, float eps, RowCodes codes) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;  // whole warps leave together: the shuffles below see full warps
  normalize_row<T, P, kV, 0, kLN, kQ>(PlainRow<T, kV>{x + row * C}, gamma, beta, y, mean, rstd, row,
                                      C, eps, codes);
}

// h = x + a and y = norm(h) (Note [fused residual add and LayerNorm]). Streaming.
template <typename T, typename P, int kV, bool kLN>
__global__ void add_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ a,
                                        T* __restrict__ h, const P* __restrict__ gamma,
                                        const P* __restrict__ beta, T* __restrict__ y,
                                        float* __restrict__ mean, float* __restrict__ rstd,
                                        int64_t N, int C, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  normalize_row<T, P, kV, 0, kLN>(SumRow<T, kV>{x + row * C, a + row * C, h + row * C}, gamma, beta,
                                  y, mean, rstd, row, C, eps);
}

// Rows (warps) per block of the register-resident kernels: at ~50 registers a thread (bf16 C = 768)
// an SM holds 36 warps, which 4-warp blocks fill (9 blocks) and 8-warp blocks do not (4 blocks).
constexpr int kResidentRows = 4;

// The two kernels above with the row register-resident (Note [register-resident norm forward]).
template <typename T, typename P, int kV, int kPacks, bool kLN, bool kQ>
__global__ void norm_resident_kernel(const T* __restrict__ x, const P* __restrict__ gamma,
                                     const P* __restrict__ beta, T* __restrict__ y,
                                     float* __restrict__ mean, float* __restrict__ rstd, int64_t N,
                                     int C, float eps, RowCodes codes) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kResidentRows + threadIdx.x / 32;
  if (row >= N) return;
  normalize_row<T, P, kV, kPacks, kLN, kQ>(PlainRow<T, kV>{x + row * C}, gamma, beta, y, mean, rstd,
                                           row, C, eps, codes);
}

template <typename T, typename P, int kV, int kPacks, bool kLN>
__global__ void add_norm_resident_kernel(const T* __restrict__ x, const T* __restrict__ a,
                                         T* __restrict__ h, const P* __restrict__ gamma,
                                         const P* __restrict__ beta, T* __restrict__ y,
                                         float* __restrict__ mean, float* __restrict__ rstd,
                                         int64_t N, int C, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kResidentRows + threadIdx.x / 32;
  if (row >= N) return;
  normalize_row<T, P, kV, kPacks, kLN>(SumRow<T, kV>{x + row * C, a + row * C, h + row * C}, gamma,
                                       beta, y, mean, rstd, row, C, eps);
}

// y = norm(x); or, with `a`, h = x + a and y = norm(h). The pack width is the one the plain norm
// takes on its rows (x, or h: so the statistics sum in the same order, Note [fused residual add
// and LayerNorm]); x or a unaligned where h is not: add's kernel, then the norm's. With `q` (bf16,
// no `a`), also y's FP8 codes q[N, C] and scales qs (Note [fp8 fused producers] in
// model/ops/fp8.h): in the same pass where the rows go in 16-byte packs and C % 128 == 0, else
// fp8_quantize_rows of y after the norm.
template <typename T, typename P, bool kLN>
void launch_forward(const void* x, const void* gamma, const void* beta, void* y, float* mean,
                    float* rstd, int64_t N, int64_t C, double eps, void* stream,
                    const void* a = nullptr, void* h = nullptr, uint8_t* q = nullptr,
                    float* qs = nullptr) {
  constexpr int kV = kPack<T>;
  const bool packed = C % kV == 0 && is_aligned(a ? h : x, 16) && is_aligned(y, 16) &&
                      is_aligned(gamma, sizeof(P) * kV) && is_aligned(beta, sizeof(P) * kV);
  if (a != nullptr && packed && !(is_aligned(x, 16) && is_aligned(a, 16))) {
    add_forward(x, a, h, N * C, std::is_same_v<T, float> ? DType::kF32 : DType::kBF16, stream);
    x = h;
    a = nullptr;
  }
  const bool tiled = q != nullptr && packed && C % fp8::kTile == 0 && is_aligned(q, 8);
  const auto* xp = static_cast<const T*>(x);
  const auto* gp = static_cast<const P*>(gamma);
  const auto* bp = static_cast<const P*>(beta);
  auto* yp = static_cast<T*>(y);
  const auto blocks = static_cast<unsigned>(ceil_div<int64_t>(N, kRowsPerBlock));
  const auto resident_blocks = static_cast<unsigned>(ceil_div<int64_t>(N, kResidentRows));
  auto st = static_cast<cudaStream_t>(stream);
  const int c = static_cast<int>(C);
  const float e = static_cast<float>(eps);
  const RowCodes codes{q, qs, N, C};
  auto run = [&](auto v, auto packs, auto quantize) {
    constexpr int kW = decltype(v)::value;
    constexpr int kP = decltype(packs)::value;
    constexpr bool kQ = decltype(quantize)::value;
    constexpr dim3 kBlock(kRowsPerBlock * 32), kResident(kResidentRows * 32);
    const T* ap = static_cast<const T*>(a);
    T* hp = static_cast<T*>(h);
    if (a != nullptr) {
      if constexpr (kP == 0 && !kQ) {
        add_norm_forward_kernel<T, P, kW, kLN>
            <<<blocks, kBlock, 0, st>>>(xp, ap, hp, gp, bp, yp, mean, rstd, N, c, e);
      } else if constexpr (!kQ) {
        add_norm_resident_kernel<T, P, kW, kP, kLN>
            <<<resident_blocks, kResident, 0, st>>>(xp, ap, hp, gp, bp, yp, mean, rstd, N, c, e);
      }
      return;
    }
    if constexpr (kP == 0) {
      norm_forward_kernel<T, P, kW, kLN, kQ>
          <<<blocks, kBlock, 0, st>>>(xp, gp, bp, yp, mean, rstd, N, c, e, codes);
    } else {
      norm_resident_kernel<T, P, kW, kP, kLN, kQ>
          <<<resident_blocks, kResident, 0, st>>>(xp, gp, bp, yp, mean, rstd, N, c, e, codes);
    }
  };
  using Vec = std::integral_constant<int, kV>;
  using One = std::integral_constant<int, 1>;
  using Streamed = std::integral_constant<int, 0>;
  using Plain = std::false_type;
  const bool fast = norm_fast() && std::is_same_v<T, bf16>;  // f32 rows: the reference kernels
  if constexpr (std::is_same_v<T, bf16>) {
    if (tiled) {  // the codes from the same pass (kV = 8: a half-warp's packs are one tile)
      using Tiled = std::true_type;
      const int64_t packs = ceil_div<int64_t>(C, 32 * kV);
      if (!fast || !with_packs<8>(packs, [&](auto p) { run(Vec{}, p, Tiled{}); })) {
        run(Vec{}, Streamed{}, Tiled{});
      }
      CUDA_CHECK_LAUNCH();
      return;
    }
  }
  if (packed) {
    const int64_t packs = ceil_div<int64_t>(C, 32 * kV);
    if (!fast || !with_packs<8>(packs, [&](auto p) { run(Vec{}, p, Plain{}); })) {
      run(Vec{}, Streamed{}, Plain{});
    }
  } else if (fast && C <= 32 * kResidentElems) {
    run(One{}, std::integral_constant<int, kResidentElems>{}, Plain{});
  } else {
    run(One{}, Streamed{}, Plain{});
  }
  CUDA_CHECK_LAUNCH();
  if (q != nullptr) fp8_quantize_rows(y, N, C, q, qs, stream);  // a layout the tiles do not fit
}

// false: the streaming/reference kernels (tests and benchmarks only); true: the fast ones.
std::atomic<bool> g_norm_fast{true};

}  // namespace

bool norm_fast() { return g_norm_fast.load(std::memory_order_relaxed); }

void set_norm_fast(bool on) { g_norm_fast.store(on, std::memory_order_relaxed); }

void layernorm_forward(const void* x, const void* gamma, const void* beta, DType param, void* y,
                       float* mean, float* rstd, int64_t N, int64_t C, double eps, DType act,
                       void* stream, uint8_t* q, float* qs) {
  check_norm_sizes("layernorm", N, C);
  GTRON_CHECK(q == nullptr || act == DType::kBF16, "layernorm: fp8 codes of ", dtype_name(act),
              " rows; expected bf16");
  if (N == 0 || C == 0) return;
  dispatch_act_param("layernorm", act, param, [&](auto t, auto p) {
    launch_forward<decltype(t), decltype(p), true>(x, gamma, beta, y, mean, rstd, N, C, eps, stream,
                                                   nullptr, nullptr, q, qs);
  });
}

void add_layernorm_forward(const void* x, const void* a, const void* gamma, const void* beta,
                           DType param, void* h, void* y, float* mean, float* rstd, int64_t N,
                           int64_t C, double eps, DType act, void* stream) {
  check_norm_sizes("add_layernorm", N, C);
  if (N == 0 || C == 0) return;
  dispatch_act_param("add_layernorm", act, param, [&](auto t, auto p) {
    launch_forward<decltype(t), decltype(p), true>(x, gamma, beta, y, mean, rstd, N, C, eps, stream,
                                                   a, h);
  });
}

void add_rmsnorm_forward(const void* x, const void* a, const void* gamma, DType param, void* h,
                         void* y, float* rrms, int64_t N, int64_t C, double eps, DType act,
                         void* stream) {
  check_norm_sizes("add_rmsnorm", N, C);
  if (N == 0 || C == 0) return;
  dispatch_act_param("add_rmsnorm", act, param, [&](auto t, auto p) {
    launch_forward<decltype(t), decltype(p), false>(x, gamma, nullptr, y, nullptr, rrms, N, C, eps,
                                                    stream, a, h);
  });
}

void rmsnorm_forward(const void* x, const void* gamma, DType param, void* y, float* rrms, int64_t N,
                     int64_t C, double eps, DType act, void* stream, uint8_t* q, float* qs) {
  check_norm_sizes("rmsnorm", N, C);
  GTRON_CHECK(q == nullptr || act == DType::kBF16, "rmsnorm: fp8 codes of ", dtype_name(act),
              " rows; expected bf16");
  if (N == 0 || C == 0) return;
  dispatch_act_param("rmsnorm", act, param, [&](auto t, auto p) {
    launch_forward<decltype(t), decltype(p), false>(x, gamma, nullptr, y, nullptr, rrms, N, C, eps,
                                                    stream, nullptr, nullptr, q, qs);
  });
}

}  // namespace gtron::cuda
