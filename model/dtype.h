// Element types. f32 and bf16 are the training types; f64 exists on CPU for gradient checks; i32
// holds token ids and targets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace gtron {

enum class DType : uint8_t { kF32, kBF16, kF64, kI32 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

// bfloat16 storage on the host: the top 16 bits of an IEEE float. Conversion rounds to nearest
// even.
struct BF16 {
  uint16_t bits;
};

inline float bf16_to_float(BF16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline BF16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return BF16{0x7fc0};  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return BF16{static_cast<uint16_t>(u >> 16)};
}

// Maps a C++ scalar type to its DType (used by Tensor::data<T>() to check the request).
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kF64;
};
template <>
struct DTypeOf<BF16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};

}  // namespace gtron
