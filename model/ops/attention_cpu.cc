// CPU kernels of causal attention: per (batch, head) Eigen GEMMs over the causal (lower) triangle.
//
// Layout: q, k, v and the output of head h are strided [T, HS] blocks read in place from qkv
// (row stride 3C) and written in place into out / dqkv (row stride C / 3C); nothing is copied.
// Scores S = Q·Kᵀ are formed on the lower triangle only (Eigen's triangular-result GEMM), and
// every product with P or dS uses a triangular view, so the masked upper half is never computed
// or read.
//
// Forward keeps only lse[t] = log Σ_{s<=t} exp(scale·S[t, s]) per row; backward recomputes
// P = exp(scale·S − lse) (one extra T×T×HS GEMM) instead of storing B·NH·T² probabilities.
//
// Determinism policy: the (batch, head) pairs run in parallel, but each pair is computed by one
// thread, start to finish, and writes only its own columns of out / dqkv; Eigen does not
// parallelise inside an OpenMP parallel region. So results are bit-identical run to run and
// whatever the thread count.
#include <cmath>
#include <limits>
#include <vector>

#include "model/ops/attention.h"
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

// The q, k, v blocks of head h in batch row b.
template <typename T>
struct HeadView {
  CStrided<T> q, k, v;
  HeadView(const T* qkv, int64_t b, int64_t h, int64_t Tlen, int64_t C, int64_t HS)
      : q(qkv + b * Tlen * 3 * C + h * HS, Tlen, HS, Eigen::OuterStride<>(3 * C)),
        k(qkv + b * Tlen * 3 * C + C + h * HS, Tlen, HS, Eigen::OuterStride<>(3 * C)),
        v(qkv + b * Tlen * 3 * C + 2 * C + h * HS, Tlen, HS, Eigen::OuterStride<>(3 * C)) {}
};

// Turns each row t of S's lower triangle (raw scores Q·Kᵀ) into probabilities softmax(scale·S)
// over s <= t, with max-subtraction, and writes lse[t].
template <typename T>
void softmax_rows(RowMat<T>& S, T scale, T* lse) {
  const int64_t Tlen = S.rows();
  for (int64_t t = 0; t < Tlen; ++t) {
    T* row = S.data() + t * Tlen;
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t s = 0; s <= t; ++s) m = row[s] > m ? row[s] : m;
    T sum = 0;
    for (int64_t s = 0; s <= t; ++s) {
      row[s] = std::exp((row[s] - m) * scale);
      sum += row[s];
    }
    const T inv = T(1) / sum;
    for (int64_t s = 0; s <= t; ++s) row[s] *= inv;
    lse[t] = m * scale + std::log(sum);
  }
}

}  // namespace

template <typename T>
void attention_forward(const T* qkv, T* out, T* lse, int64_t B, int64_t Tlen, int64_t NH,
                       int64_t HS) {
  const int64_t C = NH * HS;
  const T scale = T(1) / std::sqrt(static_cast<T>(HS));
#pragma omp parallel if (B * NH > 1)
  {
    RowMat<T> S(Tlen, Tlen);  // per-thread scratch: scores, then probabilities (lower half)
#pragma omp for
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      HeadView<T> hv(qkv, b, h, Tlen, C, HS);
      S.template triangularView<Eigen::Lower>() = hv.q * hv.k.transpose();
      softmax_rows(S, scale, lse + bh * Tlen);
      Strided<T> O(out + b * Tlen * C + h * HS, Tlen, HS, Eigen::OuterStride<>(C));
      O.noalias() = S.template triangularView<Eigen::Lower>() * hv.v;
    }
  }
}

// With P the probabilities and dO the output gradient of one head:
//   dV += Pᵀ·dO,  dP = dO·Vᵀ,  dS = P ⊙ (dP − rowsum(P ⊙ dP)) · scale,  dQ += dS·K,  dK += dSᵀ·Q.
template <typename T>
void attention_backward(const T* qkv, const T* lse, const T* dout, T* dqkv, int64_t B, int64_t Tlen,
                        int64_t NH, int64_t HS) {
  const int64_t C = NH * HS;
  const T scale = T(1) / std::sqrt(static_cast<T>(HS));
#pragma omp parallel if (B * NH > 1)
  {
    RowMat<T> P(Tlen, Tlen);   // per-thread scratch (lower half used)
    RowMat<T> dP(Tlen, Tlen);  // dP, then dS in place
#pragma omp for
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      HeadView<T> hv(qkv, b, h, Tlen, C, HS);
      const T* l = lse + bh * Tlen;
      T* dbase = dqkv + b * Tlen * 3 * C + h * HS;
      Strided<T> dQ(dbase, Tlen, HS, Eigen::OuterStride<>(3 * C));
      Strided<T> dK(dbase + C, Tlen, HS, Eigen::OuterStride<>(3 * C));
      Strided<T> dV(dbase + 2 * C, Tlen, HS, Eigen::OuterStride<>(3 * C));
      CStrided<T> dO(dout + b * Tlen * C + h * HS, Tlen, HS, Eigen::OuterStride<>(C));

      P.template triangularView<Eigen::Lower>() = hv.q * hv.k.transpose();
      for (int64_t t = 0; t < Tlen; ++t) {
        T* row = P.data() + t * Tlen;
        for (int64_t s = 0; s <= t; ++s) row[s] = std::exp(row[s] * scale - l[t]);
      }
      dV.noalias() += P.template triangularView<Eigen::Lower>().transpose() * dO;
      dP.template triangularView<Eigen::Lower>() = dO * hv.v.transpose();
      for (int64_t t = 0; t < Tlen; ++t) {
        const T* p = P.data() + t * Tlen;
        T* d = dP.data() + t * Tlen;
        T dot = 0;
        for (int64_t s = 0; s <= t; ++s) dot += p[s] * d[s];
        for (int64_t s = 0; s <= t; ++s) d[s] = p[s] * (d[s] - dot) * scale;
      }
      dQ.noalias() += dP.template triangularView<Eigen::Lower>() * hv.k;
      dK.noalias() += dP.template triangularView<Eigen::Lower>().transpose() * hv.q;
    }
  }
}

template void attention_forward<float>(const float*, float*, float*, int64_t, int64_t, int64_t,
                                       int64_t);
template void attention_forward<double>(const double*, double*, double*, int64_t, int64_t, int64_t,
                                        int64_t);
template void attention_backward<float>(const float*, const float*, const float*, float*, int64_t,
                                        int64_t, int64_t, int64_t);
template void attention_backward<double>(const double*, const double*, const double*, double*,
                                         int64_t, int64_t, int64_t, int64_t);

}  // namespace gtron::cpu
