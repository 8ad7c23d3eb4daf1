// grouped_linear_gathered (model/ops/grouped_linear.h): the first expert GEMM of a mixture of
// experts with its permuted input rows made where they are read, never kept.
//
// Note [regathered expert rows]
// At EP = 1 the first expert GEMM (gate|up) reads the token rows in expert order, xp = dispatch(g)
// ([N·k, C], k times the layer's input), and grouped_linear keeps xp for its weight gradient. On
// CUDA this op keeps only g, which the router's linear keeps anyway, and the plan:
// - forward: xp into scratch, the grouped GEMM, xp released (its memory serves the next op);
// - backward: xp again into scratch, the weight gradient, xp released; then dxp = dy·W into
//   scratch and dispatch's backward from it into g's gradient.
// So between the forward and the backward a layer holds N·k·C fewer elements (128 MiB a layer at
// the Qwen3-MoE shape of bench_moe.sh: B·T = 4096, k = 8, C = 2048, bf16), and inside the backward
// xp and dxp are never live together. The cost is one more dispatch kernel a layer (a read of g
// and a write of xp, k·N·C elements each way). The products, their operands and their order are
// grouped_linear's, and dispatch's backward sums each token's slots in the same order, so every
// value and gradient equals grouped_linear(moe_dispatch(g, plan), ...) bit for bit
// (moe_cuda_test). The CPU, fp32 rows and FP8 take that composition itself.
#include "model/env.h"
#include "model/ops/device_util.h"
#include "model/ops/grouped_linear.h"
#include "model/ops/moe_dispatch.h"
#include "model/stream.h"

namespace gtron {

namespace {

// xp = x[src[r] / k] for every permuted row r, into fresh scratch on `s`.
Tensor dispatch_rows(const Tensor& x, const MoePlan& plan, int64_t C, Stream& s) {
  Tensor xp = Tensor::empty({plan.N * plan.k, C}, x.dtype(), x.device(), &s);
  cuda::moe_dispatch_forward(x.raw(), plan.src.data<int32_t>(), xp.raw(), plan.N, plan.k, C,
                             x.dtype(), s.native());
  return xp;
}

}  // namespace

bool grouped_gather_rows() {
  static const bool on = env_flag("GTRON_MOE_REGATHER", false);
  return on;
}

Var grouped_linear_gathered(const Var& x, const MoePlan& plan, const std::vector<Var>& weights,
                            bool fp8) {
  const int64_t C = x.shape()[x.shape().rank() - 1];
  GTRON_CHECK(x.value().numel() == plan.N * C && !weights.empty(), "grouped_linear_gathered: x ",
              x.shape().str(), " for ", plan.N, " tokens; ", weights.size(), " groups");
  const bool lean = x.device().is_cuda() && x.dtype() == DType::kBF16 && !fp8;
  if (!lean) return grouped_linear(moe_dispatch(x, plan), weights, plan.offsets, fp8);
  const int64_t M = plan.N * plan.k, Cout = weights[0].shape()[0];
  const int G = static_cast<int>(weights.size());
  GTRON_CHECK(plan.offsets.numel() == G + 1 && plan.offsets.device() == x.device(),
              "grouped_linear_gathered: offsets ", plan.offsets.shape().str(), " on ",
              plan.offsets.device().str(), " for ", G, " groups on ", x.device().str());
  // The forward of grouped_linear over scratch rows, without its backward.
  Var y;
  {
    NoGradGuard no_grad;
    Stream& s = current_stream(x.device());
    const Var xp = Var::output(dispatch_rows(x.value(), plan, C, s), false);
    y = grouped_linear(xp, weights, plan.offsets, false);
  }
  bool need = x.requires_grad();
  for (const Var& w : weights) need = need || w.requires_grad();
  Var out = Var::output(y.value(), need);
  if (!out.requires_grad()) return out;
  record_backward([x, weights, plan, out, M, C, Cout, G] {
    if (!out.has_grad()) return;
    Stream& s = current_stream(out.device());
    const cuda::GroupedWeightSlots slots =
        cuda::grouped_weight_slots(weights, "grouped_linear_gathered");
    const int32_t* off = plan.offsets.data<int32_t>();
    const DType act = out.dtype();
    {
      const Tensor xp = dispatch_rows(x.value(), plan, C, s);
      cuda::grouped_linear_backward_weight(xp.raw(), out.grad().raw(), slots.dw.data(),
                                           slots.overwrite.get(), off, M, C, Cout, G, act,
                                           s.native());
    }
    if (!x.requires_grad()) return;
    const bool w_f32 = weights[0].dtype() == DType::kF32 && act == DType::kBF16;
    Tensor dxp = Tensor::empty({M, C}, act, out.device(), &s);
    cuda::grouped_linear_backward_data(out.grad().raw(), slots.w.data(), dxp.raw(), off, M, C, Cout,
                                       G, act, s.native(), /*overwrite=*/true, w_f32);
    bool overwrite = false;
    Tensor& dx = x.grad_for_write(&overwrite);
    cuda::moe_dispatch_backward(dxp.raw(), plan.pos.data<int32_t>(), dx.raw(), plan.N, plan.k, C,
                                act, s.native(), overwrite);
  });
  return out;
}

}  // namespace gtron
