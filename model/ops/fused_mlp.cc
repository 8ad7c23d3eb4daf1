#include "model/ops/fused_mlp.h"

#include <atomic>

#include "model/env.h"
#include "model/ops/add.h"
#include "model/ops/column_scratch.h"
#include "model/ops/device_util.h"
#include "model/ops/fp8.h"
#include "model/ops/gelu.h"
#include "model/ops/linear.h"
#include "model/ops/shape_check.h"
#include "model/ops/swiglu.h"
#include "model/stream.h"

namespace gtron {

bool fused_mlp_supported(const Var& x) { return x.device().is_cuda() && x.dtype() == DType::kBF16; }

namespace {

struct Dims {
  int64_t N, Cin, Cout;
};

Dims check_operands(const char* op, const Var& x, const Var& w, const Var& b) {
  GTRON_CHECK(fused_mlp_supported(x), op, ": CUDA bf16 activations only; got ", x.device().str(),
              "/", dtype_name(x.dtype()));
  const int64_t Cin = x.shape()[x.shape().rank() - 1];
  const int64_t Cout = w.shape()[0];
  check_shape(op, w.shape(), Shape{Cout, Cin});
  if (b.defined()) check_shape(op, b.shape(), Shape{Cout});
  check_same_device_dtype(op, x.value(), w.value());
  if (b.defined()) check_same_device_dtype(op, x.value(), b.value());
  return {x.value().numel() / Cin, Cin, Cout};
}

std::vector<int64_t> with_last(const Shape& s, int64_t last) {
  std::vector<int64_t> d = s.vec();
  d.back() = last;
  return d;
}

}  // namespace

GeluUp linear_gelu_up(const Var& x, const Var& w, const Var& b) {
  const Dims d = check_operands("linear_gelu_up", x, w, b);
  Stream& s = current_stream(x.device());
  const Shape out_shape(with_last(x.shape(), d.Cout));
  Tensor pre = Tensor::empty(out_shape, DType::kBF16, x.device(), &s);
  Tensor g = Tensor::empty(out_shape, DType::kBF16, x.device(), &s);
  cuda::linear_gelu_forward(x.value().raw(), w.value().raw(), b.value().raw(), pre.raw(), g.raw(),
                            d.N, d.Cin, d.Cout, s.native());
  const bool need = x.requires_grad() || w.requires_grad() || b.requires_grad();
  GeluUp up{Var::output(pre, need), Var::output(g, need)};
  if (need) {
    Var vpre = up.pre;
    record_backward([x, w, b, vpre, d] {
      if (!vpre.has_grad()) return;
      Stream& s = current_stream(vpre.device());
      const bool want_db = b.requires_grad();
      Tensor scratch;
      if (want_db) scratch = column_scratch(cuda::linear_backward_scratch_floats(d.N, d.Cout), s);
      bool dw_overwrite = false;  // Note [first gradient write] in parallel/ddp.h
      Tensor* dw = w.requires_grad() ? &w.weight_grad(&dw_overwrite) : nullptr;
      bool dx_overwrite = false;
      void* dx = x.requires_grad() ? x.grad_for_write(&dx_overwrite).raw() : nullptr;
      cuda::linear_backward(x.value().raw(), w.value().raw(), vpre.grad().raw(), dx,
                            dw ? dw->raw() : nullptr, dw ? dw->dtype() : DType::kF32,
                            want_db ? f32_grad("linear_gelu_up bias", b.grad()) : nullptr,
                            want_db ? scratch.data<float>() : nullptr, d.N, d.Cin, d.Cout,
                            DType::kBF16, s.native(), dx_overwrite, dw_overwrite);
    });
  }
  return up;
}

Var linear_after_gelu(const GeluUp& up, const Var& w, const Var& b, const Var& residual,
                      bool recompute) {
  const Var& g = up.g;
  const Dims d = check_operands("linear_after_gelu", g, w, b);
  Stream& s = current_stream(g.device());
  const Shape y_shape(with_last(g.shape(), d.Cout));
  if (residual.defined()) {
    check_shape("linear_after_gelu residual", residual.shape(), y_shape);
    check_same_device_dtype("linear_after_gelu residual", g.value(), residual.value());
  }
  Tensor y = Tensor::empty(y_shape, DType::kBF16, g.device(), &s);
  cuda::linear_forward(g.value().raw(), w.value().raw(), b.defined() ? b.value().raw() : nullptr,
                       DType::kBF16, y.raw(), d.N, d.Cin, d.Cout, DType::kBF16, s.native(),
                       residual.defined() ? residual.value().raw() : nullptr);
  const bool need = g.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()) ||
                    (residual.defined() && residual.requires_grad());
  Var out = Var::output(y, need);
  if (need && b.defined() && b.requires_grad()) out.request_col_partials();
  if (need) {
    // Note [keeping g]: g is kept for the backward's dw, or (recompute) dropped once y is
    // formed and recomputed from pre there, one elementwise pass.
    Var pre = up.pre;
    const Shape g_shape = g.shape();
    const Tensor kept = recompute ? Tensor() : g.value();
    record_backward([g_shape, kept, pre, w, b, residual, out, d] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      // Note [gradient column partials]: taken before anything reads dy.
      const bool db_done = bias_grad_from_partials(out, b, s);
      // The residual's share first: dy itself (it only binds a slot or queues an add before
      // the GEMMs below read dy; whatever later accumulates into the slot queues after them).
      if (residual.defined()) hand_on_gradient(residual, out.grad());
      Tensor g = kept;
      if (!g.defined()) {
        g = Tensor::empty(g_shape, DType::kBF16, out.device(), &s);
        cuda::gelu_forward(pre.value().raw(), g.raw(), d.N * d.Cin, DType::kBF16, s.native());
      }
      const bool want_db = b.defined() && b.requires_grad() && !db_done;
      Tensor scratch;
      if (want_db) scratch = column_scratch(cuda::linear_backward_scratch_floats(d.N, d.Cout), s);
      bool dw_overwrite = false;  // Note [first gradient write] in parallel/ddp.h
      Tensor* dw = w.requires_grad() ? &w.weight_grad(&dw_overwrite) : nullptr;
      // dw, db as linear's; the input gradient goes to pre through gelu' (below), never to g.
      cuda::linear_backward(g.raw(), w.value().raw(), out.grad().raw(), nullptr,
                            dw ? dw->raw() : nullptr, dw ? dw->dtype() : DType::kF32,
                            want_db ? f32_grad("linear_after_gelu bias", b.grad()) : nullptr,
                            want_db ? scratch.data<float>() : nullptr, d.N, d.Cin, d.Cout,
                            DType::kBF16, s.native(), /*dx_overwrite=*/false, dw_overwrite);
      if (!pre.requires_grad()) return;
      bool overwrite = false;
      Tensor& dpre = pre.grad_for_write(&overwrite);
      if (overwrite && cuda::dgelu_backward(out.grad().raw(), w.value().raw(), pre.value().raw(),
                                            dpre.raw(), d.N, d.Cin, d.Cout, s.native())) {
        return;
      }
      // Composed: dg = dy·w into a scratch, then d pre (+)= gelu'(pre)·dg.
      Tensor dg = Tensor::empty(g_shape, DType::kBF16, out.device(), &s);
      cuda::linear_backward(g.raw(), w.value().raw(), out.grad().raw(), dg.raw(), nullptr,
                            DType::kF32, nullptr, nullptr, d.N, d.Cin, d.Cout, DType::kBF16,
                            s.native(), /*dx_overwrite=*/true);
      cuda::gelu_backward(pre.value().raw(), dg.raw(), dpre.raw(), d.N * d.Cin, DType::kBF16,
                          s.native(), overwrite);
    });
  }
  return out;
}

Var swiglu_linear(const Var& gu, const Var& w, const Var& residual, bool keep_act) {
  GTRON_CHECK(fused_mlp_supported(gu), "swiglu_linear: CUDA bf16 activations only; got ",
              gu.device().str(), "/", dtype_name(gu.dtype()));
  const int64_t Cout = w.shape()[0];
  const int64_t F = w.shape()[w.shape().rank() - 1];
  const Shape& gs = gu.shape();
  GTRON_CHECK(gs.rank() >= 1 && gs[gs.rank() - 1] == 2 * F, "swiglu_linear: [gate | up] ", gs.str(),
              " against a weight ", w.shape().str(), "; expected a last dim of ", 2 * F);
  check_shape("swiglu_linear weight", w.shape(), Shape{Cout, F});
  check_same_device_dtype("swiglu_linear", gu.value(), w.value());
  const int64_t N = gu.value().numel() / (2 * F);
  Stream& s = current_stream(gu.device());
  const Shape a_shape(with_last(gs, F));
  const Shape y_shape(with_last(gs, Cout));
  if (residual.defined()) {
    check_shape("swiglu_linear residual", residual.shape(), y_shape);
    check_same_device_dtype("swiglu_linear residual", gu.value(), residual.value());
  }
  Tensor a = Tensor::empty(a_shape, DType::kBF16, gu.device(), &s);
  cuda::swiglu_forward(gu.value().raw(), a.raw(), N, F, DType::kBF16, s.native());
  Tensor y = Tensor::empty(y_shape, DType::kBF16, gu.device(), &s);
  cuda::linear_forward(a.raw(), w.value().raw(), nullptr, DType::kBF16, y.raw(), N, F, Cout,
                       DType::kBF16, s.native(),
                       residual.defined() ? residual.value().raw() : nullptr);
  const bool need =
      gu.requires_grad() || w.requires_grad() || (residual.defined() && residual.requires_grad());
  Var out = Var::output(y, need);
  if (need) {
    // Note [recomputing the SwiGLU output]: a goes out of scope here unless kept.
    const Tensor kept = keep_act ? a : Tensor();
    record_backward([a_shape, kept, gu, w, residual, out, N, F, Cout] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      // The residual's share first: dy itself, before the GEMMs below read dy.
      if (residual.defined()) hand_on_gradient(residual, out.grad());
      Tensor act = kept;
      if (!act.defined()) {
        act = Tensor::empty(a_shape, DType::kBF16, out.device(), &s);
        cuda::swiglu_forward(gu.value().raw(), act.raw(), N, F, DType::kBF16, s.native());
      }
      bool dw_overwrite = false;  // Note [first gradient write] in parallel/ddp.h
      Tensor* dw = w.requires_grad() ? &w.weight_grad(&dw_overwrite) : nullptr;
      Tensor da;
      if (gu.requires_grad()) da = Tensor::empty(a_shape, DType::kBF16, out.device(), &s);
      // linear's backward as the composed down projection runs it: d a (written) and dw.
      cuda::linear_backward(act.raw(), w.value().raw(), out.grad().raw(),
                            da.defined() ? da.raw() : nullptr, dw ? dw->raw() : nullptr,
                            dw ? dw->dtype() : DType::kF32, nullptr, nullptr, N, F, Cout,
                            DType::kBF16, s.native(), /*dx_overwrite=*/true, dw_overwrite);
      if (!da.defined()) return;
      bool overwrite = false;
      Tensor& dgu = gu.grad_for_write(&overwrite);
      cuda::swiglu_backward(gu.value().raw(), da.raw(), dgu.raw(), N, F, DType::kBF16, s.native(),
                            overwrite);
    });
  }
  return out;
}

namespace {
std::atomic<int> g_fp8_swiglu_down{-1};
std::atomic<int64_t> g_swiglu_linear_fp8_calls{0};
}  // namespace

bool fp8_swiglu_down() {
  return env_once(g_fp8_swiglu_down,
                  [] { return env_flag("GTRON_FP8_SWIGLU_DOWN", true) ? 1 : 0; }) == 1;
}

int64_t swiglu_linear_fp8_calls() { return g_swiglu_linear_fp8_calls.load(); }

bool swiglu_linear_fp8_ok(const Var& gu, int64_t F, int64_t Cout) {
  if (!fused_mlp_supported(gu) || !fp8::fused_producers() || F <= 0) return false;
  const Shape& gs = gu.shape();
  if (gs.rank() < 1 || gs[gs.rank() - 1] != 2 * F) return false;
  const int64_t N = gu.value().numel() / (2 * F);
  return cuda::fp8_gemm_ok(N, F, Cout) &&
         cuda::swiglu_backward_codes_ok(N, F, gu.value().raw(), nullptr, nullptr);
}

Var swiglu_linear_fp8(const Var& gu, const Var& w, const fp8::QuantizedWeight* wq,
                      const Var& residual) {
  const int64_t Cout = w.shape()[0];
  const int64_t F = w.shape()[w.shape().rank() - 1];
  GTRON_CHECK(swiglu_linear_fp8_ok(gu, F, Cout), "swiglu_linear_fp8: [gate | up] ",
              gu.shape().str(), " on ", gu.device().str(), "/", dtype_name(gu.dtype()),
              " against a weight ", w.shape().str(),
              "; expected CUDA bf16, [N, 2F] with N and F multiples of 128");
  check_shape("swiglu_linear_fp8 weight", w.shape(), Shape{Cout, F});
  GTRON_CHECK(w.device() == gu.device(), "swiglu_linear_fp8: the weight is on ", w.device().str(),
              ", gu on ", gu.device().str());
  const int64_t N = gu.value().numel() / (2 * F);
  g_swiglu_linear_fp8_calls.fetch_add(1);
  Stream& s = current_stream(gu.device());
  const Shape y_shape(with_last(gu.shape(), Cout));
  if (residual.defined()) {
    check_shape("swiglu_linear_fp8 residual", residual.shape(), y_shape);
    check_same_device_dtype("swiglu_linear_fp8 residual", gu.value(), residual.value());
  }
  // Rows codes for the product now; column codes (aᵀ [F, N]) kept for the weight gradient.
  const fp8::QuantizedRows rows = fp8::scratch_rows(N, F, s);
  const fp8::QuantizedRows cols = fp8::scratch_rows(F, N, s);
  cuda::swiglu_forward_fp8(gu.value().raw(), nullptr, N, F, static_cast<uint8_t*>(rows.q.raw()),
                           rows.s.data<float>(), static_cast<uint8_t*>(cols.q.raw()),
                           cols.s.data<float>(), s.native());
  Tensor y = Tensor::empty(y_shape, DType::kBF16, gu.device(), &s);
  const bool have_wq = wq != nullptr;
  const fp8::QuantizedWeight wcodes = have_wq ? *wq : fp8::QuantizedWeight{};
  fp8::cuda_forward(Tensor(), w.value(), nullptr, DType::kBF16, y,
                    residual.defined() ? residual.value().raw() : nullptr, N, F, Cout, s,
                    have_wq ? &wcodes : nullptr, &rows);
  const bool need =
      gu.requires_grad() || w.requires_grad() || (residual.defined() && residual.requires_grad());
  Var out = Var::output(y, need);
  if (need) {
    const Shape a_shape(with_last(gu.shape(), F));
    record_backward([a_shape, cols, wcodes, have_wq, gu, w, residual, out, N, F, Cout] {
      if (!out.has_grad()) return;
      Stream& s = current_stream(out.device());
      // The residual's share first: dy itself, before the GEMMs below read dy.
      if (residual.defined()) hand_on_gradient(residual, out.grad());
      bool dw_overwrite = false;  // Note [first gradient write] in parallel/ddp.h
      Tensor* dw = w.requires_grad() ? &w.weight_grad(&dw_overwrite) : nullptr;
      Tensor da;
      if (gu.requires_grad()) da = Tensor::empty(a_shape, DType::kBF16, out.device(), &s);
      fp8::cuda_backward(Tensor(), w.value(), out.grad(), da.defined() ? da.raw() : nullptr,
                         /*dx_overwrite=*/true, dw, dw_overwrite, N, F, Cout, s,
                         have_wq ? &wcodes : nullptr, nullptr, &cols);
      if (da.defined()) swiglu_backward_cuda(gu, da, N, F);
    });
  }
  return out;
}

}  // namespace gtron
