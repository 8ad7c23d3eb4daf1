// Learning-rate schedules: linear warmup, then cosine / linear / constant / WSD to min_lr.
#pragma once

#include <cstdint>

#include "trainer/config.h"  // ScheduleKind

namespace gtron {

struct Schedule {
  ScheduleKind kind = ScheduleKind::kCosine;
  double lr = 6e-4;                 // peak learning rate
  int64_t warmup_steps = 0;         // linear ramp from lr/warmup to lr over these steps
  int64_t total_steps = 1;          // train.steps
  double min_lr_ratio = 0.1;        // final lr = lr * min_lr_ratio (cosine, linear, wsd)
  double wsd_decay_fraction = 0.2;  // WSD: the last fraction of steps decays linearly

  // Learning rate for step s in [0, total_steps).
  double at(int64_t s) const;
};

}  // namespace gtron
