// Finite-difference gradient checks in f64 (test helper).
//
// A check builds a function f(inputs) -> Var y, seeds dy with fixed random weights R, and compares
// the analytic gradient of L = Σ R·y (from backward_with) with central differences of L for every
// element of every input and parameter. The error per tensor is normwise:
//   ‖g_analytic − g_numeric‖ / max(‖g_analytic‖, ‖g_numeric‖, 1e-12).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/autograd.h"

namespace gtron::testing {

// Deterministic normal(0, std) values from a seed (tests only).
std::vector<double> randn(size_t n, uint64_t seed, double std = 1.0);
Tensor randn_tensor(const Shape& shape, uint64_t seed, double std = 1.0, DType dtype = DType::kF64);

struct GradCheckResult {
  std::string worst_name;  // the input or parameter with the largest error
  double worst_error = 0;
};

// `inputs` are leaves (their values get perturbed); `params` are parameters (their data gets
// perturbed). `f` rebuilds the output from the current values each call.
GradCheckResult gradcheck(const std::function<Var(const std::vector<Var>&)>& f,
                          const std::vector<Tensor>& inputs, const std::vector<Parameter*>& params,
                          double eps = 1e-6, uint64_t seed = 7);

}  // namespace gtron::testing
