#include "model/ops/moe_router.h"

#include <vector>

#include "model/ops/device_util.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

namespace {

int64_t last_dim(const Var& x) { return x.shape()[x.shape().rank() - 1]; }

// Note [fp32 routing on CUDA]: the CUDA scores are f32.
void check_cuda_scores(const char* op, const Var& scores) {
  GTRON_CHECK(scores.dtype() == DType::kF32, op, ": CUDA router scores are f32; got ",
              dtype_name(scores.dtype()));
}

Var router_scores_cuda(const Var& logits, MoeRouterKind kind, int64_t N, int64_t E) {
  Stream& s = current_stream(logits.device());
  Tensor y = Tensor::empty(logits.shape(), DType::kF32, logits.device(), &s);
  cuda::router_scores_forward(logits.value().raw(), y.data<float>(), N, E, kind, logits.dtype(),
                              s.native());
  Var out = Var::output(y, logits.requires_grad());
  if (out.requires_grad()) {
    record_backward([logits, out, N, E, kind] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      bool overwrite = false;
      Tensor& dz = logits.grad_for_write(&overwrite);
      cuda::router_scores_backward(out.value().data<float>(), out.grad().data<float>(), dz.raw(), N,
                                   E, kind, logits.dtype(), s.native(), overwrite);
    });
  }
  return out;
}

}  // namespace

Var router_scores(const Var& logits, MoeRouterKind kind) {
  const int64_t E = last_dim(logits);
  const int64_t N = logits.value().numel() / E;
  if (logits.device().is_cuda()) return router_scores_cuda(logits, kind, N, E);
  Stream& s = current_stream(logits.device());
  Tensor y = Tensor::empty(logits.shape(), logits.dtype(), logits.device(), &s);
  dispatch_float(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* zp = logits.value().data<T>();
    T* yp = y.data<T>();
    s.run([=] { cpu::router_scores_forward<T>(zp, yp, N, E, kind); });
  });
  Var out = Var::output(y, logits.requires_grad());
  if (out.requires_grad()) {
    record_backward([logits, out, N, E, kind] {
      if (!out.has_grad()) return;
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* sp = out.value().data<T>();
        const T* dsp = out.grad().data<T>();
        T* dz = logits.grad().data<T>();
        current_stream(out.device()).run([=] {
          cpu::router_scores_backward<T>(sp, dsp, dz, N, E, kind);
        });
      });
    });
  }
  return out;
}

TopKGates topk_gates(const Var& scores, const Tensor& bias, int k, bool normalize) {
  const int64_t E = last_dim(scores);
  const int64_t N = scores.value().numel() / E;
  GTRON_CHECK(k >= 1 && k <= E, "topk_gates: k = ", k, " of E = ", E, " experts");
  if (bias.defined()) {
    check_shape("topk_gates bias", bias.shape(), Shape{E});
    check_same_device_dtype("topk_gates bias", scores.value(), bias);
  }
  Stream& s = current_stream(scores.device());
  Tensor ids = Tensor::empty({N, k}, DType::kI32, scores.device(), &s);
  Tensor g = Tensor::empty({N, k}, scores.dtype(), scores.device(), &s);
  if (scores.device().is_cuda()) {
    check_cuda_scores("topk_gates", scores);
    cuda::topk_gates_forward(scores.value().data<float>(),
                             bias.defined() ? bias.data<float>() : nullptr, ids.data<int32_t>(),
                             g.data<float>(), N, E, k, normalize, s.native());
  } else {
    dispatch_float(scores.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* sp = scores.value().data<T>();
      const T* bp = bias.defined() ? bias.data<T>() : nullptr;  // read when the kernel runs
      int32_t* ip = ids.data<int32_t>();
      T* gp = g.data<T>();
      s.run([=] { cpu::topk_gates_forward<T>(sp, bp, ip, gp, N, E, k, normalize); });
    });
  }
  TopKGates out{Var::output(g, scores.requires_grad()), ids};
  if (out.gates.requires_grad()) {
    record_backward([scores, gates = out.gates, ids, N, E, k, normalize] {
      if (!gates.has_grad()) return;
      if (gates.device().is_cuda()) {
        cuda::topk_gates_backward(scores.value().data<float>(), ids.data<int32_t>(),
                                  gates.value().data<float>(), gates.grad().data<float>(),
                                  scores.grad().data<float>(), N, E, k, normalize,
                                  current_stream(gates.device()).native());
        return;
      }
      dispatch_float(gates.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* sp = scores.value().data<T>();
        const int32_t* ip = ids.data<int32_t>();
        const T* gp = gates.value().data<T>();
        const T* dgp = gates.grad().data<T>();
        T* ds = scores.grad().data<T>();
        current_stream(gates.device()).run([=] {
          cpu::topk_gates_backward<T>(sp, ip, gp, dgp, ds, N, E, k, normalize);
        });
      });
    });
  }
  return out;
}

Var moe_aux_loss(const Var& scores, const Tensor& ids, double weight, bool normalize_rows) {
  const int64_t E = last_dim(scores);
  const int64_t N = scores.value().numel() / E;
  GTRON_CHECK(ids.dtype() == DType::kI32 && ids.rank() == 2 && ids.dim(0) == N,
              "moe_aux_loss: ids ", ids.shape().str(), ", expected i32 [", N, ", k]");
  const int k = static_cast<int>(ids.dim(1));
  Stream& s = current_stream(scores.device());
  Tensor loss = Tensor::empty(Shape{}, scores.dtype(), scores.device(), &s);
  Tensor coef = Tensor::empty({E}, scores.dtype(), scores.device(), &s);
  if (scores.device().is_cuda()) {
    check_cuda_scores("moe_aux_loss", scores);
    GTRON_CHECK(ids.device() == scores.device(), "moe_aux_loss: ids on ", ids.device().str(),
                ", scores on ", scores.device().str());
    Tensor scratch = scratch_floats(cuda::moe_aux_loss_scratch_floats(N, E), s);
    cuda::moe_aux_loss_forward(scores.value().data<float>(), ids.data<int32_t>(),
                               loss.data<float>(), coef.data<float>(), scratch.data<float>(), N, E,
                               k, weight, normalize_rows, s.native());
  } else {
    dispatch_float(scores.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* sp = scores.value().data<T>();
      const int32_t* ip = ids.data<int32_t>();
      T* lp = loss.data<T>();
      T* cp = coef.data<T>();
      s.run([=] { cpu::moe_aux_loss_forward<T>(sp, ip, lp, cp, N, E, k, weight, normalize_rows); });
    });
  }
  Var out = Var::output(loss, scores.requires_grad());
  if (out.requires_grad()) {
    record_backward([scores, out, coef, N, E, normalize_rows] {
      if (!out.has_grad()) return;
      if (out.device().is_cuda()) {
        cuda::moe_aux_loss_backward(scores.value().data<float>(), coef.data<float>(),
                                    out.grad().data<float>(), scores.grad().data<float>(), N, E,
                                    normalize_rows, current_stream(out.device()).native());
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* sp = scores.value().data<T>();
        const T* cp = coef.data<T>();
        const T* dlp = out.grad().data<T>();
        T* ds = scores.grad().data<T>();
        current_stream(out.device()).run([=] {
          cpu::moe_aux_loss_backward<T>(sp, cp, dlp[0], ds, N, E, normalize_rows);
        });
      });
    });
  }
  return out;
}

}  // namespace gtron
