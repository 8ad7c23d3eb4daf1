// AdamW on fp32 master weights with decoupled weight decay, and global-norm gradient clipping.
//
// The update works on flat ranges (w, g, m, v of n elements) so the distributed optimizer can run
// it on its 1/DP slice of contiguous buffers; AdamW below applies it per parameter.
//   m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//   w -= lr·( m/(1−β1^t) / (sqrt(v/(1−β2^t)) + ε) + wd·w )       (wd only where decay applies)
#pragma once

#include <cstdint>
#include <vector>

#include "model/autograd.h"

namespace gtron {

struct AdamWHyper {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// One AdamW update of n elements at step t (1-based), gradient pre-multiplied by grad_scale.
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, double lr,
                  double weight_decay, const AdamWHyper& h, int64_t t, float grad_scale);

// Σ g² over the ranges, accumulated in double in a fixed order (deterministic).
double sum_squares(const float* g, int64_t n);

class AdamW {
 public:
  // `decay[i]` says whether params[i] gets weight decay.
  AdamW(std::vector<Parameter*> params, std::vector<bool> decay, AdamWHyper hyper);

  // Clips by global norm (if clip > 0) and applies one update with learning rate `lr`.
  // Returns the global gradient norm before clipping. REQUIRES: CPU fp32 parameters.
  double step(double lr, double clip);

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  // State tensors in parameter order: m of each param, then v (for checkpoints).
  std::vector<Tensor>& m() { return m_; }
  std::vector<Tensor>& v() { return v_; }
  const std::vector<Tensor>& m() const { return m_; }
  const std::vector<Tensor>& v() const { return v_; }
  const std::vector<Parameter*>& params() const { return params_; }

 private:
  std::vector<Parameter*> params_;
  std::vector<bool> decay_;
  AdamWHyper hyper_;
  std::vector<Tensor> m_, v_;
  int64_t t_ = 0;
};

}  // namespace gtron
