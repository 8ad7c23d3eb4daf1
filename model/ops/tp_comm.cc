#include "model/ops/tp_comm.h"

#include <cstring>

#include "model/ops/add.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

namespace {

void check_cpu(const char* op, const Var& x) {
  GTRON_CHECK(x.device().is_cpu(), op, ": tensor parallelism runs on CPU tensors; got ",
              x.device().str());
}

// Rows and width of a [..., C] tensor.
int64_t last_dim(const Shape& s) { return s.rank() == 0 ? 1 : s[s.rank() - 1]; }

}  // namespace

Var tp_copy(const Var& x, TensorParallelGroup& g) {
  check_cpu("tp_copy", x);
  Var out = Var::output(x.value(), x.requires_grad());
  if (out.requires_grad()) {
    TensorParallelGroup* group = &g;
    record_backward([x, out, group] {
      if (!out.has_grad()) return;
      // out's gradient is final here and read by nobody else: reduce it in place.
      Tensor dy = out.grad();
      group->all_reduce(dy, TpReduce::kSum);
      accumulate_into(x.grad(), dy);
    });
  }
  return out;
}

Var tp_reduce(const Var& x, TensorParallelGroup& g, const Var& bias) {
  check_cpu("tp_reduce", x);
  const int64_t C = last_dim(x.shape()), n = x.value().numel(), rows = n / C;
  if (bias.defined()) check_shape("tp_reduce bias", bias.shape(), Shape{C});
  Stream& s = current_stream(x.device());
  Tensor y = x.value().clone(&s);
  g.all_reduce(y, TpReduce::kSum);
  if (bias.defined()) {
    dispatch_float(y.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* yp = y.data<T>();
      const T* bp = bias.value().data<T>();
      s.run([=] {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < C; ++c) yp[r * C + c] += bp[c];
      });
    });
  }
  const bool needs = x.requires_grad() || (bias.defined() && bias.requires_grad());
  Var out = Var::output(y, needs);
  if (out.requires_grad()) {
    record_backward([x, bias, out, rows, C] {
      if (!out.has_grad()) return;
      if (x.requires_grad()) accumulate_into(x.grad(), out.grad());
      if (!bias.defined() || !bias.requires_grad()) return;
      Stream& s = current_stream(out.device());
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* dy = out.grad().data<T>();
        T* db = bias.grad().data<T>();
        s.run([=] {
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < C; ++c) db[c] += dy[r * C + c];
        });
      });
    });
  }
  return out;
}

Var tp_gather_features(const Var& x, TensorParallelGroup& g) {
  check_cpu("tp_gather_features", x);
  const int P = g.size(), r = g.rank();
  const int64_t c = last_dim(x.shape()), n = x.value().numel(), rows = n / c;
  std::vector<int64_t> dims = x.shape().vec();
  dims.back() = c * P;
  Stream& s = current_stream(x.device());
  Tensor parts = Tensor::empty(Shape{P * n}, x.dtype(), x.device(), &s);  // [P, rows, c]
  g.all_gather(x.value().view(Shape{n}), parts);
  Tensor y = Tensor::empty(Shape(dims), x.dtype(), x.device(), &s);  // [rows, P·c]
  const size_t bytes = static_cast<size_t>(c) * dtype_size(x.dtype());
  {
    const char* src = static_cast<const char*>(parts.raw());
    char* dst = static_cast<char*>(y.raw());
    s.run([=] {
      for (int p = 0; p < P; ++p)
        for (int64_t i = 0; i < rows; ++i)
          std::memcpy(dst + (i * P + p) * bytes, src + (p * rows + i) * bytes, bytes);
    });
  }
  Var out = Var::output(y, x.requires_grad());
  if (out.requires_grad()) {
    record_backward([x, out, rows, c, P, r] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* dy = out.grad().data<T>();
        T* dx = x.grad().data<T>();
        s.run([=] {
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < c; ++j) dx[i * c + j] += dy[(i * P + r) * c + j];
        });
      });
    });
  }
  return out;
}

}  // namespace gtron
