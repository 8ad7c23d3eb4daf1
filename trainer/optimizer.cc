#include "trainer/optimizer.h"

#include <cmath>

namespace gtron {

void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, double lr,
                  double weight_decay, const AdamWHyper& h, int64_t t, float grad_scale) {
  const float b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(h.beta1, static_cast<double>(t))));
  const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(h.beta2, static_cast<double>(t))));
  const float flr = static_cast<float>(lr), fwd = static_cast<float>(weight_decay);
  const float eps = static_cast<float>(h.eps);
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    m[i] = b1 * m[i] + (1.f - b1) * gi;
    v[i] = b2 * v[i] + (1.f - b2) * gi * gi;
    const float update = (m[i] * c1) / (std::sqrt(v[i] * c2) + eps) + fwd * w[i];
    w[i] -= flr * update;
  }
}

double sum_squares(const float* g, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * g[i];
  return s;
}

AdamW::AdamW(std::vector<Parameter*> params, std::vector<bool> decay, AdamWHyper hyper)
    : params_(std::move(params)), decay_(std::move(decay)), hyper_(hyper) {
  GTRON_CHECK(decay_.size() == params_.size(), "one decay flag per parameter");
  for (Parameter* p : params_) {
    m_.push_back(Tensor::zeros(p->data.shape(), DType::kF32, p->data.device()));
    v_.push_back(Tensor::zeros(p->data.shape(), DType::kF32, p->data.device()));
  }
}

double AdamW::step(double lr, double clip) {
  double ss = 0;
  for (Parameter* p : params_) ss += sum_squares(p->main_grad.data<float>(), p->main_grad.numel());
  const double norm = std::sqrt(ss);
  float scale = 1.f;
  if (clip > 0 && norm > clip) scale = static_cast<float>(clip / (norm + 1e-6));
  ++t_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i];
    adamw_update(p->data.data<float>(), p->main_grad.data<float>(), m_[i].data<float>(),
                 v_[i].data<float>(), p->data.numel(), lr, decay_[i] ? hyper_.weight_decay : 0.0,
                 hyper_, t_, scale);
  }
  return norm;
}

}  // namespace gtron
