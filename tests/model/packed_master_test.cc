// The bit arithmetic of packed masters (model/packed_master.h, Note [packed masters] in
// model/mixed_precision.h), on the CPU: for every high half and a set of low halves covering the
// rounding boundary, the fp32 word comes back exactly from its shadow and low half; the shadow is
// the word rounded to nearest (ties away from zero), so it equals round-to-nearest-even except at
// ties with an even high half; NaN stays NaN in the shadow and the word.
#include "model/packed_master.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace gtron {
namespace {

float as_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

bool is_nan_word(uint32_t b) { return (b & 0x7F800000u) == 0x7F800000u && (b & 0x7FFFFFu) != 0; }

// Round to nearest even, as __float2bfloat16_rn (NaN: any NaN).
uint16_t rne(uint32_t b) {
  const uint32_t lsb = (b >> 16) & 1u;
  return static_cast<uint16_t>((b + 0x7FFFu + lsb) >> 16);
}

std::vector<uint16_t> lows() {
  std::vector<uint16_t> v = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001,
                             0xFFFE, 0xFFFF, 0x4000, 0xC000};
  uint32_t s = 12345;
  for (int i = 0; i < 23; ++i) {
    s = s * 1664525u + 1013904223u;
    v.push_back(static_cast<uint16_t>(s >> 16));
  }
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

TEST(PackedMaster, EveryWordComesBackExactly) {
  int64_t checked = 0;
  for (uint32_t hi = 0; hi <= 0xFFFFu; ++hi) {
    for (uint16_t lo : lows()) {
      const uint32_t b = (hi << 16) | lo;
      const uint16_t s = packed::high_of(b);
      ASSERT_EQ(packed::low_of(b), lo);
      const uint32_t back = packed::unpack(s, lo);
      if (is_nan_word(b)) {
        ASSERT_TRUE(packed::bf16_is_nan(s)) << std::hex << b;
        ASSERT_TRUE(is_nan_word(back)) << std::hex << b;
        ASSERT_EQ(back & 0x80000000u, b & 0x80000000u) << "the sign stays";
      } else {
        ASSERT_EQ(back, b) << std::hex << "word " << b << " shadow " << s;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 65536 * 30);
}

TEST(PackedMaster, ShadowRoundsToNearestTiesAwayFromZero) {
  int64_t ties = 0;
  for (uint32_t hi = 0; hi <= 0xFFFFu; ++hi) {
    for (uint16_t lo : lows()) {
      const uint32_t b = (hi << 16) | lo;
      if (is_nan_word(b)) continue;
      const uint16_t s = packed::high_of(b), r = rne(b);
      const bool even_tie = lo == 0x8000 && (hi & 1u) == 0;
      if (even_tie) {
        ASSERT_EQ(s, static_cast<uint16_t>(r + 1)) << std::hex << b << ": a tie goes up";
        ++ties;
      } else {
        ASSERT_EQ(s, r) << std::hex << b << ": off the ties, as round to nearest even";
      }
      // Nearest: no bf16 neighbour of the shadow is closer to the word (finite words).
      const float x = as_float(b), y = as_float(static_cast<uint32_t>(s) << 16);
      if (std::isfinite(x) && std::isfinite(y)) {
        const float down = as_float(static_cast<uint32_t>(hi) << 16);
        const float up = as_float(static_cast<uint32_t>(hi + 1u) << 16);
        if (std::isfinite(up)) {
          ASSERT_LE(std::fabs(static_cast<double>(y) - x),
                    std::fmin(std::fabs(static_cast<double>(down) - x),
                              std::fabs(static_cast<double>(up) - x)))
              << std::hex << b;
        }
      }
    }
  }
  // Every even high half once (lo = 0x8000), less the 2 x 64 whose exponent is all ones (NaNs).
  EXPECT_EQ(ties, 32768 - 128);
}

TEST(PackedMaster, InfinityAndTheLargestFloat) {
  const uint32_t inf = 0x7F800000u, max = 0x7F7FFFFFu, neg_max = 0xFF7FFFFFu;
  EXPECT_EQ(packed::high_of(inf), 0x7F80u);
  EXPECT_EQ(packed::unpack(packed::high_of(inf), packed::low_of(inf)), inf);
  EXPECT_EQ(packed::high_of(max), 0x7F80u) << "rounds up to infinity, as the cast does";
  EXPECT_EQ(packed::unpack(packed::high_of(max), packed::low_of(max)), max);
  EXPECT_EQ(packed::high_of(neg_max), 0xFF80u);
  EXPECT_EQ(packed::unpack(packed::high_of(neg_max), packed::low_of(neg_max)), neg_max);
  const uint32_t qnan = 0x7FFFFFFFu;  // CUDA's canonical NaN: hi 0x7FFF, lo 0xFFFF
  EXPECT_TRUE(packed::bf16_is_nan(packed::high_of(qnan))) << "not -0 from a carry";
}

}  // namespace
}  // namespace gtron
