// AdamW on fp32 master weights with decoupled weight decay.
//
// The optimizer updates the segments a rank owns (parallel::DataParallel::owned(): everything in a
// single process, a 1/DP slice of every bucket under the distributed optimizer). Its moments live
// in flat arrays indexed by each segment's state_offset.
//   m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//   w -= lr·( m/(1−β1^t) / (sqrt(v/(1−β2^t)) + ε) + wd·w )       (wd only where decay applies)
#pragma once

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "model/autograd.h"
#include "parallel/ddp.h"

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

class AdamW {
 public:
  // `state_numel` elements of m and v (DataParallel::owned_numel()); `decayed` lists the
  // parameters that get weight decay.
  AdamW(int64_t state_numel, std::unordered_set<const Parameter*> decayed, AdamWHyper hyper);

  // One update of every segment with learning rate `lr`; gradients are multiplied by grad_scale
  // (clipping) first.
  void step(const std::vector<parallel::OwnedSegment>& segments, double lr, float grad_scale);

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  Tensor& m() { return m_; }  // [state_numel]
  Tensor& v() { return v_; }  // [state_numel]

 private:
  std::unordered_set<const Parameter*> decayed_;
  AdamWHyper hyper_;
  Tensor m_, v_;
  int64_t t_ = 0;
};

// The clipping factor for a global gradient norm: min(1, clip / norm); 1 when clip <= 0.
float clip_scale(double norm, double clip);

}  // namespace gtron
