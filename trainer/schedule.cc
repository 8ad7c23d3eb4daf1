#include "trainer/schedule.h"

#include <algorithm>
#include <cmath>

#include "model/check.h"

namespace gtron {

double Schedule::at(int64_t s) const {
  if (s < warmup_steps) return lr * static_cast<double>(s + 1) / static_cast<double>(warmup_steps);
  const double min_lr = lr * min_lr_ratio;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(s - warmup_steps) / span);
  switch (kind) {
    case ScheduleKind::kConstant:
      return lr;
    case ScheduleKind::kCosine:
      return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
    case ScheduleKind::kLinear:
      return lr + (min_lr - lr) * progress;
    case ScheduleKind::kWsd: {
      // Warmup, a stable plateau at lr, then a linear decay over the last fraction of all steps.
      const int64_t decay_steps =
          static_cast<int64_t>(std::ceil(wsd_decay_fraction * static_cast<double>(total_steps)));
      const int64_t decay_start = total_steps - decay_steps;
      if (s < decay_start || decay_steps == 0) return lr;
      const double p = static_cast<double>(s - decay_start + 1) / static_cast<double>(decay_steps);
      return lr + (min_lr - lr) * std::min(1.0, p);
    }
  }
  GTRON_CHECK(false, "unknown schedule kind");
}

}  // namespace gtron
