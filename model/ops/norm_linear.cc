#include "model/ops/norm_linear.h"

#include "model/ops/column_scratch.h"
#include "model/ops/device_util.h"
#include "model/ops/linear.h"
#include "model/ops/shape_check.h"
#include "model/ops/tp_comm.h"
#include "model/stream.h"

namespace gtron {

Var layernorm_linear(const Var& x, const Var& gamma, const Var& beta, const Var& w, const Var& b,
                     double eps, TensorParallelGroup* tp, bool recompute) {
  GTRON_CHECK(x.device().is_cuda(), "layernorm_linear: CUDA only; got ", x.device().str());
  const int64_t C = x.shape()[x.shape().rank() - 1];
  const int64_t N = x.value().numel() / C;
  const int64_t Cout = w.shape()[0];
  check_shape("layernorm_linear gamma", gamma.shape(), Shape{C});
  check_shape("layernorm_linear beta", beta.shape(), Shape{C});
  check_shape("layernorm_linear weight", w.shape(), Shape{Cout, C});
  if (b.defined()) check_shape("layernorm_linear bias", b.shape(), Shape{Cout});
  check_param_operand("layernorm_linear", x.value(), gamma.value());
  check_same_device_dtype("layernorm_linear", x.value(), w.value());
  if (b.defined()) check_param_operand("layernorm_linear bias", x.value(), b.value());

  const DType act = x.dtype();
  Stream& s = current_stream(x.device());
  // The normalized rows live only until the GEMM has read them (the allocator orders the reuse).
  auto normalize = [=](Stream& st, float* mean, float* rstd) {
    Tensor n = Tensor::empty(x.shape(), act, x.device(), &st);
    cuda::layernorm_forward(x.value().raw(), gamma.value().raw(), beta.value().raw(), gamma.dtype(),
                            n.raw(), mean, rstd, N, C, eps, act, st.native());
    return n;
  };
  Tensor mean = Tensor::empty(Shape{N}, DType::kF32, x.device(), &s);
  Tensor rstd = Tensor::empty(Shape{N}, DType::kF32, x.device(), &s);
  std::vector<int64_t> ydims = x.shape().vec();
  ydims.back() = Cout;
  Tensor y = Tensor::empty(Shape(ydims), act, x.device(), &s);
  const Tensor n = normalize(s, mean.data<float>(), rstd.data<float>());
  cuda::linear_forward(n.raw(), w.value().raw(), b.defined() ? b.value().raw() : nullptr,
                       b.defined() ? b.dtype() : act, y.raw(), N, C, Cout, act, s.native());
  const bool need = x.requires_grad() || gamma.requires_grad() || beta.requires_grad() ||
                    w.requires_grad() || (b.defined() && b.requires_grad());
  Var out = Var::output(y, need);
  if (!need) return out;
  if (b.defined() && b.requires_grad()) out.request_col_partials();
  const Tensor kept = recompute ? Tensor() : n;
  record_backward([x, gamma, beta, w, b, out, mean, rstd, normalize, kept, N, C, Cout, act, tp] {
    if (!out.has_grad()) return;
    Stream& s = current_stream(out.device());
    // The kept rows, or recomputed ones (the same kernel on the same x: the same bits, and the
    // same statistics rewritten over mean and rstd).
    const Tensor n = kept.defined() ? kept : normalize(s, mean.data<float>(), rstd.data<float>());
    // Note [gradient column partials]: the bias gradient from the partials dy's writer left.
    const bool want_db = b.defined() && b.requires_grad() && !bias_grad_from_partials(out, b, s);
    Tensor lin_scratch;
    if (want_db) lin_scratch = column_scratch(cuda::linear_backward_scratch_floats(N, Cout), s);
    bool dw_overwrite = false;  // Note [first gradient write] in parallel/ddp.h
    Tensor* dw = w.requires_grad() ? &w.weight_grad(&dw_overwrite) : nullptr;
    const bool want_dn = x.requires_grad() || gamma.requires_grad() || beta.requires_grad();
    Tensor dn;
    if (want_dn) dn = Tensor::empty(x.shape(), act, x.device(), &s);
    cuda::linear_backward(n.raw(), w.value().raw(), out.grad().raw(), want_dn ? dn.raw() : nullptr,
                          dw ? dw->raw() : nullptr, dw ? dw->dtype() : DType::kF32,
                          want_db ? f32_grad("layernorm_linear bias", b.grad()) : nullptr,
                          want_db ? lin_scratch.data<float>() : nullptr, N, C, Cout, act,
                          s.native(), /*dx_overwrite=*/true, dw_overwrite);
    if (!want_dn) return;
    if (tp != nullptr) tp->all_reduce(dn, TpReduce::kSum);
    layernorm_backward_cuda(x, gamma, beta, mean, rstd, dn, N, C, s);
  });
  return out;
}

Var rmsnorm_linear(const Var& x, const Var& gamma, const Var& w, const Var& b, double eps,
                   bool recompute) {
  GTRON_CHECK(x.device().is_cuda(), "rmsnorm_linear: CUDA only; got ", x.device().str());
  const int64_t C = x.shape()[x.shape().rank() - 1];
  const int64_t N = x.value().numel() / C;
  const int64_t Cout = w.shape()[0];
  check_shape("rmsnorm_linear gamma", gamma.shape(), Shape{C});
  check_shape("rmsnorm_linear weight", w.shape(), Shape{Cout, C});
  if (b.defined()) check_shape("rmsnorm_linear bias", b.shape(), Shape{Cout});
  check_param_operand("rmsnorm_linear", x.value(), gamma.value());
  check_same_device_dtype("rmsnorm_linear", x.value(), w.value());
  if (b.defined()) check_param_operand("rmsnorm_linear bias", x.value(), b.value());

  const DType act = x.dtype();
  Stream& s = current_stream(x.device());
  auto normalize = [=](Stream& st, float* rrms) {
    Tensor n = Tensor::empty(x.shape(), act, x.device(), &st);
    cuda::rmsnorm_forward(x.value().raw(), gamma.value().raw(), gamma.dtype(), n.raw(), rrms, N, C,
                          eps, act, st.native());
    return n;
  };
  Tensor rrms = Tensor::empty(Shape{N}, DType::kF32, x.device(), &s);
  const Tensor n = normalize(s, rrms.data<float>());
  std::vector<int64_t> ydims = x.shape().vec();
  ydims.back() = Cout;
  Tensor y = Tensor::empty(Shape(ydims), act, x.device(), &s);
  cuda::linear_forward(n.raw(), w.value().raw(), b.defined() ? b.value().raw() : nullptr,
                       b.defined() ? b.dtype() : act, y.raw(), N, C, Cout, act, s.native());
  const bool need = x.requires_grad() || gamma.requires_grad() || w.requires_grad() ||
                    (b.defined() && b.requires_grad());
  Var out = Var::output(y, need);
  if (!need) return out;
  if (b.defined() && b.requires_grad()) out.request_col_partials();
  const Tensor kept = recompute ? Tensor() : n;
  record_backward([x, gamma, w, b, out, rrms, normalize, kept, N, C, Cout, act] {
    if (!out.has_grad()) return;
    Stream& s = current_stream(out.device());
    // The kept rows, or the same kernel on the same x again (the same bits; rrms rewritten).
    const Tensor n = kept.defined() ? kept : normalize(s, rrms.data<float>());
    const bool want_db = b.defined() && b.requires_grad() && !bias_grad_from_partials(out, b, s);
    Tensor lin_scratch;
    if (want_db) lin_scratch = column_scratch(cuda::linear_backward_scratch_floats(N, Cout), s);
    bool dw_overwrite = false;  // Note [first gradient write] in parallel/ddp.h
    Tensor* dw = w.requires_grad() ? &w.weight_grad(&dw_overwrite) : nullptr;
    const bool want_dn = x.requires_grad() || gamma.requires_grad();
    Tensor dn;
    if (want_dn) dn = Tensor::empty(x.shape(), act, x.device(), &s);
    // linear's backward as the composed qkv / gate_up runs it (dn written, not accumulated).
    cuda::linear_backward(n.raw(), w.value().raw(), out.grad().raw(), want_dn ? dn.raw() : nullptr,
                          dw ? dw->raw() : nullptr, dw ? dw->dtype() : DType::kF32,
                          want_db ? f32_grad("rmsnorm_linear bias", b.grad()) : nullptr,
                          want_db ? lin_scratch.data<float>() : nullptr, N, C, Cout, act,
                          s.native(), /*dx_overwrite=*/true, dw_overwrite);
    if (!want_dn) return;
    // rmsnorm's backward as the composed op runs it: dx and dgamma accumulated.
    Tensor scratch;
    if (gamma.requires_grad()) {
      scratch = column_scratch(cuda::rmsnorm_backward_scratch_floats(N, C), s);
    }
    cuda::rmsnorm_backward(
        x.value().raw(), gamma.value().raw(), gamma.dtype(), rrms.data<float>(), dn.raw(),
        x.requires_grad() ? x.grad().raw() : nullptr,
        gamma.requires_grad() ? f32_grad("rmsnorm_linear gamma", gamma.grad()) : nullptr,
        gamma.requires_grad() ? scratch.data<float>() : nullptr, N, C, act, s.native());
  });
  return out;
}

}  // namespace gtron
