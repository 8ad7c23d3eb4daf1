// Determinism: every kernel runs serially over rows in order; the reductions over the group give
// every rank bit-identical statistics, so the loss and the replicated gradients downstream agree
// bit for bit across TP peers.
#include "model/ops/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "model/ops/device_util.h"
#include "model/ops/embedding.h"
#include "model/ops/loss.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

namespace {

void check_targets(const int32_t* t, int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i) {
    GTRON_CHECK(t[i] == kMaskedTarget || (t[i] >= 0 && t[i] < V),
                "vocab_parallel_cross_entropy: ", "target ", t[i], " at row ", i, " outside [0, ",
                V, ") and not kMaskedTarget");
  }
}

void check_tokens(const int32_t* t, int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i) {
    GTRON_CHECK(t[i] >= 0 && t[i] < V, "vocab_parallel_embedding: token ", t[i], " at row ", i,
                " outside [0, ", V, ")");
  }
}

int64_t count_unmasked(const int32_t* t, int64_t N) {
  int64_t n = 0;
  for (int64_t i = 0; i < N; ++i) n += t[i] != kMaskedTarget;
  return n;
}

// The CUDA lookup: the single-GPU kernels on ids made local (tokens of other ranks get the id
// Vl: a zero row, and no gradient).
Var local_lookup_cuda(const Tensor& tokens, const Var& table, int64_t v0, int64_t Vfull,
                      const Shape& out_shape) {
  const int64_t Vl = table.shape()[0], N = tokens.numel();
  Stream& s = current_stream(table.device());
  if (tokens.device().is_cpu()) check_tokens(tokens.data<int32_t>(), N, Vfull);
  const Tensor ids = ids_on_device(tokens, s);
  Tensor local = Tensor::empty(Shape{N}, DType::kI32, table.device(), &s);  // [N] in [0, Vl]
  cuda::embedding_local_ids(ids.data<int32_t>(), local.data<int32_t>(), N, v0, Vl, Vfull,
                            s.native());
  Tensor y = Tensor::empty(out_shape, table.dtype(), table.device(), &s);
  return embedding_of_ids(local, table, y, /*zero_outside=*/true);
}

}  // namespace

Var vocab_parallel_embedding(const Tensor& tokens, const Var& table, int64_t v0,
                             TensorParallelGroup& g, bool scatter_tokens) {
  GTRON_CHECK(tokens.dtype() == DType::kI32 &&
                  (tokens.device().is_cpu() || tokens.device() == table.device()),
              "vocab_parallel_embedding: i32 tokens on the CPU or the table's device");
  GTRON_CHECK(table.shape().rank() == 2, "vocab_parallel_embedding: table ", table.shape().str());
  const int64_t Vl = table.shape()[0], C = table.shape()[1], N = tokens.numel();
  std::vector<int64_t> dims = tokens.shape().vec();
  dims.push_back(C);
  if (table.device().is_cuda()) {
    Var local = local_lookup_cuda(tokens, table, v0, Vl * g.size(), Shape(dims));
    return scatter_tokens ? tp_scatter_tokens(local, g) : tp_reduce(local, g);
  }
  GTRON_CHECK(tokens.device().is_cpu(), "vocab_parallel_embedding: CPU tokens for a CPU table");
  Stream& s = current_stream(table.device());
  Tensor part = Tensor::empty(Shape(dims), table.dtype(), table.device(), &s);
  dispatch_float(table.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int32_t* tk = tokens.data<int32_t>();
    const T* tb = table.value().data<T>();
    T* y = part.data<T>();
    s.run([=] {
      for (int64_t i = 0; i < N; ++i) {
        const int64_t row = static_cast<int64_t>(tk[i]) - v0;
        if (row >= 0 && row < Vl) {
          std::memcpy(y + i * C, tb + row * C, sizeof(T) * C);
        } else {
          std::fill(y + i * C, y + (i + 1) * C, T(0));
        }
      }
    });
  });
  Var local = Var::output(part, table.requires_grad());
  if (local.requires_grad()) {
    record_backward([tokens, table, local, v0, Vl, C, N] {
      if (!local.has_grad()) return;
      Stream& s = current_stream(local.device());
      dispatch_float(local.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const int32_t* tk = tokens.data<int32_t>();
        const T* dy = local.grad().data<T>();
        T* dt = table.grad().data<T>();
        s.run([=] {
          for (int64_t i = 0; i < N; ++i) {
            const int64_t row = static_cast<int64_t>(tk[i]) - v0;
            if (row < 0 || row >= Vl) continue;
            for (int64_t c = 0; c < C; ++c) dt[row * C + c] += dy[i * C + c];
          }
        });
      });
    });
  }
  return scatter_tokens ? tp_scatter_tokens(local, g) : tp_reduce(local, g);
}

namespace {

// Row statistics of the local columns: stats[i] = max over this rank's columns below V (−inf when
// it has none), after the group max; then sums[i] = Σ exp(l − max) and sums[N + i] = the target's
// logit when this rank holds it (else 0), before the group sum.
template <typename T>
void local_max(const T* l, T* mx, int64_t N, int64_t Vl, int64_t valid) {
  for (int64_t i = 0; i < N; ++i) {
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < valid; ++j) m = std::max(m, l[i * Vl + j]);
    mx[i] = m;
  }
}

template <typename T>
void local_sums(const T* l, const int32_t* tg, const T* mx, T* sums, int64_t N, int64_t Vl,
                int64_t valid, int64_t v0) {
  for (int64_t i = 0; i < N; ++i) {
    T acc = 0;
    for (int64_t j = 0; j < valid; ++j) acc += std::exp(l[i * Vl + j] - mx[i]);
    sums[i] = acc;
    const int64_t t = static_cast<int64_t>(tg[i]) - v0;
    sums[N + i] = tg[i] != kMaskedTarget && t >= 0 && t < valid ? l[i * Vl + t] : T(0);
  }
}

// d[:, :valid] += (softmax − onehot) · dloss / n_unmasked over this rank's columns, from the
// reduced row max and log-sum-exp.
template <typename T>
void local_grad(const T* l, const int32_t* tg, const T* mx, const T* lse, const T* dloss, T* d,
                int64_t N, int64_t Vl, int64_t valid, int64_t v0) {
  const int64_t n = count_unmasked(tg, N);
  if (n == 0) return;
  const T gs = dloss[0] / static_cast<T>(n);
  for (int64_t i = 0; i < N; ++i) {
    if (tg[i] == kMaskedTarget) continue;
    const int64_t t = static_cast<int64_t>(tg[i]) - v0;
    for (int64_t j = 0; j < valid; ++j) {
      T p = std::exp(l[i * Vl + j] - mx[i] - lse[i]);
      if (j == t) p -= T(1);
      d[i * Vl + j] += p * gs;
    }
  }
}

// The CUDA cross-entropy: the single-GPU kernels (model/ops/loss_cuda.cu) over this rank's
// columns, with the row max and the [Σ exp | target logit] pairs reduced over the group in
// between. Statistics, count and loss are f32/i32 device values; no host sync.
struct VocabSplit {
  int64_t N, V, Vl, valid, v0;
};

Var vocab_parallel_ce_cuda(const Var& logits, const Tensor& targets, VocabSplit d,
                           TensorParallelGroup& g, bool overwrite) {
  const Device dev = logits.device();
  Stream& s = current_stream(dev);
  const int64_t N = d.N;
  if (targets.device().is_cpu()) check_targets(targets.data<int32_t>(), N, d.V);
  const Tensor tg = ids_on_device(targets, s);                      // [N] i32
  Tensor count = Tensor::empty(Shape{1}, DType::kI32, dev, &s);     // unmasked rows
  Tensor lmax = Tensor::empty(Shape{N}, DType::kF32, dev, &s);      // [N] this rank's row max
  Tensor gmax = Tensor::empty(Shape{N}, DType::kF32, dev, &s);      // [N] the group's
  Tensor sums = Tensor::empty(Shape{2 * N}, DType::kF32, dev, &s);  // [Σexp | target logit]
  Tensor rlse = Tensor::empty(Shape{N}, DType::kF32, dev, &s);      // [N] log Σ exp(l − gmax)
  Tensor loss = Tensor::empty(Shape{}, DType::kF32, dev, &s);
  const int32_t* tp = tg.data<int32_t>();
  cuda::cross_entropy_count(tp, count.data<int32_t>(), N, d.V, s.native());
  cuda::cross_entropy_row_sums(logits.value().raw(), tp, lmax.data<float>(), sums.data<float>(), N,
                               d.valid, d.Vl, logits.dtype(), s.native());
  gmax.copy_from(lmax, &s);
  g.all_reduce(gmax, TpReduce::kMax);
  cuda::vocab_parallel_rescale(logits.value().raw(), tp, lmax.data<float>(), gmax.data<float>(),
                               sums.data<float>(), N, d.Vl, d.valid, d.v0, logits.dtype(),
                               s.native());
  g.all_reduce(sums, TpReduce::kSum);
  cuda::vocab_parallel_finalize(tp, gmax.data<float>(), sums.data<float>(), rlse.data<float>(),
                                count.data<int32_t>(), loss.data<float>(), N, s.native());
  Var out = Var::output(loss, logits.requires_grad());
  if (!out.requires_grad()) return out;
  record_backward([logits, tg, gmax, rlse, count, out, d, overwrite] {
    if (!out.has_grad()) return;
    Stream& s = current_stream(out.device());
    const int32_t* tp = tg.data<int32_t>();
    if (overwrite && !logits.has_grad()) {  // as the single-GPU loss: the gradient in place
      Tensor buffer = logits.value();
      cuda::cross_entropy_backward_inplace(buffer.raw(), tp, gmax.data<float>(), rlse.data<float>(),
                                           count.data<int32_t>(), out.grad().data<float>(), d.N,
                                           d.valid, d.Vl, logits.dtype(), s.native(), d.v0);
      logits.set_grad(buffer);
      return;
    }
    cuda::cross_entropy_backward(logits.value().raw(), tp, gmax.data<float>(), rlse.data<float>(),
                                 count.data<int32_t>(), out.grad().data<float>(),
                                 logits.grad().raw(), d.N, d.valid, d.Vl, logits.dtype(),
                                 s.native(), d.v0);
  });
  return out;
}

}  // namespace

Var vocab_parallel_cross_entropy(const Var& logits, const Tensor& targets, int64_t V, int64_t v0,
                                 TensorParallelGroup& g, bool overwrite_logits) {
  GTRON_CHECK(targets.dtype() == DType::kI32 &&
                  (targets.device().is_cpu() || targets.device() == logits.device()),
              "vocab_parallel_cross_entropy: i32 targets on the CPU or the logits' device");
  std::vector<int64_t> lead = logits.shape().vec();
  const int64_t Vl = lead.back();
  lead.pop_back();
  check_shape("vocab_parallel_cross_entropy targets", targets.shape(), Shape(lead));
  const int64_t N = targets.numel();
  const int64_t valid = std::clamp<int64_t>(V - v0, 0, Vl);  // this rank's columns below V
  if (logits.device().is_cuda()) {
    return vocab_parallel_ce_cuda(logits, targets, {N, V, Vl, valid, v0}, g, overwrite_logits);
  }
  GTRON_CHECK(targets.device().is_cpu(), "vocab_parallel_cross_entropy: CPU targets");
  Stream& s = current_stream(logits.device());
  const DType dt = logits.dtype();
  Tensor mx = Tensor::empty(Shape{N}, dt, logits.device(), &s);        // [N] row max
  Tensor sums = Tensor::empty(Shape{2 * N}, dt, logits.device(), &s);  // [Σexp | target logit]
  Tensor lse = Tensor::empty(Shape{N}, dt, logits.device(), &s);       // [N] log Σ exp(l − max)
  Tensor loss = Tensor::empty(Shape{}, dt, logits.device(), &s);
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* l = logits.value().data<T>();
    const int32_t* tg = targets.data<int32_t>();
    T *mp = mx.data<T>(), *sp = sums.data<T>(), *lp = lse.data<T>(), *yp = loss.data<T>();
    s.run([=] {
      check_targets(tg, N, V);
      local_max<T>(l, mp, N, Vl, valid);
    });
    g.all_reduce(mx, TpReduce::kMax);
    s.run([=] { local_sums<T>(l, tg, mp, sp, N, Vl, valid, v0); });
    g.all_reduce(sums, TpReduce::kSum);
    s.run([=] {
      T total = 0;
      for (int64_t i = 0; i < N; ++i) {
        lp[i] = std::log(sp[i]);
        if (tg[i] != kMaskedTarget) total += lp[i] - (sp[N + i] - mp[i]);
      }
      const int64_t n = count_unmasked(tg, N);
      yp[0] = n > 0 ? total / static_cast<T>(n) : T(0);
    });
  });
  Var out = Var::output(loss, logits.requires_grad());
  if (out.requires_grad()) {
    record_backward([logits, targets, mx, lse, out, N, Vl, valid, v0] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* l = logits.value().data<T>();
        const int32_t* tg = targets.data<int32_t>();
        const T *mp = mx.data<T>(), *lp = lse.data<T>(), *dyp = out.grad().data<T>();
        T* d = logits.grad().data<T>();
        s.run([=] { local_grad<T>(l, tg, mp, lp, dyp, d, N, Vl, valid, v0); });
      });
    });
  }
  return out;
}

}  // namespace gtron
