#include "model/ops/tp_comm.h"

#include <cstring>

#include "model/cuda/runtime.h"
#include "model/ops/add.h"
#include "model/ops/device_util.h"
#include "model/ops/embedding.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

namespace {

// Width of a [..., C] tensor.
int64_t last_dim(const Shape& s) { return s.rank() == 0 ? 1 : s[s.rank() - 1]; }

// Copies `height` rows of `width` bytes between pitched host or device buffers, on the stream.
void copy_rows(Stream& s, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
               size_t width, size_t height) {
  if (s.device().is_cuda()) {
    cuda::memcpy_2d_async(dst, dst_pitch, src, src_pitch, width, height, s.native());
    return;
  }
  char* d = static_cast<char*>(dst);
  const char* f = static_cast<const char*>(src);
  s.run([=] {
    for (size_t i = 0; i < height; ++i) std::memcpy(d + i * dst_pitch, f + i * src_pitch, width);
  });
}

// A [rows, P·width] tensor (of shape `shape`) from every rank's [rows, width] `x`: rank p's block
// at columns [p·width, (p+1)·width). An all-gather, then a copy into place, on the stream (at
// P = 1 the gathered buffer is the result).
Tensor gather_blocks(const Tensor& x, int64_t rows, int64_t width, const Shape& shape,
                     TensorParallelGroup& g) {
  const int P = g.size();
  const int64_t n = rows * width;
  Stream& s = current_stream(x.device());
  Tensor parts = Tensor::empty(Shape{P * n}, x.dtype(), x.device(), &s);  // [P, rows, width]
  g.all_gather(x.view(Shape{n}), parts);
  if (P == 1) return parts.view(shape);
  Tensor y = Tensor::empty(shape, x.dtype(), x.device(), &s);
  const size_t bytes = static_cast<size_t>(width) * dtype_size(x.dtype());
  for (int p = 0; p < P; ++p) {
    copy_rows(s, static_cast<char*>(y.raw()) + p * bytes, P * bytes,
              static_cast<const char*>(parts.raw()) + p * rows * bytes, bytes, bytes,
              static_cast<size_t>(rows));
  }
  return y;
}

// dst [rows, width] = (or +=, `accumulate`) block r of full [rows, P·width], on the stream.
void take_block(const Tensor& full, Tensor dst, int64_t rows, int64_t width, int r, int P,
                bool accumulate) {
  Stream& s = current_stream(full.device());
  const size_t bytes = static_cast<size_t>(width) * dtype_size(full.dtype());
  const char* src = static_cast<const char*>(full.raw()) + r * bytes;
  if (!accumulate) {
    copy_rows(s, dst.raw(), bytes, src, P * bytes, bytes, static_cast<size_t>(rows));
    return;
  }
  Tensor block = Tensor::empty(dst.shape(), dst.dtype(), dst.device(), &s);
  copy_rows(s, block.raw(), bytes, src, P * bytes, bytes, static_cast<size_t>(rows));
  accumulate_into(dst, block);
}

// y + bias [C] on every row of y [rows, C], on the stream (CPU: y itself, updated).
Tensor add_bias_rows(const Tensor& y, const Var& bias, int64_t rows, int64_t C) {
  Stream& s = current_stream(y.device());
  if (y.device().is_cuda()) {  // the positions kernel with one position: y[r] + bias
    Tensor out = Tensor::empty(y.shape(), y.dtype(), y.device(), &s);
    cuda::add_positions_forward(y.raw(), bias.value().raw(), bias.dtype(), out.raw(), rows, 1, C,
                                y.dtype(), s.native());
    return out;
  }
  dispatch_float(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* yp = y.data<T>();
    const T* bp = bias.value().data<T>();
    s.run([=] {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < C; ++c) yp[r * C + c] += bp[c];
    });
  });
  return y;
}

// dbias += Σ_rows dy (rows in order), when the bias wants a gradient.
void bias_backward(const Var& bias, const Tensor& dy, int64_t rows, int64_t C) {
  if (!bias.defined() || !bias.requires_grad()) return;
  Stream& s = current_stream(dy.device());
  if (dy.device().is_cuda()) {  // the positions backward with one position: rows in order
    cuda::add_positions_backward(dy.raw(), nullptr, f32_grad("tp bias", bias.grad()), rows, 1, C,
                                 dy.dtype(), s.native());
    return;
  }
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
  const int64_t C = last_dim(x.shape()), rows = x.value().numel() / C;
  if (bias.defined()) check_shape("tp_reduce bias", bias.shape(), Shape{C});
  Tensor y = x.value().clone(&current_stream(x.device()));
  g.all_reduce(y, TpReduce::kSum);
  if (bias.defined()) y = add_bias_rows(y, bias, rows, C);
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
  const int P = g.size(), r = g.rank();
  const TokenSplit t = token_split("tp_scatter_tokens", x.shape(), x.shape()[1], P);
  if (bias.defined()) check_shape("tp_scatter_tokens bias", bias.shape(), Shape{t.C});
  Stream& s = current_stream(x.device());
  Tensor sum = x.value().clone(&s);
  g.all_reduce(sum, TpReduce::kSum);
  Tensor y = Tensor::empty(Shape{t.B, t.Tc, t.C}, x.dtype(), x.device(), &s);
  take_block(sum, y, t.B, t.Tc * t.C, r, P, /*accumulate=*/false);
  if (bias.defined()) y = add_bias_rows(y, bias, t.B * t.Tc, t.C);
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
