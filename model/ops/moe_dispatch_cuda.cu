// MoE plan, dispatch and combine on CUDA (Note [MoE plan on CUDA] in model/ops/moe_dispatch.h).
// The plan is three small kernels over the slots; dispatch and combine are memory-bound row
// gathers moved as 16-byte packs where the row length and pointers allow (kernel_util.cuh's
// policy), each output element owned by one thread and summed in slot order.
#include "model/cuda/kernel_util.cuh"
#include "model/ops/moe_dispatch.h"
#include "model/ops/moe_router.h"

namespace gtron::cuda {

namespace {

constexpr int kPlanThreads = 256;
constexpr int kPlanWarps = kPlanThreads / 32;
constexpr int kPlanChunk = 1024;  // slots a block of the count and place kernels covers

// Step 1: counts[b·E + e] = the slots of chunk b routed to e.
__global__ void plan_count_kernel(const int32_t* __restrict__ ids, int64_t S, int E,
                                  int32_t* __restrict__ counts) {
  __shared__ int hist[kMaxExperts];
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int64_t s0 = static_cast<int64_t>(blockIdx.x) * kPlanChunk;
  for (int i = threadIdx.x; i < kPlanChunk && s0 + i < S; i += blockDim.x) {
    const int e = ids[s0 + i];
    if (e < 0 || e >= E) __trap();  // a routing bug: never write outside the plan
    atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[blockIdx.x * E + e] = hist[e];
}

// Step 2 (one block of kMaxExperts threads, thread e for expert e): counts[b·E + e] becomes the
// first row of chunk b's slots of e; offsets and the load counters follow from the totals.
__global__ void plan_scan_kernel(int32_t* __restrict__ counts, int64_t chunks, int E,
                                 int32_t* __restrict__ offsets, int32_t* __restrict__ load) {
  __shared__ int scan[kMaxExperts];
  const int e = threadIdx.x;
  int total = 0;
  if (e < E) {
    for (int64_t b = 0; b < chunks; ++b) {
      const int v = counts[b * E + e];
      counts[b * E + e] = total;
      total += v;
    }
  }
  scan[e] = total;
  __syncthreads();
  for (int d = 1; d < kMaxExperts; d *= 2) {  // inclusive scan over the experts (integers)
    const int add = e >= d ? scan[e - d] : 0;
    __syncthreads();
    scan[e] += add;
    __syncthreads();
  }
  if (e >= E) return;
  const int before = scan[e] - total;
  offsets[e] = before;
  if (e == E - 1) offsets[E] = scan[e];
  if (load != nullptr) load[e] += total;
  for (int64_t b = 0; b < chunks; ++b) counts[b * E + e] += before;
}

// Step 3: pos and src of chunk b's slots, in slot order within each expert.
__global__ void plan_place_kernel(const int32_t* __restrict__ ids, int64_t S, int E,
                                  const int32_t* __restrict__ base, int32_t* __restrict__ pos,
                                  int32_t* __restrict__ src) {
  __shared__ int running[kMaxExperts];
  __shared__ int warp_count[kPlanWarps][kMaxExperts];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    running[e] = base[blockIdx.x * E + e];
    for (int w = 0; w < kPlanWarps; ++w) warp_count[w][e] = 0;
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t s0 = static_cast<int64_t>(blockIdx.x) * kPlanChunk;
  for (int r = 0; r < kPlanChunk && s0 + r < S; r += kPlanThreads) {
    const int64_t s = s0 + r + threadIdx.x;
    const bool valid = s < S;
    const int e = valid ? ids[s] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));  // earlier lanes of the same expert
    if (valid && rank == 0) warp_count[warp][e] = __popc(peers);
    __syncthreads();
    if (valid) {
      int p = running[e] + rank;
      for (int w = 0; w < warp; ++w) p += warp_count[w][e];
      pos[s] = p;
      src[p] = static_cast<int32_t>(s);
    }
    __syncthreads();
    if (valid && rank == 0) {
      atomicAdd(&running[e], __popc(peers));  // integers: any order gives the same sum
      warp_count[warp][e] = 0;
    }
    __syncthreads();
  }
}

// xp[r] = x[src[r] / k].
template <typename T, int kV>
__global__ void dispatch_forward_kernel(const T* __restrict__ x, const int32_t* __restrict__ src,
                                        T* __restrict__ xp, int64_t rows, int k, int64_t C) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (i >= rows * C) return;
  const int64_t r = i / C, c = i - r * C;
  const int64_t n = src[r] / k;
  *reinterpret_cast<Pack<T, kV>*>(xp + i) = *reinterpret_cast<const Pack<T, kV>*>(x + n * C + c);
}

// dx[n] (+)= Σ_j dxp[pos[n·k + j]], j in order.
template <typename T, int kV, bool kOverwrite>
__global__ void dispatch_backward_kernel(const T* __restrict__ dxp, const int32_t* __restrict__ pos,
                                         T* __restrict__ dx, int64_t N, int k, int64_t C) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (i >= N * C) return;
  const int64_t n = i / C, c = i - n * C;
  float acc[kV];
  if constexpr (kOverwrite) {
#pragma unroll
    for (int v = 0; v < kV; ++v) acc[v] = 0;
  } else {
    load_floats<kV>(dx + i, acc);
  }
  for (int j = 0; j < k; ++j) {
    float in[kV];
    load_floats<kV>(dxp + static_cast<int64_t>(pos[n * k + j]) * C + c, in);
#pragma unroll
    for (int v = 0; v < kV; ++v) acc[v] = __fadd_rn(acc[v], in[v]);
  }
  store_floats<kV>(dx + i, acc);
}

// y[n] = Σ_j gates[n, j] · yp[pos[n·k + j]], j in order.
template <typename T, typename G, int kV>
__global__ void combine_forward_kernel(const T* __restrict__ yp, const G* __restrict__ gates,
                                       const int32_t* __restrict__ pos, T* __restrict__ y,
                                       int64_t N, int k, int64_t C) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (i >= N * C) return;
  const int64_t n = i / C, c = i - n * C;
  float acc[kV];
  for (int j = 0; j < k; ++j) {
    const float g = to_float(gates[n * k + j]);
    float in[kV];
    load_floats<kV>(yp + static_cast<int64_t>(pos[n * k + j]) * C + c, in);
#pragma unroll
    for (int v = 0; v < kV; ++v) acc[v] = j == 0 ? g * in[v] : fmaf(g, in[v], acc[v]);
  }
  store_floats<kV>(y + i, acc);
}

// One warp a token: for each of its slots, dgates += dy[n] · yp[r] (a butterfly sum) and
// dyp[r] (+)= gate · dy[n]. Every permuted row r is one slot's, so no two warps write one row.
template <typename T, typename G, bool kOverwrite>
__global__ void combine_backward_kernel(const T* __restrict__ yp, const G* __restrict__ gates,
                                        const int32_t* __restrict__ pos, const T* __restrict__ dy,
                                        T* __restrict__ dyp, G* __restrict__ dgates, int64_t N,
                                        int k, int64_t C) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const T* d = dy + n * C;
  for (int j = 0; j < k; ++j) {
    const int64_t r = pos[n * k + j];
    const float g = to_float(gates[n * k + j]);
    float dot = 0;
    for (int64_t c = lane; c < C; c += 32) {
      const float dv = to_float(d[c]);
      if (dgates != nullptr) dot += dv * to_float(yp[r * C + c]);
      if (dyp != nullptr) {
        T* out = dyp + r * C + c;
        *out = from_float<T>(kOverwrite ? g * dv : fmaf(g, dv, to_float(*out)));
      }
    }
    if (dgates != nullptr) {
      dot = warp_sum(dot);
      if (lane == 0) dgates[n * k + j] = from_float<G>(to_float(dgates[n * k + j]) + dot);
    }
  }
}

// Whether kV-element packs fit every operand (C a multiple of kV, pointers 16-byte aligned).
bool packed(int64_t C, int kV, const void* a, const void* b, const void* c = nullptr) {
  return C % kV == 0 && is_aligned(a, 16) && is_aligned(b, 16) && is_aligned(c, 16);
}

// Calls fn(T{}, G{}) for the activations T and gates G (G = T, or f32 next to bf16).
template <typename Fn>
void dispatch_act_gates(const char* op, DType act, DType gate, Fn&& fn) {
  dispatch_act(op, act, [&](auto tag) {
    using T = decltype(tag);
    if (gate == act) {
      fn(T{}, T{});
    } else {
      GTRON_CHECK(gate == DType::kF32, op, ": gates ", dtype_name(gate), " next to ",
                  dtype_name(act), " rows; CUDA takes the rows' dtype or f32");
      fn(T{}, float{});
    }
  });
}

}  // namespace

int64_t moe_plan_scratch_bytes(int64_t slots, int64_t E) {
  return ceil_div<int64_t>(slots, kPlanChunk) * E * static_cast<int64_t>(sizeof(int32_t));
}

void moe_plan(const int32_t* ids, int64_t N, int k, int64_t E, int32_t* pos, int32_t* src,
              int32_t* offsets, int32_t* load, void* scratch, void* stream) {
  GTRON_CHECK(N >= 0 && k >= 1 && E > 0 && E <= kMaxExperts, "moe_plan: N = ", N, ", k = ", k,
              ", E = ", E, " (CUDA takes 1 to ", kMaxExperts, " experts)");
  GTRON_CHECK(N * k < (int64_t{1} << 31), "moe_plan: ", N * k, " slots overflow i32 rows");
  auto st = static_cast<cudaStream_t>(stream);
  const int64_t S = N * k;
  const int64_t chunks = ceil_div<int64_t>(S, kPlanChunk);
  auto* counts = static_cast<int32_t*>(scratch);
  const int e = static_cast<int>(E);
  if (chunks > 0) {
    plan_count_kernel<<<static_cast<unsigned>(chunks), kPlanThreads, 0, st>>>(ids, S, e, counts);
    CUDA_CHECK_LAUNCH();
  }
  plan_scan_kernel<<<1, kMaxExperts, 0, st>>>(counts, chunks, e, offsets, load);
  CUDA_CHECK_LAUNCH();
  if (chunks > 0) {
    plan_place_kernel<<<static_cast<unsigned>(chunks), kPlanThreads, 0, st>>>(ids, S, e, counts,
                                                                              pos, src);
    CUDA_CHECK_LAUNCH();
  }
}

void moe_dispatch_forward(const void* x, const int32_t* src, void* xp, int64_t N, int k, int64_t C,
                          DType act, void* stream) {
  GTRON_CHECK(N >= 0 && k >= 1 && C > 0, "moe_dispatch: N = ", N, ", k = ", k, ", C = ", C);
  if (N == 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_act("moe_dispatch", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* in = static_cast<const T*>(x);
    auto* out = static_cast<T*>(xp);
    const int64_t n = N * k * C;
    if (packed(C, kV, x, xp)) {
      dispatch_forward_kernel<T, kV><<<pack_blocks(n, kV), 256, 0, st>>>(in, src, out, N * k, k, C);
    } else {
      dispatch_forward_kernel<T, 1><<<pack_blocks(n, 1), 256, 0, st>>>(in, src, out, N * k, k, C);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void moe_dispatch_backward(const void* dxp, const int32_t* pos, void* dx, int64_t N, int k,
                           int64_t C, DType act, void* stream, bool overwrite) {
  GTRON_CHECK(N >= 0 && k >= 1 && C > 0, "moe_dispatch: N = ", N, ", k = ", k, ", C = ", C);
  if (N == 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_act("moe_dispatch", act, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = kPack<T>;
    const auto* in = static_cast<const T*>(dxp);
    auto* out = static_cast<T*>(dx);
    const int64_t n = N * C;
    const bool pk = packed(C, kV, dxp, dx);
    if (pk && overwrite) {
      dispatch_backward_kernel<T, kV, true>
          <<<pack_blocks(n, kV), 256, 0, st>>>(in, pos, out, N, k, C);
    } else if (pk) {
      dispatch_backward_kernel<T, kV, false>
          <<<pack_blocks(n, kV), 256, 0, st>>>(in, pos, out, N, k, C);
    } else if (overwrite) {
      dispatch_backward_kernel<T, 1, true>
          <<<pack_blocks(n, 1), 256, 0, st>>>(in, pos, out, N, k, C);
    } else {
      dispatch_backward_kernel<T, 1, false>
          <<<pack_blocks(n, 1), 256, 0, st>>>(in, pos, out, N, k, C);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void moe_combine_forward(const void* yp, const void* gates, const int32_t* pos, void* y, int64_t N,
                         int k, int64_t C, DType act, DType gate_dtype, void* stream) {
  GTRON_CHECK(N >= 0 && k >= 1 && C > 0, "moe_combine: N = ", N, ", k = ", k, ", C = ", C);
  if (N == 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_act_gates("moe_combine", act, gate_dtype, [&](auto tag, auto gtag) {
    using T = decltype(tag);
    using G = decltype(gtag);
    constexpr int kV = kPack<T>;
    const auto* in = static_cast<const T*>(yp);
    const auto* g = static_cast<const G*>(gates);
    auto* out = static_cast<T*>(y);
    const int64_t n = N * C;
    if (packed(C, kV, yp, y)) {
      combine_forward_kernel<T, G, kV>
          <<<pack_blocks(n, kV), 256, 0, st>>>(in, g, pos, out, N, k, C);
    } else {
      combine_forward_kernel<T, G, 1><<<pack_blocks(n, 1), 256, 0, st>>>(in, g, pos, out, N, k, C);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void moe_combine_backward(const void* yp, const void* gates, const int32_t* pos, const void* dy,
                          void* dyp, bool dyp_overwrite, void* dgates, int64_t N, int k, int64_t C,
                          DType act, DType gate_dtype, void* stream) {
  GTRON_CHECK(N >= 0 && k >= 1 && C > 0, "moe_combine: N = ", N, ", k = ", k, ", C = ", C);
  if (N == 0 || (dyp == nullptr && dgates == nullptr)) return;
  auto st = static_cast<cudaStream_t>(stream);
  const unsigned blocks = static_cast<unsigned>(ceil_div<int64_t>(N, 8));  // 8 warps a block
  dispatch_act_gates("moe_combine", act, gate_dtype, [&](auto tag, auto gtag) {
    using T = decltype(tag);
    using G = decltype(gtag);
    const auto* ypp = static_cast<const T*>(yp);
    const auto* g = static_cast<const G*>(gates);
    const auto* d = static_cast<const T*>(dy);
    auto* dypp = static_cast<T*>(dyp);
    auto* dg = static_cast<G*>(dgates);
    if (dyp_overwrite) {
      combine_backward_kernel<T, G, true>
          <<<blocks, 256, 0, st>>>(ypp, g, pos, d, dypp, dg, N, k, C);
    } else {
      combine_backward_kernel<T, G, false>
          <<<blocks, 256, 0, st>>>(ypp, g, pos, d, dypp, dg, N, k, C);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace gtron::cuda
