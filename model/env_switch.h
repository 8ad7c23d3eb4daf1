// The GTRON_* A/B switches of the GPU paths (README, GPU section), e.g. GTRON_RESIDUAL_GEMM=0.
#pragma once

#include <cstdlib>
#include <cstring>

namespace gtron {

// On unless the environment variable `name` is "0". Read at each call: a caller caches the answer
// where nothing changes it during the process (tests set some switches between runs).
inline bool env_switch_on(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr || std::strcmp(e, "0") != 0;
}

}  // namespace gtron
