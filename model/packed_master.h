// The bit arithmetic of packed masters (Note [packed masters] in model/mixed_precision.h): an fp32
// master weight stored as its bf16 shadow plus the 16 low bits of the fp32 value, 4 bytes in all,
// from which the fp32 value comes back exactly. Host and device share these functions (CUDA
// compiles them as __host__ __device__; the CPU test checks them over every high half).
//
// An fp32 word is hi:lo (16 bits each). The shadow is hi rounded by lo: hi + 1 when lo >= 0x8000
// (half away from zero in magnitude, as bf16 is sign and magnitude), else hi. Knowing lo, the
// unpacking subtracts what the packing added. This is round to nearest; only its ties differ from
// the cast's round-to-nearest-even (lo == 0x8000 with hi even: 1 in 65,536 values, each moved by
// one bf16 unit up instead of staying). Ties to even cannot be undone: with lo == 0x8000 an even
// shadow s could be s itself or s - 1 rounded up, 65,537 cases for 32 bits.
// - Infinity has lo = 0 and stays; the largest finite values round up to infinity, and unpack back.
// - NaN: the shadow keeps hi with the quiet bit set (still a NaN, and the unpacking sees a NaN
//   shadow and subtracts nothing), so a NaN master stays a NaN in both; the payload may change.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GTRON_HOST_DEVICE __host__ __device__
#else
#define GTRON_HOST_DEVICE
#endif

namespace gtron::packed {

GTRON_HOST_DEVICE inline bool bf16_is_nan(uint16_t h) {
  return (h & 0x7F80u) == 0x7F80u && (h & 0x007Fu) != 0;
}

// The shadow of the fp32 word `bits`; its low half is bits & 0xFFFF.
GTRON_HOST_DEVICE inline uint16_t high_of(uint32_t bits) {
  const uint16_t hi = static_cast<uint16_t>(bits >> 16), lo = static_cast<uint16_t>(bits);
  const bool nan = (bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0;
  if (nan) return static_cast<uint16_t>(hi | 0x0040u);
  return static_cast<uint16_t>(hi + (lo >> 15));
}

GTRON_HOST_DEVICE inline uint16_t low_of(uint32_t bits) { return static_cast<uint16_t>(bits); }

// The fp32 word back from its shadow and low half (exact for every non-NaN word).
GTRON_HOST_DEVICE inline uint32_t unpack(uint16_t high, uint16_t low) {
  const uint16_t hi = bf16_is_nan(high) ? high : static_cast<uint16_t>(high - (low >> 15));
  return (static_cast<uint32_t>(hi) << 16) | low;
}

}  // namespace gtron::packed
