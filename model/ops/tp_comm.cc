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

// Width of a [..., C] tensor.
int64_t last_dim(const Shape& s) { return s.rank() == 0 ? 1 : s[s.rank() - 1]; }

// A [rows, P·width] tensor (of shape `shape`) from every rank's [rows, width] `x`: rank p's block
// at columns [p·width, (p+1)·width). An all-gather, then a copy into place, on the stream.
Tensor gather_blocks(const Tensor& x, int64_t rows, int64_t width, const Shape& shape,
                     TensorParallelGroup& g) {
  const int P = g.size();
  const int64_t n = rows * width;
  Stream& s = current_stream(x.device());
  Tensor parts = Tensor::empty(Shape{P * n}, x.dtype(), x.device(), &s);  // [P, rows, width]
  g.all_gather(x.view(Shape{n}), parts);
  Tensor y = Tensor::empty(shape, x.dtype(), x.device(), &s);
  const size_t bytes = static_cast<size_t>(width) * dtype_size(x.dtype());
  const char* src = static_cast<const char*>(parts.raw());
  char* dst = static_cast<char*>(y.raw());
  s.run([=] {
    for (int p = 0; p < P; ++p)
      for (int64_t i = 0; i < rows; ++i)
        std::memcpy(dst + (i * P + p) * bytes, src + (p * rows + i) * bytes, bytes);
  });
  return y;
}

// dst [rows, width] = (or +=, `accumulate`) block r of full [rows, P·width], on the stream.
void take_block(const Tensor& full, const Tensor& dst, int64_t rows, int64_t width, int r, int P,
                bool accumulate) {
  Stream& s = current_stream(full.device());
  dispatch_float(full.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* f = full.data<T>();
    T* d = dst.data<T>();
    s.run([=] {
      for (int64_t i = 0; i < rows; ++i) {
        const T* src = f + (i * P + r) * width;
        T* out = d + i * width;
        if (accumulate) {
          for (int64_t j = 0; j < width; ++j) out[j] += src[j];
        } else {
          std::memcpy(out, src, sizeof(T) * width);
        }
      }
    });
  });
}

// y[r, :] += bias over the rows of y [rows, C], on the stream.
void add_bias_rows(const Tensor& y, const Var& bias, int64_t rows, int64_t C) {
  Stream& s = current_stream(y.device());
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

// dbias += Σ_rows dy (rows in order), when the bias wants a gradient.
void bias_backward(const Var& bias, const Tensor& dy, int64_t rows, int64_t C) {
  if (!bias.defined() || !bias.requires_grad()) return;
  Stream& s = current_stream(dy.device());
  dispatch_float(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* d = dy.data<T>();
    T* db = bias.grad().data<T>();
    s.run([=] {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < C; ++c) db[c] += d[r * C + c];
    });
  });
}

// [B, T, C] split into P chunks along T: B rows of T·C elements, chunks of Tc·C.
struct TokenSplit {
  int64_t B = 0, T = 0, C = 0, Tc = 0;
};

TokenSplit token_split(const char* op, const Shape& s, int64_t T, int P) {
  GTRON_CHECK(s.rank() == 3 && T % P == 0, op, ": [B, T, C] with T = ", T, " split over ", P,
              " ranks; got ", s.str());
  return {s[0], T, s[2], T / P};
}

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
  const int64_t C = last_dim(x.shape()), rows = x.value().numel() / C;
  if (bias.defined()) check_shape("tp_reduce bias", bias.shape(), Shape{C});
  Tensor y = x.value().clone(&current_stream(x.device()));
  g.all_reduce(y, TpReduce::kSum);
  if (bias.defined()) add_bias_rows(y, bias, rows, C);
  const bool needs = x.requires_grad() || (bias.defined() && bias.requires_grad());
  Var out = Var::output(y, needs);
  if (out.requires_grad()) {
    record_backward([x, bias, out, rows, C] {
      if (!out.has_grad()) return;
      if (x.requires_grad()) accumulate_into(x.grad(), out.grad());
      bias_backward(bias, out.grad(), rows, C);
    });
  }
  return out;
}

Var tp_gather_features(const Var& x, TensorParallelGroup& g) {
  check_cpu("tp_gather_features", x);
  const int P = g.size(), r = g.rank();
  const int64_t c = last_dim(x.shape()), rows = x.value().numel() / c;
  std::vector<int64_t> dims = x.shape().vec();
  dims.back() = c * P;
  Var out = Var::output(gather_blocks(x.value(), rows, c, Shape(dims), g), x.requires_grad());
  if (out.requires_grad()) {
    record_backward([x, out, rows, c, P, r] {
      if (out.has_grad()) take_block(out.grad(), x.grad(), rows, c, r, P, /*accumulate=*/true);
    });
  }
  return out;
}

Var tp_gather_tokens(const Var& x, TensorParallelGroup& g) {
  check_cpu("tp_gather_tokens", x);
  const int P = g.size(), r = g.rank();
  const TokenSplit t = token_split("tp_gather_tokens", x.shape(), x.shape()[1] * P, P);
  Var out = Var::output(gather_blocks(x.value(), t.B, t.Tc * t.C, Shape{t.B, t.T, t.C}, g),
                        x.requires_grad());
  if (out.requires_grad()) {
    TensorParallelGroup* group = &g;
    record_backward([x, out, t, P, r, group] {
      if (!out.has_grad()) return;
      Tensor dy = out.grad();  // final and read by nobody else: reduced in place
      group->all_reduce(dy, TpReduce::kSum);
      take_block(dy, x.grad(), t.B, t.Tc * t.C, r, P, /*accumulate=*/true);
    });
  }
  return out;
}

Var tp_scatter_tokens(const Var& x, TensorParallelGroup& g, const Var& bias) {
  check_cpu("tp_scatter_tokens", x);
  const int P = g.size(), r = g.rank();
  const TokenSplit t = token_split("tp_scatter_tokens", x.shape(), x.shape()[1], P);
  if (bias.defined()) check_shape("tp_scatter_tokens bias", bias.shape(), Shape{t.C});
  Stream& s = current_stream(x.device());
  Tensor sum = x.value().clone(&s);
  g.all_reduce(sum, TpReduce::kSum);
  Tensor y = Tensor::empty(Shape{t.B, t.Tc, t.C}, x.dtype(), x.device(), &s);
  take_block(sum, y, t.B, t.Tc * t.C, r, P, /*accumulate=*/false);
  if (bias.defined()) add_bias_rows(y, bias, t.B * t.Tc, t.C);
  const bool needs = x.requires_grad() || (bias.defined() && bias.requires_grad());
  Var out = Var::output(y, needs);
  if (out.requires_grad()) {
    TensorParallelGroup* group = &g;
    record_backward([x, bias, out, t, group] {
      if (!out.has_grad()) return;
      if (x.requires_grad()) {
        accumulate_into(x.grad(),
                        gather_blocks(out.grad(), t.B, t.Tc * t.C, Shape{t.B, t.T, t.C}, *group));
      }
      bias_backward(bias, out.grad(), t.B * t.Tc, t.C);
    });
  }
  return out;
}

Var tp_split_tokens(const Var& x, TensorParallelGroup& g) {
  check_cpu("tp_split_tokens", x);
  const int P = g.size(), r = g.rank();
  const TokenSplit t = token_split("tp_split_tokens", x.shape(), x.shape()[1], P);
  Stream& s = current_stream(x.device());
  Tensor y = Tensor::empty(Shape{t.B, t.Tc, t.C}, x.dtype(), x.device(), &s);
  take_block(x.value(), y, t.B, t.Tc * t.C, r, P, /*accumulate=*/false);
  Var out = Var::output(y, x.requires_grad());
  if (out.requires_grad()) {
    TensorParallelGroup* group = &g;
    record_backward([x, out, t, group] {
      if (!out.has_grad()) return;
      accumulate_into(x.grad(),
                      gather_blocks(out.grad(), t.B, t.Tc * t.C, Shape{t.B, t.T, t.C}, *group));
    });
  }
  return out;
}

Var slice_rows(const Var& x, int64_t begin, int64_t end) {
  Var out = Var::output(x.value().rows(begin, end), x.requires_grad());
  if (out.requires_grad()) {
    record_backward([x, out, begin, end] {
      if (!out.has_grad()) return;
      Tensor rows = x.grad().rows(begin, end);
      accumulate_into(rows, out.grad());
    });
  }
  return out;
}

}  // namespace gtron
