#include "tests/model/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace gtron::testing {

std::vector<double> randn(size_t n, uint64_t seed, double std) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, std);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

Tensor randn_tensor(const Shape& shape, uint64_t seed, double std, DType dtype) {
  return Tensor::from_vector(randn(static_cast<size_t>(shape.numel()), seed, std), shape, dtype);
}

namespace {

double dot(const Tensor& a, const Tensor& b) {
  const double* x = a.data<double>();
  const double* y = b.data<double>();
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += x[i] * y[i];
  return s;
}

double rel_error(const std::vector<double>& a, const std::vector<double>& n) {
  double diff = 0, na = 0, nn = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - n[i]) * (a[i] - n[i]);
    na += a[i] * a[i];
    nn += n[i] * n[i];
  }
  return std::sqrt(diff) / std::max({std::sqrt(na), std::sqrt(nn), 1e-12});
}

}  // namespace

GradCheckResult gradcheck(const std::function<Var(const std::vector<Var>&)>& f,
                          const std::vector<Tensor>& inputs, const std::vector<Parameter*>& params,
                          double eps, uint64_t seed) {
  std::vector<Var> leaves;
  for (const Tensor& t : inputs) leaves.push_back(Var::leaf(t));
  for (Parameter* p : params) p->zero_grad();
  Var y = f(leaves);
  Tensor r = randn_tensor(y.shape(), seed);
  backward_with(y, r);

  // Analytic gradients.
  std::vector<std::pair<std::string, Tensor>> targets;  // (name, perturbed tensor)
  std::vector<std::vector<double>> analytic;
  for (size_t i = 0; i < leaves.size(); ++i) {
    targets.emplace_back("input" + std::to_string(i), inputs[i]);
    analytic.push_back(leaves[i].has_grad() ? leaves[i].grad().to_vector()
                                            : std::vector<double>(inputs[i].numel(), 0.0));
  }
  for (Parameter* p : params) {
    targets.emplace_back(p->name, p->data);
    analytic.push_back(p->main_grad.to_vector());
  }

  auto loss = [&] {
    NoGradGuard ng;
    std::vector<Var> consts;
    for (const Tensor& t : inputs) consts.push_back(Var::constant(t));
    return dot(f(consts).value(), r);
  };

  GradCheckResult res;
  for (size_t k = 0; k < targets.size(); ++k) {
    Tensor t = targets[k].second;
    GTRON_CHECK(t.dtype() == DType::kF64, "gradcheck needs f64 tensors");
    double* v = t.data<double>();
    std::vector<double> numeric(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double orig = v[i];
      v[i] = orig + eps;
      const double lp = loss();
      v[i] = orig - eps;
      const double lm = loss();
      v[i] = orig;
      numeric[i] = (lp - lm) / (2 * eps);
    }
    double err = rel_error(analytic[k], numeric);
    if (err >= res.worst_error) {
      res.worst_error = err;
      res.worst_name = targets[k].first;
    }
  }
  return res;
}

}  // namespace gtron::testing
