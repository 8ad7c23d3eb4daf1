// Helpers for op tests beyond the gradient check (test helper): run an op forward + backward in a
// given dtype and collect every number it produced, so tests can compare f32 against f64 and one
// run against another bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/autograd.h"

namespace gtron::testing {

// Converts `inputs` (any float dtype) to `dtype`, wraps them as leaves, runs y = f(leaves), seeds
// dy with fixed normal weights from `seed` and runs backward. Returns, as doubles,
// {y, d input0, d input1, ...} (zeros for an input that received no gradient).
std::vector<std::vector<double>> run_op(const std::function<Var(const std::vector<Var>&)>& f,
                                        const std::vector<Tensor>& inputs, DType dtype,
                                        uint64_t seed = 11);

// Normwise relative difference ‖a − b‖ / max(‖b‖, 1e-30). REQUIRES: equal sizes.
double rel_diff(const std::vector<double>& a, const std::vector<double>& b);

// Causal multi-head attention on GPT-2's packed rows [B, T, 3·NH·HS] (q | k | v), scalar loops
// over (b, h, t, s) straight from the definition: an independent reference, [B, T, NH·HS].
std::vector<double> reference_attention(const std::vector<double>& qkv, int64_t B, int64_t T,
                                        int64_t NH, int64_t HS);

// Runs `body` with OpenMP limited to `n` threads, then restores the previous limit.
void with_threads(int n, const std::function<void()>& body);

}  // namespace gtron::testing
