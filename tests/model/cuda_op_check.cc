#include "tests/model/cuda_op_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "tests/model/gradcheck.h"
#include "tests/model/op_check.h"

namespace gtron::testing {

namespace {

std::vector<double> round_bf16(std::vector<double> v) {
  for (double& x : v) x = bf16_to_float(float_to_bf16(static_cast<float>(x)));
  return v;
}

// A tensor of `values` (rounded to bf16 first when `round`) stored as `dtype` on `device`.
Tensor make(const std::vector<double>& values, const Shape& shape, DType dtype, Device device,
            bool round) {
  Tensor t = Tensor::from_vector(round ? round_bf16(values) : values, shape, dtype);
  return device.is_cpu() ? t : t.to(device);
}

std::string slot_name(size_t k, size_t n_inputs) {
  if (k == 0) return "y";
  if (k <= n_inputs) return "d input " + std::to_string(k - 1);
  return "d param " + std::to_string(k - 1 - n_inputs);
}

}  // namespace

OpValues run_case(const OpCase& c, Device device, DType act,
                  const std::vector<std::vector<double>>& grad_init, uint64_t seed) {
  const bool round = act == DType::kBF16;
  const DType store = device.is_cpu() ? DType::kF32 : act;  // activation storage
  const size_t n_in = c.inputs.size();

  std::vector<Var> leaves;
  for (size_t i = 0; i < n_in; ++i) {
    const Shape& shape = c.inputs[i].shape();
    leaves.push_back(Var::leaf(make(c.inputs[i].to_vector(), shape, store, device, round)));
    if (!grad_init.empty()) {
      leaves.back().grad().copy_from(make(grad_init[i], shape, store, device, round));
    }
  }
  std::vector<std::unique_ptr<Parameter>> params;  // stable addresses: Var::param keeps a pointer
  std::vector<Var> pvars;
  for (size_t j = 0; j < c.params.size(); ++j) {
    const Shape& shape = c.params[j].shape();
    const bool in_act = c.param_dtypes.empty() || c.param_dtypes[j] == ParamDtype::kAct;
    const DType dtype = in_act ? store : DType::kF32;
    params.push_back(std::make_unique<Parameter>(
        "p" + std::to_string(j),
        make(c.params[j].to_vector(), shape, dtype, device, round && in_act)));
    Parameter& p = *params.back();
    p.main_grad = Tensor::zeros(shape, DType::kF32, device);  // main_grad is fp32 on every path
    if (!grad_init.empty()) {
      p.main_grad.copy_from(make(grad_init[n_in + j], shape, DType::kF32, device, false));
    }
    pvars.push_back(Var::param(p));
  }

  Var y = c.f(leaves, pvars);
  const std::vector<double> dy = randn(static_cast<size_t>(y.value().numel()), seed);
  backward_with(y, make(dy, y.shape(), y.dtype(), device, round));

  OpValues out{y.value().to_vector()};
  for (size_t i = 0; i < n_in; ++i) {
    out.push_back(leaves[i].has_grad() ? leaves[i].grad().to_vector()
                                       : std::vector<double>(c.inputs[i].numel(), 0.0));
  }
  for (auto& p : params) out.push_back(p->main_grad.to_vector());
  return out;
}

void expect_cuda_matches_cpu(const OpCase& c, DType act, double tol, bool exact) {
  // Pre-fill each gradient slot with normal values at the scale of that gradient (its RMS from a
  // zero-initialized CPU run), so a lost or doubled contribution shows as an error of order 1.
  const OpValues zero = run_case(c, Device::cpu(), act, {});
  std::vector<std::vector<double>> init;
  for (size_t k = 1; k < zero.size(); ++k) {
    double ss = 0;
    for (double v : zero[k]) ss += v * v;
    const double rms = zero[k].empty() ? 1.0 : std::sqrt(ss / zero[k].size());
    init.push_back(randn(zero[k].size(), 100 + k, rms > 0 ? rms : 1.0));
  }
  const OpValues cpu = run_case(c, Device::cpu(), act, init);
  const OpValues gpu = run_case(c, Device::cuda(0), act, init);
  const OpValues again = run_case(c, Device::cuda(0), act, init);
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t k = 0; k < cpu.size(); ++k) {
    const std::string name = slot_name(k, c.inputs.size());
    EXPECT_LT(rel_diff(gpu[k], cpu[k]), tol) << name << " (" << dtype_name(act) << ")";
    if (exact) {
      EXPECT_TRUE(gpu[k] == cpu[k]) << name << " differs from the CPU's bits";
    }
    EXPECT_TRUE(gpu[k] == again[k]) << name << " is not bit-identical across two GPU runs";
  }
}

}  // namespace gtron::testing
