// Test helpers for the parallel tests that train a small GPT with threads as ranks.
#pragma once

#include <cstdint>
#include <vector>

#include "model/gpt.h"

namespace gtron::parallel::test_util {

// i32 [2, 9]: two windows of 8 positions + 1 target, tokens in [0, 50), a function of `seed`.
Tensor small_window(uint64_t seed);
// The parameters GTP shards: every matrix but the positions.
std::vector<Parameter*> gtp_shardable(const GPT& m);

}  // namespace gtron::parallel::test_util
