// The CPU kernel of each group is linear's (cpu::linear_forward / linear_backward, or the FP8
// emulation), run group after group in one stream closure that reads the offsets when it runs.
// The CUDA kernels are model/ops/grouped_linear_cuda.cu's (Note [grouped GEMM on CUDA]).
#include "model/ops/grouped_linear.h"

#include <memory>

#include "model/ops/device_util.h"
#include "model/ops/fp8.h"
#include "model/ops/linear.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

namespace {

// The CUDA forward and the backward it records.
Var grouped_linear_cuda(const Var& x, const std::vector<Var>& weights, const Tensor& offsets_in,
                        int64_t M, int64_t Cin, int64_t Cout) {
  const int G = static_cast<int>(weights.size());
  Stream& s = current_stream(x.device());
  const Tensor offsets = ids_on_device(offsets_in, s);
  std::vector<const void*> wp;
  for (const Var& w : weights) wp.push_back(w.value().raw());
  Tensor y = Tensor::empty({M, Cout}, x.dtype(), x.device(), &s);
  // Note [grouped GEMM on fp32 masters]: fp32 weights beside bf16 rows.
  const bool w_f32 = weights[0].dtype() == DType::kF32 && x.dtype() == DType::kBF16;
  cuda::grouped_linear_forward(x.value().raw(), wp.data(), y.raw(), offsets.data<int32_t>(), M, Cin,
                               Cout, G, x.dtype(), s.native(), w_f32);
  bool need = x.requires_grad();
  for (const Var& w : weights) need = need || w.requires_grad();
  Var out = Var::output(y, need);
  if (!out.requires_grad()) return out;
  record_backward([x, weights, offsets, out, M, Cin, Cout, G] {
    if (!out.has_grad()) return;
    Stream& s = current_stream(out.device());
    const cuda::GroupedWeightSlots slots = cuda::grouped_weight_slots(weights, "grouped_linear");
    const int32_t* off = offsets.data<int32_t>();
    if (x.requires_grad()) {
      bool overwrite = false;
      Tensor& dx = x.grad_for_write(&overwrite);
      const bool w_f32 = weights[0].dtype() == DType::kF32 && out.dtype() == DType::kBF16;
      cuda::grouped_linear_backward_data(out.grad().raw(), slots.w.data(), dx.raw(), off, M, Cin,
                                         Cout, G, out.dtype(), s.native(), overwrite, w_f32);
    }
    cuda::grouped_linear_backward_weight(x.value().raw(), out.grad().raw(), slots.dw.data(),
                                         slots.overwrite.get(), off, M, Cin, Cout, G, out.dtype(),
                                         s.native());
  });
  return out;
}

}  // namespace

namespace cuda {

GroupedWeightSlots grouped_weight_slots(const std::vector<Var>& weights, const char* op) {
  GroupedWeightSlots s;
  s.overwrite.reset(new bool[weights.size()]());
  for (size_t g = 0; g < weights.size(); ++g) {
    const Var& w = weights[g];
    s.w.push_back(w.value().raw());
    s.dw.push_back(w.requires_grad() ? f32_grad(op, w.weight_grad(&s.overwrite[g])) : nullptr);
  }
  return s;
}

}  // namespace cuda

Var grouped_linear(const Var& x, const std::vector<Var>& weights, const Tensor& offsets, bool fp8) {
  GTRON_CHECK(x.shape().rank() == 2 && !weights.empty(), "grouped_linear: x ", x.shape().str(),
              ", expected [M, Cin]; ", weights.size(), " groups");
  const int64_t M = x.shape()[0], Cin = x.shape()[1];
  const int64_t Cout = weights[0].shape()[0];
  const int64_t G = static_cast<int64_t>(weights.size());
  // Note [grouped GEMM on fp32 masters]: on CUDA, bf16 rows may take fp32 weights (all of them).
  const bool masters = x.device().is_cuda() && x.dtype() == DType::kBF16 &&
                       weights[0].dtype() == DType::kF32 && cuda::grouped_master_weights();
  for (const Var& w : weights) {
    check_shape("grouped_linear weight", w.shape(), Shape{Cout, Cin});
    if (masters) {
      GTRON_CHECK(w.dtype() == DType::kF32 && w.device() == x.device(),
                  "grouped_linear: fp32 weights beside bf16 rows must all be fp32 on ",
                  x.device().str());
    } else {
      check_same_device_dtype("grouped_linear", x.value(), w.value());
    }
  }
  GTRON_CHECK(offsets.dtype() == DType::kI32 && offsets.numel() == G + 1,
              "grouped_linear: offsets ", offsets.shape().str(), ", expected i32 [", G + 1, "]");
  if (x.device().is_cuda()) {
    GTRON_CHECK(!fp8, "grouped_linear: FP8 expert GEMMs are not built on CUDA");
    return grouped_linear_cuda(x, weights, offsets, M, Cin, Cout);
  }
  Stream& s = current_stream(x.device());
  Tensor y = Tensor::empty({M, Cout}, x.dtype(), x.device(), &s);
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    std::vector<const T*> wp;
    for (const Var& w : weights) wp.push_back(w.value().data<T>());
    const T* xp = x.value().data<T>();
    const int32_t* off = offsets.data<int32_t>();
    T* yp = y.data<T>();
    s.run([=] {
      GTRON_CHECK(off[0] == 0 && off[G] == M, "grouped_linear: offsets span [", off[0], ", ",
                  off[G], "), expected [0, ", M, ")");
      for (int64_t g = 0; g < G; ++g) {
        const int64_t r0 = off[g], rows = off[g + 1] - off[g];
        if (rows == 0) continue;
        if (fp8) {
          fp8::emulate_forward<T>(xp + r0 * Cin, wp[g], nullptr, yp + r0 * Cout, rows, Cin, Cout);
        } else {
          cpu::linear_forward<T>(xp + r0 * Cin, wp[g], nullptr, yp + r0 * Cout, rows, Cin, Cout);
        }
      }
    });
  });
  bool need = x.requires_grad();
  for (const Var& w : weights) need = need || w.requires_grad();
  Var out = Var::output(y, need);
  if (out.requires_grad()) {
    record_backward([x, weights, offsets, out, M, Cin, Cout, G, fp8] {
      if (!out.has_grad()) return;
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        // Weight values and gradient slots as they are bound now (a weight access may rebind
        // them for the backward).
        std::vector<const T*> wp;
        std::vector<T*> dw;
        for (const Var& w : weights) {
          wp.push_back(w.value().data<T>());
          dw.push_back(w.requires_grad() ? w.grad().data<T>() : nullptr);
        }
        const T* xp = x.value().data<T>();
        const T* dyp = out.grad().data<T>();
        T* dx = x.requires_grad() ? x.grad().data<T>() : nullptr;
        const int32_t* off = offsets.data<int32_t>();
        current_stream(out.device()).run([=] {
          for (int64_t g = 0; g < G; ++g) {
            const int64_t r0 = off[g], rows = off[g + 1] - off[g];
            if (rows == 0) continue;
            T* dxg = dx != nullptr ? dx + r0 * Cin : nullptr;
            if (fp8) {
              fp8::emulate_backward<T>(xp + r0 * Cin, wp[g], dyp + r0 * Cout, dxg, dw[g], nullptr,
                                       rows, Cin, Cout);
            } else {
              cpu::linear_backward<T>(xp + r0 * Cin, wp[g], dyp + r0 * Cout, dxg, dw[g], nullptr,
                                      rows, Cin, Cout);
            }
          }
        });
      });
    });
  }
  return out;
}

}  // namespace gtron
