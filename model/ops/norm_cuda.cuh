// What the norm kernels' two files share (model/ops/norm_forward_cuda.cu: the forwards,
// model/ops/norm_cuda.cu: the backwards): the block shape and the pack-count dispatch of the
// register-resident kernels.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "model/check.h"
#include "model/cuda/kernel_util.cuh"

namespace gtron::cuda {

constexpr int kRowsPerBlock = 8;  // warps per block: one row per warp at a time

inline void check_norm_sizes(const char* op, int64_t N, int64_t C) {
  GTRON_CHECK(N >= 0 && C >= 0 && C <= INT_MAX, op, ": ", N, " rows of ", C, " columns");
}

// Calls fn(std::integral_constant<int, P>{}) with the smallest P of {1, 2, 3, 4, ...kMax} that
// holds `packs` packs a lane, where kMax is 4 or 8 (above 4 only 6 and 8 are instantiated);
// false: more than kMax packs, fn not called.
template <int kMax, typename Fn>
bool with_packs(int64_t packs, Fn&& fn) {
  static_assert(kMax == 4 || kMax == 8, "with_packs: 4 or 8 packs at most");
  auto call = [&](auto p) {
    fn(p);
    return true;
  };
  if (packs <= 1) return call(std::integral_constant<int, 1>{});
  if (packs == 2) return call(std::integral_constant<int, 2>{});
  if (packs == 3) return call(std::integral_constant<int, 3>{});
  if (packs == 4) return call(std::integral_constant<int, 4>{});
  if constexpr (kMax == 8) {
    if (packs <= 6) return call(std::integral_constant<int, 6>{});
    if (packs <= 8) return call(std::integral_constant<int, 8>{});
  }
  return false;
}

}  // namespace gtron::cuda
