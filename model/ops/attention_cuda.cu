// Causal attention on CUDA: batched cuBLASLt GEMMs (model/cuda/gemm.h) around fused row kernels.
//
// Layout: qkv rows hold [q | k | v], head h in columns h·HS.. of each part: NH query heads, then
// NKV k and NKV v heads (GPT-2: NKV = NH; grouped-query attention: NKV divides NH, and query head h
// reads k/v head h / G, G = NH / NKV). The per-(b, h) blocks are not a single stride apart (b
// steps T·W, h steps HS), so they are first copied into head-major scratch [B·NH, T, HS]
// ("heads"; k and v: [B·NKV, T, HS]), one matrix per (b, h) every sHd elements; outputs and
// gradients are copied back. sHd and sTT (the [T, T] stride) are rounded up to 8 elements so that
// every matrix of a batch starts 16-byte aligned whatever T and HS are.
//
// Note [grouped head GEMMs]
// A product with one k/v operand runs as G batched GEMMs of B·NKV matrices, the j-th over query
// heads g·G + j (no copies of K or V); dK and dV, shared by G query heads, add the G products in
// order (beta = 1 after the first): deterministic. G = 1 is one GEMM over the B·NH heads, as
// before grouping existed.
//
// Forward:  S = Q·Kᵀ (fp32)  ->  P = causal softmax(scale·S) (act), lse  ->  O = P·V (act)
// Backward (the CPU contract: recompute P from lse instead of storing it):
//   S = Q·Kᵀ, P = exp(scale·S − lse);  dV = Pᵀ·dO;  dP = dO·Vᵀ (into S's buffer);
//   dS = P ⊙ (dP − rowsum(P ⊙ dP))·scale (in place over P);  dQ = dS·K;  dK = dSᵀ·Q;
//   dqkv += [dQ | dK | dV] (gradients kept in fp32 until this one rounding).
// P and dS are zero above the diagonal, so the full-square GEMMs read zeros there; the masked
// upper half of S is computed and ignored (2x the minimum score FLOPs: the price of plain GEMMs).
//
// Memory: the scratch is O(B·NH·T²): S (fp32) + P (act). E.g. B = 8, NH = 12, T = 1024 in bf16:
// 96·2^20·6 bytes = 576 MiB, held only while the kernel runs. A fused (flash) kernel would drop it;
// this version is the correct, simple baseline.
//
// Determinism: GEMMs pin one algorithm per shape; the row kernels reduce with xor butterflies.
//
// Document masking (`seg`, Note [document masking] in model/ops/segments.h): the two kernels that
// form P also zero the entries whose key lies in another segment than the query (kSeg builds;
// the others are unchanged). Everything after reads P, so dS is zero there too.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "model/cuda/gemm.h"
#include "model/cuda/kernel_util.cuh"
#include "model/ops/attention.h"

namespace gtron::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;  // row kernels: one warp per row

int64_t round8(int64_t n) { return (n + 7) / 8 * 8; }

// C = NH·HS is the width of the q heads and of the output; W = (NH + 2·NKV)·HS the qkv row.
struct Dims {
  int64_t B, T, NH, NKV, HS, C, W, G, BH, BKV, sHd, sTT;
  Dims(int64_t b, int64_t t, int64_t nh, int64_t nkv, int64_t hs)
      : B(b),
        T(t),
        NH(nh),
        NKV(nkv),
        HS(hs),
        C(nh * hs),
        W((nh + 2 * nkv) * hs),
        G(nh / nkv),
        BH(b * nh),
        BKV(b * nkv),
        sHd(round8(t * hs)),
        sTT(round8(t * t)) {}
  // The k (or v) heads seen as NKV plain heads: what the head-layout copies of K and V take.
  Dims kv() const { return Dims(B, T, NKV, NKV, HS); }
};

// dst (heads) [BH, T, HS] (stride sHd) = the head blocks of src rows [B·T, src_row] (col 0.. C).
// One block per row b·T + t (grid-stride): the row's (b, t) is divided out once, and the column's
// (h, j) with 32-bit arithmetic — per-element 64-bit divisions made this kernel ALU-bound. Each
// thread moves kV consecutive elements of one head (kV divides HS; 16-byte packs when aligned).
template <typename T, int kV>
__global__ void to_heads_kernel(const T* __restrict__ src, int64_t src_row, T* __restrict__ dst,
                                Dims d) {
  const int C = static_cast<int>(d.C), HS = static_cast<int>(d.HS);
  for (int64_t bt = blockIdx.x; bt < d.B * d.T; bt += gridDim.x) {
    const int64_t b = bt / d.T, t = bt % d.T;
    const T* in = src + bt * src_row;
    T* out = dst + b * d.NH * d.sHd + t * d.HS;
    for (int c = threadIdx.x * kV; c < C; c += blockDim.x * kV) {
      const int h = c / HS;
      *reinterpret_cast<Pack<T, kV>*>(out + h * d.sHd + (c - h * HS)) =
          *reinterpret_cast<const Pack<T, kV>*>(in + c);
    }
  }
}

// dst rows [B·T, dst_row] (col 0.. C) = (or +=) heads [BH, T, HS]; the layout of to_heads_kernel.
template <typename S, typename D, bool kAccumulate, int kV>
__global__ void from_heads_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t dst_row,
                                  Dims d) {
  const int C = static_cast<int>(d.C), HS = static_cast<int>(d.HS);
  for (int64_t bt = blockIdx.x; bt < d.B * d.T; bt += gridDim.x) {
    const int64_t b = bt / d.T, t = bt % d.T;
    const S* in = src + b * d.NH * d.sHd + t * d.HS;
    D* out = dst + bt * dst_row;
    for (int c = threadIdx.x * kV; c < C; c += blockDim.x * kV) {
      const int h = c / HS;
      float v[kV];
      load_floats<kV>(in + h * d.sHd + (c - h * HS), v);
      if constexpr (kAccumulate) {
        add_floats<kV>(out + c, v);
      } else {
        store_floats<kV>(out + c, v);
      }
    }
  }
}

// The first key row r = (bh, t) may see: 0, or with kSeg the first position of t's segment
// (segments are runs: Note [document masking]), found by bisection over seg's row of batch b.
template <bool kSeg>
__device__ __forceinline__ int64_t first_key(const int32_t* seg, int64_t r, int64_t t,
                                             const Dims& d) {
  if constexpr (!kSeg) {
    return 0;
  } else {
    const int32_t* row = seg + (r / d.T / d.NH) * d.T;
    const int32_t mine = row[t];
    int64_t lo = 0, hi = t;  // row[hi] == mine; find the least such index
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (row[mid] == mine) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }
}

// Row r = (bh, t): P[s] = exp(scale·S[s] − lse) for s0 <= s <= t, 0 elsewhere; lse[r] = log
// Σ_{s0<=s<=t} ..., s0 = first_key (0 without kSeg).
template <typename T, bool kSeg>
__global__ void causal_softmax_kernel(const float* __restrict__ S, T* __restrict__ P,
                                      float* __restrict__ lse, Dims d, float scale,
                                      const int32_t* __restrict__ seg) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= d.BH * d.T) return;
  const int64_t t = r % d.T;
  const int64_t off = (r / d.T) * d.sTT + t * d.T;
  const int64_t s0 = first_key<kSeg>(seg, r, t, d);
  const float* s = S + off;
  float m = -INFINITY;
  for (int64_t j = s0 + lane; j <= t; j += 32) m = fmaxf(m, s[j]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int64_t j = s0 + lane; j <= t; j += 32) sum += expf((s[j] - m) * scale);
  const float l = m * scale + logf(warp_sum(sum));
  for (int64_t j = lane; j < d.T; j += 32) {
    P[off + j] = from_float<T>(j <= t && j >= s0 ? expf(s[j] * scale - l) : 0.0f);
  }
  if (lane == 0) lse[r] = l;
}

// P = exp(scale·S − lse[row]) below and on the diagonal, 0 above (and with kSeg before the
// row's segment). One warp per row, like the other row kernels (one thread per element paid
// three 64-bit divisions per element).
template <typename T, bool kSeg>
__global__ void probs_from_lse_kernel(const float* __restrict__ S, const float* __restrict__ lse,
                                      T* __restrict__ P, Dims d, float scale,
                                      const int32_t* __restrict__ seg) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= d.BH * d.T) return;
  const int t = static_cast<int>(r % d.T), T_ = static_cast<int>(d.T);
  const int64_t off = (r / d.T) * d.sTT + static_cast<int64_t>(t) * d.T;
  const int s0 = static_cast<int>(first_key<kSeg>(seg, r, t, d));
  const float l = lse[r];
  for (int j = lane; j < T_; j += 32) {
    P[off + j] = from_float<T>(j <= t && j >= s0 ? expf(S[off + j] * scale - l) : 0.0f);
  }
}

// In place over P: dS = P ⊙ (dP − Σ_s P·dP)·scale on and below the diagonal, 0 above. P comes
// from probs_from_lse_kernel, which already wrote the zeros above the diagonal: only s <= t is read
// and rewritten (half the traffic of touching whole rows).
template <typename T>
__global__ void softmax_backward_kernel(T* __restrict__ P, const float* __restrict__ dP, Dims d,
                                        float scale) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= d.BH * d.T) return;
  const int t = static_cast<int>(r % d.T);
  const int64_t off = (r / d.T) * d.sTT + static_cast<int64_t>(t) * d.T;
  float dot = 0.0f;
  for (int j = lane; j <= t; j += 32) dot += to_float(P[off + j]) * dP[off + j];
  dot = warp_sum(dot);
  // Each element is read and rewritten by the same lane, after the warp's dot is complete.
  for (int j = lane; j <= t; j += 32) {
    const float p = to_float(P[off + j]);
    P[off + j] = from_float<T>(p * (dP[off + j] - dot) * scale);
  }
}

unsigned blocks(int64_t threads) {
  return static_cast<unsigned>(ceil_div<int64_t>(threads, kThreads));
}

// Grid of the per-row head-layout kernels (grid-stride over the B·T rows).
unsigned row_blocks(const Dims& d) {
  return static_cast<unsigned>(std::min<int64_t>(d.B * d.T, int64_t{1} << 30));
}

// Can kV-element packs move a head row? (kV divides HS and the row strides; pointers aligned.)
bool packs_fit(int kV, int64_t src_row, const Dims& d, const void* a, size_t a_elem, const void* b,
               size_t b_elem) {
  return d.HS % kV == 0 && src_row % kV == 0 && d.sHd % kV == 0 && is_aligned(a, a_elem * kV) &&
         is_aligned(b, b_elem * kV);
}

template <typename T>
void to_heads(const T* src, int64_t src_row, T* dst, const Dims& d, cudaStream_t st) {
  constexpr int kV = kPack<T>;
  if (packs_fit(kV, src_row, d, src, sizeof(T), dst, sizeof(T))) {
    to_heads_kernel<T, kV><<<row_blocks(d), kThreads, 0, st>>>(src, src_row, dst, d);
  } else {
    to_heads_kernel<T, 1><<<row_blocks(d), kThreads, 0, st>>>(src, src_row, dst, d);
  }
  CUDA_CHECK_LAUNCH();
}

template <typename S, typename D, bool kAccumulate>
void from_heads(const S* src, D* dst, int64_t dst_row, const Dims& d, cudaStream_t st) {
  constexpr int kV = 4;
  if (packs_fit(kV, dst_row, d, src, sizeof(S), dst, sizeof(D))) {
    from_heads_kernel<S, D, kAccumulate, kV>
        <<<row_blocks(d), kThreads, 0, st>>>(src, dst, dst_row, d);
  } else {
    from_heads_kernel<S, D, kAccumulate, 1>
        <<<row_blocks(d), kThreads, 0, st>>>(src, dst, dst_row, d);
  }
  CUDA_CHECK_LAUNCH();
}

// One matrix per head in the head-major scratch, every `stride` elements: one per query head
// (B·NH of them) or, with `kv`, one per k/v head (B·NKV), standing for each of its G query heads.
template <typename P>
struct HeadMat {
  P* p;
  int64_t stride;
  bool kv = false;
};

// The j-th of a grouped product's GEMMs takes query heads g·G + j: matrix j of each group.
template <typename P>
P* group_base(const HeadMat<P>& m, int64_t j, DType type) {
  if (m.kv) return m.p;
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  return static_cast<Byte*>(m.p) + j * m.stride * static_cast<int64_t>(dtype_size(type));
}

template <typename P>
int64_t group_stride(const HeadMat<P>& m, const Dims& d) {
  return m.kv ? m.stride : d.G * m.stride;
}

// C_h = op(A_h)·op(B_h) for every query head h, row-major (contract in model/cuda/gemm.h), as G
// batched GEMMs of B·NKV matrices (Note [grouped head GEMMs]); a k/v output sums over its G query
// heads.
void head_gemm(HeadMat<const void> a, bool ta, HeadMat<const void> b, bool tb, HeadMat<void> c,
               DType c_type, int64_t m, int64_t n, int64_t k, const Dims& d, DType act,
               void* stream) {
  for (int64_t j = 0; j < d.G; ++j) {
    GemmArgs g;
    g.a = group_base(a, j, act);
    g.trans_a = ta;
    g.b = group_base(b, j, act);
    g.trans_b = tb;
    g.c = group_base(c, j, c_type);
    g.m = m;
    g.n = n;
    g.k = k;
    g.ab = act;
    g.c_type = c_type;
    g.beta = c.kv && j > 0 ? 1.0f : 0.0f;
    g.batch = d.BKV;
    g.stride_a = group_stride(a, d);
    g.stride_b = group_stride(b, d);
    g.stride_c = group_stride(c, d);
    gemm(g, stream);
  }
}

// Scratch pieces, carved in one fixed order (ScratchCarver), for the size queries and launches.
template <typename T>
struct ForwardScratch {
  T *q, *k, *v, *P, *O;
  float* S;
  size_t bytes;
  ForwardScratch(void* base, const Dims& d) {
    ScratchCarver sc(base);
    q = sc.take<T>(d.BH * d.sHd);
    k = sc.take<T>(d.BKV * d.sHd);
    v = sc.take<T>(d.BKV * d.sHd);
    S = sc.take<float>(d.BH * d.sTT);
    P = sc.take<T>(d.BH * d.sTT);
    O = sc.take<T>(d.BH * d.sHd);
    bytes = sc.bytes();
  }
};

template <typename T>
struct BackwardScratch {
  T *q, *k, *v, *dO, *P;
  float *S, *dQ, *dK, *dV;
  size_t bytes;
  BackwardScratch(void* base, const Dims& d) {
    ScratchCarver sc(base);
    q = sc.take<T>(d.BH * d.sHd);
    k = sc.take<T>(d.BKV * d.sHd);
    v = sc.take<T>(d.BKV * d.sHd);
    dO = sc.take<T>(d.BH * d.sHd);
    S = sc.take<float>(d.BH * d.sTT);
    P = sc.take<T>(d.BH * d.sTT);
    dQ = sc.take<float>(d.BH * d.sHd);
    dK = sc.take<float>(d.BKV * d.sHd);
    dV = sc.take<float>(d.BKV * d.sHd);
    bytes = sc.bytes();
  }
};

template <typename T>
void split_heads(const T* qkv, T* q, T* k, T* v, const Dims& d, cudaStream_t st) {
  to_heads(qkv, d.W, q, d, st);
  to_heads(qkv + d.C, d.W, k, d.kv(), st);
  to_heads(qkv + d.C + d.NKV * d.HS, d.W, v, d.kv(), st);
}

template <typename T>
void forward(const T* qkv, T* out, float* lse, void* scratch, const Dims& d, float scale, DType act,
             cudaStream_t st, const int32_t* seg) {
  ForwardScratch<T> s(scratch, d);
  split_heads(qkv, s.q, s.k, s.v, d, st);
  head_gemm({s.q, d.sHd}, false, {s.k, d.sHd, true}, true, {s.S, d.sTT}, DType::kF32, d.T, d.T,
            d.HS, d, act, st);
  if (seg != nullptr) {
    causal_softmax_kernel<T, true>
        <<<blocks(d.BH * d.T * 32), kThreads, 0, st>>>(s.S, s.P, lse, d, scale, seg);
  } else {
    causal_softmax_kernel<T, false>
        <<<blocks(d.BH * d.T * 32), kThreads, 0, st>>>(s.S, s.P, lse, d, scale, nullptr);
  }
  CUDA_CHECK_LAUNCH();
  head_gemm({s.P, d.sTT}, false, {s.v, d.sHd, true}, false, {s.O, d.sHd}, act, d.T, d.HS, d.T, d,
            act, st);
  from_heads<T, T, false>(s.O, out, d.C, d, st);
}

template <typename T>
void backward(const T* qkv, const float* lse, const T* dout, T* dqkv, void* scratch, const Dims& d,
              float scale, DType act, cudaStream_t st, const int32_t* seg) {
  BackwardScratch<T> s(scratch, d);
  split_heads(qkv, s.q, s.k, s.v, d, st);
  to_heads(dout, d.C, s.dO, d, st);
  head_gemm({s.q, d.sHd}, false, {s.k, d.sHd, true}, true, {s.S, d.sTT}, DType::kF32, d.T, d.T,
            d.HS, d, act, st);
  if (seg != nullptr) {
    probs_from_lse_kernel<T, true>
        <<<blocks(d.BH * d.T * 32), kThreads, 0, st>>>(s.S, lse, s.P, d, scale, seg);
  } else {
    probs_from_lse_kernel<T, false>
        <<<blocks(d.BH * d.T * 32), kThreads, 0, st>>>(s.S, lse, s.P, d, scale, nullptr);
  }
  CUDA_CHECK_LAUNCH();
  // dV = Pᵀ·dO, then dP = dO·Vᵀ into S's buffer (S is no longer needed).
  head_gemm({s.P, d.sTT}, true, {s.dO, d.sHd}, false, {s.dV, d.sHd, true}, DType::kF32, d.T, d.HS,
            d.T, d, act, st);
  head_gemm({s.dO, d.sHd}, false, {s.v, d.sHd, true}, true, {s.S, d.sTT}, DType::kF32, d.T, d.T,
            d.HS, d, act, st);
  softmax_backward_kernel<T><<<blocks(d.BH * d.T * 32), kThreads, 0, st>>>(s.P, s.S, d, scale);
  CUDA_CHECK_LAUNCH();
  head_gemm({s.P, d.sTT}, false, {s.k, d.sHd, true}, false, {s.dQ, d.sHd}, DType::kF32, d.T, d.HS,
            d.T, d, act, st);
  head_gemm({s.P, d.sTT}, true, {s.q, d.sHd}, false, {s.dK, d.sHd, true}, DType::kF32, d.T, d.HS,
            d.T, d, act, st);
  from_heads<float, T, true>(s.dQ, dqkv, d.W, d, st);
  from_heads<float, T, true>(s.dK, dqkv + d.C, d.W, d.kv(), st);
  from_heads<float, T, true>(s.dV, dqkv + d.C + d.NKV * d.HS, d.W, d.kv(), st);
}

float score_scale(int64_t HS) { return 1.0f / sqrtf(static_cast<float>(HS)); }

Dims checked_dims(int64_t B, int64_t Tlen, int64_t NH, int64_t NKV, int64_t HS) {
  GTRON_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0, "causal_attention: NKV = ", NKV,
              " k/v heads must divide NH = ", NH, " query heads");
  return Dims(B, Tlen, NH, NKV, HS);
}

}  // namespace

int64_t attention_gqa_forward_scratch_bytes(int64_t B, int64_t Tlen, int64_t NH, int64_t NKV,
                                            int64_t HS, DType act) {
  int64_t bytes = 0;
  dispatch_act("causal_attention", act, [&](auto tag) {
    bytes = static_cast<int64_t>(
        ForwardScratch<decltype(tag)>(nullptr, checked_dims(B, Tlen, NH, NKV, HS)).bytes);
  });
  return bytes;
}

int64_t attention_gqa_backward_scratch_bytes(int64_t B, int64_t Tlen, int64_t NH, int64_t NKV,
                                             int64_t HS, DType act) {
  int64_t bytes = 0;
  dispatch_act("causal_attention", act, [&](auto tag) {
    bytes = static_cast<int64_t>(
        BackwardScratch<decltype(tag)>(nullptr, checked_dims(B, Tlen, NH, NKV, HS)).bytes);
  });
  return bytes;
}

void attention_gqa_forward(const void* qkv, void* out, float* lse, void* scratch, int64_t B,
                           int64_t Tlen, int64_t NH, int64_t NKV, int64_t HS, DType act,
                           void* stream, const int32_t* seg) {
  const Dims d = checked_dims(B, Tlen, NH, NKV, HS);
  if (B * Tlen * NH * HS == 0) return;
  GTRON_CHECK(scratch != nullptr, "causal_attention: forward needs scratch");
  dispatch_act("causal_attention", act, [&](auto tag) {
    using T = decltype(tag);
    forward<T>(static_cast<const T*>(qkv), static_cast<T*>(out), lse, scratch, d, score_scale(HS),
               act, static_cast<cudaStream_t>(stream), seg);
  });
}

void attention_gqa_backward(const void* qkv, const float* lse, const void* dout, void* dqkv,
                            void* scratch, int64_t B, int64_t Tlen, int64_t NH, int64_t NKV,
                            int64_t HS, DType act, void* stream, const int32_t* seg) {
  const Dims d = checked_dims(B, Tlen, NH, NKV, HS);
  if (B * Tlen * NH * HS == 0) return;
  GTRON_CHECK(scratch != nullptr, "causal_attention: backward needs scratch");
  dispatch_act("causal_attention", act, [&](auto tag) {
    using T = decltype(tag);
    backward<T>(static_cast<const T*>(qkv), lse, static_cast<const T*>(dout), static_cast<T*>(dqkv),
                scratch, d, score_scale(HS), act, static_cast<cudaStream_t>(stream), seg);
  });
}

int64_t attention_forward_scratch_bytes(int64_t B, int64_t Tlen, int64_t NH, int64_t HS,
                                        DType act) {
  return attention_gqa_forward_scratch_bytes(B, Tlen, NH, NH, HS, act);
}

int64_t attention_backward_scratch_bytes(int64_t B, int64_t Tlen, int64_t NH, int64_t HS,
                                         DType act) {
  return attention_gqa_backward_scratch_bytes(B, Tlen, NH, NH, HS, act);
}

void attention_forward(const void* qkv, void* out, float* lse, void* scratch, int64_t B,
                       int64_t Tlen, int64_t NH, int64_t HS, DType act, void* stream) {
  attention_gqa_forward(qkv, out, lse, scratch, B, Tlen, NH, NH, HS, act, stream);
}

void attention_backward(const void* qkv, const float* lse, const void* dout, void* dqkv,
                        void* scratch, int64_t B, int64_t Tlen, int64_t NH, int64_t HS, DType act,
                        void* stream) {
  attention_gqa_backward(qkv, lse, dout, dqkv, scratch, B, Tlen, NH, NH, HS, act, stream);
}

}  // namespace gtron::cuda
