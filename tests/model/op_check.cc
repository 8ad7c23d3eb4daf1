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

}  // namespace gtron::testing
