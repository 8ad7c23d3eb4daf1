#include "model/ops/embedding.h"

#include "model/ops/add.h"
#include "model/ops/device_util.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

namespace {

// Host ids are checked here, before the copy to the device (the CPU kernel checks its own).
void check_tokens_on_host(const Tensor& tokens, int64_t V) {
  const int32_t* tp = tokens.data<int32_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    GTRON_CHECK(tp[i] >= 0 && tp[i] < V, "embedding: token ", tp[i], " at row ", i, " outside [0, ",
                V, ")");
  }
}

// add_positions with per-row positions (document masking): y[i] = x[i] + wpe[positions[i]].
Var add_positions_at(const Var& x, const Var& wpe, const Tensor& positions) {
  const int64_t N = x.shape()[0] * x.shape()[1], C = x.shape()[2], P = wpe.shape()[0];
  GTRON_CHECK(positions.dtype() == DType::kI32 && positions.device() == x.device(),
              "add_positions: positions must be i32 on ", x.device().str());
  check_shape("add_positions: positions", positions.shape(), Shape{x.shape()[0], x.shape()[1]});
  Device dev = x.device();
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), dev, &s);
  if (dev.is_cuda()) {
    cuda::add_positions_at_forward(x.value().raw(), wpe.value().raw(), wpe.dtype(),
                                   positions.data<int32_t>(), y.raw(), N, P, C, x.dtype(),
                                   s.native());
  } else {
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = x.value().data<T>();
      const T* pp = wpe.value().data<T>();
      const int32_t* ip = positions.data<int32_t>();
      T* yp = y.data<T>();
      s.run([=] { cpu::add_positions_at_forward<T>(xp, pp, ip, yp, N, P, C); });
    });
  }
  Var out = Var::output(y, x.requires_grad() || wpe.requires_grad());
  if (out.requires_grad()) {
    record_backward([x, wpe, positions, out, N, P, C] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      const int32_t* ip = positions.data<int32_t>();
      if (out.device().is_cuda()) {
        if (x.requires_grad()) {
          cuda::accumulate(x.grad().raw(), out.grad().raw(), N * C, out.dtype(), s.native());
        }
        if (wpe.requires_grad()) {
          Tensor scratch = scratch_bytes(cuda::embedding_backward_scratch_bytes(N, P), s);
          cuda::embedding_backward(ip, out.grad().raw(), f32_grad("add_positions wpe", wpe.grad()),
                                   DType::kF32, scratch.raw(), N, P, C, out.dtype(), s.native());
        }
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* dyp = out.grad().data<T>();
        T* dx = x.requires_grad() ? x.grad().data<T>() : nullptr;
        T* dp = wpe.requires_grad() ? wpe.grad().data<T>() : nullptr;
        s.run([=] { cpu::add_positions_at_backward<T>(dyp, ip, dx, dp, N, C); });
      });
    });
  }
  return out;
}

}  // namespace

Var embedding_of_ids(const Tensor& ids, const Var& table, const Tensor& y, bool zero_outside) {
  const int64_t V = table.shape()[0], C = table.shape()[1], N = ids.numel();
  Stream& s = current_stream(table.device());
  if (zero_outside) {
    cuda::embedding_forward_or_zero(ids.data<int32_t>(), table.value().raw(), y.raw(), N, V, C,
                                    table.dtype(), s.native());
  } else {
    cuda::embedding_forward(ids.data<int32_t>(), table.value().raw(), y.raw(), N, V, C,
                            table.dtype(), s.native());
  }
  Var out = Var::output(y, table.requires_grad());
  if (out.requires_grad()) {
    record_backward([ids, table, out, N, V, C] {  // ids kept for the backward
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      Tensor scratch = scratch_bytes(cuda::embedding_backward_scratch_bytes(N, V), s);
      Tensor& dtable = table.grad();
      cuda::embedding_backward(ids.data<int32_t>(), out.grad().raw(), dtable.raw(), dtable.dtype(),
                               scratch.raw(), N, V, C, out.dtype(), s.native());
    });
  }
  return out;
}

Var embedding(const Tensor& tokens, const Var& table) {
  Device dev = table.device();
  GTRON_CHECK(tokens.dtype() == DType::kI32 && (tokens.device().is_cpu() || tokens.device() == dev),
              "embedding: tokens must be an i32 tensor on the CPU or the table's device; got ",
              tokens.device().str(), "/", dtype_name(tokens.dtype()));
  GTRON_CHECK(tokens.rank() < Shape::kMaxRank, "embedding: tokens ", tokens.shape().str(),
              " leave no room for the feature dim");
  GTRON_CHECK(table.shape().rank() == 2, "embedding: table ", table.shape().str(),
              ", expected [V, C]");
  const int64_t V = table.shape()[0];
  const int64_t C = table.shape()[1];
  const int64_t N = tokens.numel();

  std::vector<int64_t> ydims = tokens.shape().vec();
  ydims.push_back(C);
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(Shape(ydims), table.dtype(), dev, &s);
  if (dev.is_cuda()) {
    if (tokens.device().is_cpu()) check_tokens_on_host(tokens, V);
    return embedding_of_ids(ids_on_device(tokens, s), table, y, /*zero_outside=*/false);
  }

  dispatch_float(table.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const int32_t* tp = tokens.data<int32_t>();
    const T* wp = table.value().data<T>();
    T* yp = y.data<T>();
    s.run([=] { cpu::embedding_forward<T>(tp, wp, yp, N, V, C); });
  });

  Var out = Var::output(y, table.requires_grad());
  if (out.requires_grad()) {
    record_backward([tokens, table, out, N, V, C] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const int32_t* tp = tokens.data<int32_t>();
        const T* dyp = out.grad().data<T>();
        T* dw = table.grad().data<T>();
        s.run([=] { cpu::embedding_backward<T>(tp, dyp, dw, N, V, C); });
      });
    });
  }
  return out;
}

Var add_positions(const Var& x, const Var& wpe, const Tensor& positions) {
  GTRON_CHECK(x.shape().rank() == 3, "add_positions: x ", x.shape().str(), ", expected [B, T, C]");
  const int64_t B = x.shape()[0];
  const int64_t Tlen = x.shape()[1];
  const int64_t C = x.shape()[2];
  GTRON_CHECK(wpe.shape().rank() == 2 && wpe.shape()[1] == C && wpe.shape()[0] >= Tlen,
              "add_positions: wpe ", wpe.shape().str(), ", expected [Tmax >= ", Tlen, ", ", C, "]");
  check_param_operand("add_positions", x.value(), wpe.value());
  if (positions.defined()) return add_positions_at(x, wpe, positions);

  Device dev = x.device();
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), dev, &s);
  if (dev.is_cuda()) {
    cuda::add_positions_forward(x.value().raw(), wpe.value().raw(), wpe.dtype(), y.raw(), B, Tlen,
                                C, x.dtype(), s.native());
  } else {
    dispatch_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* xp = x.value().data<T>();
      const T* pp = wpe.value().data<T>();
      T* yp = y.data<T>();
      s.run([=] { cpu::add_positions_forward<T>(xp, pp, yp, B, Tlen, C); });
    });
  }

  Var out = Var::output(y, x.requires_grad() || wpe.requires_grad());
  if (out.requires_grad()) {
    record_backward([x, wpe, out, B, Tlen, C] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      if (out.device().is_cuda()) {
        cuda::add_positions_backward(
            out.grad().raw(), x.requires_grad() ? x.grad().raw() : nullptr,
            wpe.requires_grad() ? f32_grad("add_positions wpe", wpe.grad()) : nullptr, B, Tlen, C,
            out.dtype(), s.native());
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* dyp = out.grad().data<T>();
        T* dx = x.requires_grad() ? x.grad().data<T>() : nullptr;
        T* dp = wpe.requires_grad() ? wpe.grad().data<T>() : nullptr;
        s.run([=] { cpu::add_positions_backward<T>(dyp, dx, dp, B, Tlen, C); });
      });
    });
  }
  return out;
}

}  // namespace gtron
