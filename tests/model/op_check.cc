#include "tests/model/op_check.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "tests/model/gradcheck.h"

namespace gtron::testing {

std::vector<std::vector<double>> run_op(const std::function<Var(const std::vector<Var>&)>& f,
                                        const std::vector<Tensor>& inputs, DType dtype,
                                        uint64_t seed) {
  std::vector<Var> leaves;
  for (const Tensor& t : inputs) leaves.push_back(Var::leaf(t.to(dtype)));
  Var y = f(leaves);
  backward_with(y, randn_tensor(y.shape(), seed, 1.0, dtype));
  std::vector<std::vector<double>> res{y.value().to_vector()};
  for (size_t i = 0; i < leaves.size(); ++i) {
    res.push_back(leaves[i].has_grad() ? leaves[i].grad().to_vector()
                                       : std::vector<double>(inputs[i].numel(), 0.0));
  }
  return res;
}

double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  GTRON_CHECK(a.size() == b.size(), "rel_diff of ", a.size(), " and ", b.size(), " values");
  double diff = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    nb += b[i] * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(nb), 1e-30);
}

void with_threads(int n, const std::function<void()>& body) {
  const int prev = omp_get_max_threads();
  omp_set_num_threads(n);
  body();
  omp_set_num_threads(prev);
}

std::vector<double> reference_attention(const std::vector<double>& qkv, int64_t B, int64_t T,
                                        int64_t NH, int64_t HS) {
  const int64_t C = NH * HS;
  std::vector<double> out(static_cast<size_t>(B * T * C), 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t i) {
    return qkv[static_cast<size_t>((b * T + t) * 3 * C + part * C + h * HS + i)];
  };
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> w(static_cast<size_t>(t + 1));
        double mx = -1e300, sum = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double d = 0;
          for (int64_t i = 0; i < HS; ++i) d += at(b, t, 0, h, i) * at(b, s, 1, h, i);
          w[s] = d / std::sqrt(static_cast<double>(HS));
          mx = std::max(mx, w[s]);
        }
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (int64_t s = 0; s <= t; ++s) {
          for (int64_t i = 0; i < HS; ++i) {
            out[static_cast<size_t>((b * T + t) * C + h * HS + i)] +=
                w[s] / sum * at(b, s, 2, h, i);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace gtron::testing
