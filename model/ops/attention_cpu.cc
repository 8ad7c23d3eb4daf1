// CPU kernels of causal attention: per (batch, head) Eigen GEMMs over the causal (lower) triangle.
//
// Layout: q, k, v and the output of head h are strided [T, HS] blocks read in place from qkv
// (row stride W = (NH + 2·NKV)·HS, 3C for GPT-2's NKV = NH) and written in place into out / dqkv
// (row stride C / W); nothing is copied. With grouped-query attention (NKV < NH), query head h
// reads k/v head h / (NH / NKV) in place too.
// Scores S = Q·Kᵀ (and dP = dO·Vᵀ) are formed by full GEMMs over row panels, rows [r0, r1)
// against keys [0, r1), so only the diagonal panels spill a little above the diagonal (Eigen's
// triangular-result product does the same work ~4x slower). Every product with P or dS uses a
// triangular view, so the masked upper half is never read.
//
// Row-wise softmax math runs in fixed blocks (model/ops/cpu_math.h).
//
// Document masking (`seg`, Note [document masking] in model/ops/segments.h): the segments of a row
// are non-decreasing, so the keys a query t may see are one range [lo[t], t], lo[t] the first
// position of t's segment. Softmax and its backward run over that range and store zeros in
// [0, lo[t]), so the triangular products that follow read zeros there, as they do above the
// diagonal.
//
// Forward keeps only lse[t] = log Σ_{s<=t} exp(scale·S[t, s]) per row; backward recomputes
// P = exp(scale·S − lse) (one extra T×T×HS GEMM) instead of storing B·NH·T² probabilities.
//
// Determinism policy: the (batch, head) pairs run in parallel (in the backward, the (batch, k/v
// head) pairs), but each pair is computed by one thread, start to finish, and writes only its own
// columns of out / dqkv. Eigen's general GEMM would split itself over threads (blocking by thread
// count) unless it runs inside a team of more than one thread; so the parallel region has no `if`
// clause: it is always a full team (with one thread allowed, Eigen sees one thread too). Results
// are bit-identical run to run and whatever the thread count.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "model/ops/attention.h"
#include "model/ops/cpu_math.h"
#include "model/ops/eigen.h"

namespace gtron::cpu {

namespace {

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// A [rows, HS] block of a wider row-major buffer.
template <typename T>
using Strided = Eigen::Map<RowMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using CStrided = Eigen::Map<const RowMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

// Query head h and its k/v head g in the packed rows [Tlen, W] of one sequence, W = (NH + 2·NKV)·HS
// (q heads, then k heads, then v heads).
template <typename T>
struct HeadView {
  CStrided<T> q, k, v;
  HeadView(const T* rows, int64_t h, int64_t g, int64_t Tlen, int64_t NH, int64_t NKV, int64_t HS)
      : q(rows + h * HS, Tlen, HS, Eigen::OuterStride<>((NH + 2 * NKV) * HS)),
        k(rows + (NH + g) * HS, Tlen, HS, Eigen::OuterStride<>((NH + 2 * NKV) * HS)),
        v(rows + (NH + NKV + g) * HS, Tlen, HS, Eigen::OuterStride<>((NH + 2 * NKV) * HS)) {}
};

// S[t, s] = a[t]·b[s] for s <= t (plus a few entries above the diagonal, which callers ignore).
template <typename T, typename A, typename B>
void lower_products(const A& a, const B& b, RowMat<T>& S) {
  constexpr int64_t kPanel = 64;
  const int64_t Tlen = S.rows();
  for (int64_t r0 = 0; r0 < Tlen; r0 += kPanel) {
    const int64_t rows = std::min(kPanel, Tlen - r0);
    S.block(r0, 0, rows, r0 + rows).noalias() =
        a.middleRows(r0, rows) * b.topRows(r0 + rows).transpose();
  }
}

// Turns each row t of S's lower triangle (raw scores Q·Kᵀ) into probabilities softmax(scale·S)
// over lo[t] <= s <= t (lo null: 0 <= s), with max-subtraction and zeros before lo[t], and writes
// lse[t].
template <typename T>
void softmax_rows(RowMat<T>& S, T scale, T* lse, const int64_t* lo) {
  const int64_t Tlen = S.rows();
  for (int64_t t = 0; t < Tlen; ++t) {
    T* full = S.data() + t * Tlen;
    const int64_t first = lo != nullptr ? lo[t] : 0;
    std::fill(full, full + first, T(0));
    T* row = full + first;
    const int64_t n = t + 1 - first;
    const T m = row_max(row, n);
    Block<T> acc = Block<T>::Zero();
    for (int64_t s = 0; s < n; s += kBlock) {
      const int len = block_len(s, n);
      const Block<T> e = ((load_block(row + s, len, m) - m) * scale).exp();
      store_block(row + s, e, len);
      acc += mask_tail(e, len);
    }
    const T sum = lane_sum(acc);
    const T inv = T(1) / sum;
    for (int64_t s = 0; s < n; s += kBlock) {
      const int len = block_len(s, n);
      store_block(row + s, Block<T>(load_block(row + s, len) * inv), len);
    }
    lse[t] = m * scale + std::log(sum);
  }
}

// Row t of the lower triangle: S (raw scores) -> P = exp(scale·S − lse[t]) over
// lo[t] <= s <= t, 0 before lo[t] (lo null: 0 <= s).
template <typename T>
void probabilities_from_lse(RowMat<T>& S, T scale, const T* lse, const int64_t* lo) {
  const int64_t Tlen = S.rows();
  for (int64_t t = 0; t < Tlen; ++t) {
    T* row = S.data() + t * Tlen;
    const int64_t first = lo != nullptr ? lo[t] : 0;
    std::fill(row, row + first, T(0));
    for (int64_t s = first; s <= t; s += kBlock) {
      const int len = block_len(s, t + 1);
      store_block(row + s, Block<T>((load_block(row + s, len) * scale - lse[t]).exp()), len);
    }
  }
}

// Row t of the lower triangle: dP -> dS = P ⊙ (dP − Σ_s P·dP) · scale (0 where P is 0: the
// document mask's zeros stay zeros).
template <typename T>
void softmax_backward_rows(const RowMat<T>& P, RowMat<T>& dP, T scale) {
  const int64_t Tlen = P.rows();
  for (int64_t t = 0; t < Tlen; ++t) {
    const T* p = P.data() + t * Tlen;
    T* d = dP.data() + t * Tlen;
    const int64_t n = t + 1;
    Block<T> acc = Block<T>::Zero();
    for (int64_t s = 0; s < n; s += kBlock) {
      const int len = block_len(s, n);
      acc += load_block(p + s, len) * load_block(d + s, len);  // padding is 0
    }
    const T dot = lane_sum(acc);
    for (int64_t s = 0; s < n; s += kBlock) {
      const int len = block_len(s, n);
      const Block<T> ds = load_block(p + s, len) * (load_block(d + s, len) - dot) * scale;
      store_block(d + s, ds, len);
    }
  }
}

// lo[b·Tlen + t]: the first position of t's segment in row b of seg [B, Tlen]. Aborts when a
// row's segments decrease (the contract of Note [document masking]).
std::vector<int64_t> segment_starts(const int32_t* seg, int64_t B, int64_t Tlen) {
  std::vector<int64_t> lo(static_cast<size_t>(B * Tlen));
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = seg + b * Tlen;
    for (int64_t t = 0; t < Tlen; ++t) {
      GTRON_CHECK(t == 0 || row[t] >= row[t - 1], "attention: segment ids of row ", b,
                  " decrease at position ", t, " (", row[t - 1], " then ", row[t], ")");
      lo[b * Tlen + t] = t > 0 && row[t] == row[t - 1] ? lo[b * Tlen + t - 1] : t;
    }
  }
  return lo;
}

}  // namespace

template <typename T>
void attention_gqa_forward(const T* qkv, T* out, T* lse, int64_t B, int64_t Tlen, int64_t NH,
                           int64_t NKV, int64_t HS, const int32_t* seg) {
  fix_eigen_blocking();
  const int64_t C = NH * HS, G = NH / NKV, W = (NH + 2 * NKV) * HS;
  const T scale = T(1) / std::sqrt(static_cast<T>(HS));
  const std::vector<int64_t> starts =
      seg != nullptr ? segment_starts(seg, B, Tlen) : std::vector<int64_t>();
#pragma omp parallel
  {
    RowMat<T> S(Tlen, Tlen);  // per-thread scratch: scores, then probabilities (lower half)
#pragma omp for
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      HeadView<T> hv(qkv + b * Tlen * W, h, h / G, Tlen, NH, NKV, HS);
      lower_products(hv.q, hv.k, S);
      softmax_rows(S, scale, lse + bh * Tlen, seg != nullptr ? starts.data() + b * Tlen : nullptr);
      Strided<T> O(out + b * Tlen * C + h * HS, Tlen, HS, Eigen::OuterStride<>(C));
      O.noalias() = S.template triangularView<Eigen::Lower>() * hv.v;
    }
  }
}

template <typename T>
void attention_forward(const T* qkv, T* out, T* lse, int64_t B, int64_t Tlen, int64_t NH,
                       int64_t HS, const int32_t* seg) {
  attention_gqa_forward(qkv, out, lse, B, Tlen, NH, NH, HS, seg);
}

// With P the probabilities and dO the output gradient of one query head:
//   dV += Pᵀ·dO,  dP = dO·Vᵀ,  dS = P ⊙ (dP − rowsum(P ⊙ dP)) · scale,  dQ += dS·K,  dK += dSᵀ·Q.
// A thread owns one (batch, k/v head) pair and runs its G query heads in order, so the shared dK
// and dV sum the heads' contributions in a fixed order.
template <typename T>
void attention_gqa_backward(const T* qkv, const T* lse, const T* dout, T* dqkv, int64_t B,
                            int64_t Tlen, int64_t NH, int64_t NKV, int64_t HS, const int32_t* seg) {
  fix_eigen_blocking();
  const int64_t C = NH * HS, G = NH / NKV, W = (NH + 2 * NKV) * HS;
  const T scale = T(1) / std::sqrt(static_cast<T>(HS));
  const std::vector<int64_t> starts =
      seg != nullptr ? segment_starts(seg, B, Tlen) : std::vector<int64_t>();
#pragma omp parallel
  {
    RowMat<T> P(Tlen, Tlen);   // per-thread scratch (lower half used)
    RowMat<T> dP(Tlen, Tlen);  // dP, then dS in place
#pragma omp for
    for (int64_t bg = 0; bg < B * NKV; ++bg) {
      const int64_t b = bg / NKV, g = bg % NKV;
      T* drow = dqkv + b * Tlen * W;
      Strided<T> dK(drow + (NH + g) * HS, Tlen, HS, Eigen::OuterStride<>(W));
      Strided<T> dV(drow + (NH + NKV + g) * HS, Tlen, HS, Eigen::OuterStride<>(W));
      for (int64_t h = g * G; h < (g + 1) * G; ++h) {
        HeadView<T> hv(qkv + b * Tlen * W, h, g, Tlen, NH, NKV, HS);
        const T* l = lse + (b * NH + h) * Tlen;
        Strided<T> dQ(drow + h * HS, Tlen, HS, Eigen::OuterStride<>(W));
        CStrided<T> dO(dout + b * Tlen * C + h * HS, Tlen, HS, Eigen::OuterStride<>(C));

        lower_products(hv.q, hv.k, P);
        probabilities_from_lse(P, scale, l, seg != nullptr ? starts.data() + b * Tlen : nullptr);
        dV.noalias() += P.template triangularView<Eigen::Lower>().transpose() * dO;
        lower_products(dO, hv.v, dP);
        softmax_backward_rows(P, dP, scale);
        dQ.noalias() += dP.template triangularView<Eigen::Lower>() * hv.k;
        dK.noalias() += dP.template triangularView<Eigen::Lower>().transpose() * hv.q;
      }
    }
  }
}

template <typename T>
void attention_backward(const T* qkv, const T* lse, const T* dout, T* dqkv, int64_t B, int64_t Tlen,
                        int64_t NH, int64_t HS, const int32_t* seg) {
  attention_gqa_backward(qkv, lse, dout, dqkv, B, Tlen, NH, NH, HS, seg);
}

template void attention_forward<float>(const float*, float*, float*, int64_t, int64_t, int64_t,
                                       int64_t, const int32_t*);
template void attention_forward<double>(const double*, double*, double*, int64_t, int64_t, int64_t,
                                        int64_t, const int32_t*);
template void attention_backward<float>(const float*, const float*, const float*, float*, int64_t,
                                        int64_t, int64_t, int64_t, const int32_t*);
template void attention_backward<double>(const double*, const double*, const double*, double*,
                                         int64_t, int64_t, int64_t, int64_t, const int32_t*);

template void attention_gqa_forward<float>(const float*, float*, float*, int64_t, int64_t, int64_t,
                                           int64_t, int64_t, const int32_t*);
template void attention_gqa_forward<double>(const double*, double*, double*, int64_t, int64_t,
                                            int64_t, int64_t, int64_t, const int32_t*);
template void attention_gqa_backward<float>(const float*, const float*, const float*, float*,
                                            int64_t, int64_t, int64_t, int64_t, int64_t,
                                            const int32_t*);
template void attention_gqa_backward<double>(const double*, const double*, const double*, double*,
                                             int64_t, int64_t, int64_t, int64_t, int64_t,
                                             const int32_t*);

}  // namespace gtron::cpu
