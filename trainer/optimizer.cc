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

AdamW::AdamW(int64_t state_numel, std::unordered_set<const Parameter*> decayed, AdamWHyper hyper)
    : decayed_(std::move(decayed)), hyper_(hyper) {
  m_ = Tensor::zeros({std::max<int64_t>(state_numel, 1)}, DType::kF32);
  v_ = Tensor::zeros({std::max<int64_t>(state_numel, 1)}, DType::kF32);
}

void AdamW::step(const std::vector<parallel::OwnedSegment>& segments, double lr, float grad_scale) {
  ++t_;
  float* m = m_.data<float>();
  float* v = v_.data<float>();
  for (const parallel::OwnedSegment& s : segments) {
    const double wd = decayed_.count(s.param) ? hyper_.weight_decay : 0.0;
    adamw_update(s.w, s.g, m + s.state_offset, v + s.state_offset, s.n, lr, wd, hyper_, t_,
                 grad_scale);
  }
}

float clip_scale(double norm, double clip) {
  if (clip <= 0 || !(norm > clip)) return 1.f;
  return static_cast<float>(clip / (norm + 1e-6));
}

}  // namespace gtron
