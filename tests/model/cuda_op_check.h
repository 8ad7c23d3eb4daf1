// CUDA-vs-CPU comparison of an op (test helper for the GPU tests).
//
// A case names an op through its inputs (leaves) and parameters. It runs forward + backward on
// the CPU (f32) and on cuda:0 (f32 or bf16 activations) from identical values, and the test
// compares the forward output and every gradient, then runs the GPU twice more to check that
// the bits repeat. Every gradient slot starts from a non-zero value (scaled to the size of that
// gradient), so the accumulate (+=) contract is checked, not just the value of the gradient.
//
// bf16: every input, bf16 parameter value, dy seed and pre-filled bf16 gradient is rounded to
// bf16 first and the CPU reference computes in f32 on exactly those values, so the difference
// measures only the GPU's own roundings.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/autograd.h"
#include "model/device.h"

// Skips the calling test when there is no GPU: the one acceptable skip, since these binaries are
// also built and run on CPU-only CI machines.
#define GTRON_REQUIRE_GPU()                             \
  if (::gtron::cuda_device_count() == 0) {              \
    GTEST_SKIP() << "no CUDA device: GPU test skipped"; \
  }

namespace gtron::testing {

// Where a parameter's value lives on the GPU: in the activation dtype (GEMM weights, embedding
// tables) or in f32 (master values that norms and positions read directly). Its gradient is
// always an f32 main_grad.
enum class ParamDtype { kAct, kF32 };

struct OpCase {
  // Builds the op; `in` are leaves, `params` are Var::param of the case's parameters.
  std::function<Var(const std::vector<Var>& in, const std::vector<Var>& params)> f;
  std::vector<Tensor> inputs;            // CPU values, any float dtype
  std::vector<Tensor> params;            // CPU values, any float dtype
  std::vector<ParamDtype> param_dtypes;  // one per parameter; empty: all kAct
};

// {y, d inputs..., d params...} as doubles (zeros for an input that received no gradient).
using OpValues = std::vector<std::vector<double>>;

// One forward + backward of `c` on `device` with activations in `act` (the CPU computes in f32 on
// bf16-rounded values when act is bf16). `grad_init` pre-fills the input then parameter gradient
// slots (empty: zeros); dy is a fixed normal draw from `seed`.
OpValues run_case(const OpCase& c, Device device, DType act,
                  const std::vector<std::vector<double>>& grad_init, uint64_t seed = 11);

// Compares cuda:0 against the CPU on `c`: the forward output and every gradient within `tol`
// (normwise relative, rel_diff), and a second GPU run bit-identical to the first. With
// `exact`, the GPU must also equal the CPU bit for bit (kernels that promise the CPU's order).
void expect_cuda_matches_cpu(const OpCase& c, DType act, double tol, bool exact = false);

// Tolerances by dtype. f32: fp32 kernels (GEMMs in true fp32, no TF32) differ from the CPU only
// by summation order and libm ulps, ~1e-7 normwise; 1e-5 leaves room for long reductions. bf16:
// outputs and input gradients are stored in bf16 (relative rounding up to 2^-9 ≈ 2e-3 per value,
// ~1e-3 normwise), and attention rounds P and dS to bf16 before their GEMMs, compounding to a few
// 1e-3; 1e-2 holds that with margin while still catching a wrong formula (errors of order 1).
constexpr double kF32Tol = 1e-5;
constexpr double kBF16Tol = 1e-2;

}  // namespace gtron::testing
