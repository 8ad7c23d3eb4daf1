// Fixed-size blocks for the CPU kernels' elementwise math and row reductions.
//
// Policy: kernels walk their rows in blocks of kBlock elements held in an Eigen::Array<T, kBlock>
// (a whole number of SIMD registers), so Eigen evaluates every block with its packet math,
// including its vectorized exp and tanh for float. A partial tail block is padded into a local
// block and computed the same way. Hence:
// - every element runs the same instructions whatever its position, the buffer's alignment, or
//   where a thread's chunk begins: results are bit-identical across runs and thread counts;
// - the code vectorizes under the build's plain -O2 (no -ffast-math needed).
// Reductions keep kBlock lane partials and combine them in one fixed order (lane_sum, lane_max).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <limits>

namespace gtron::cpu {

constexpr int kBlock = 8;

template <typename T>
using Block = Eigen::Array<T, kBlock, 1>;

// Elements of the block starting at i in a row of n.
inline int block_len(int64_t i, int64_t n) {
  return static_cast<int>(std::min<int64_t>(kBlock, n - i));
}

// Loads len <= kBlock elements; lanes past len hold `pad`.
template <typename T>
inline Block<T> load_block(const T* p, int len, T pad = T(0)) {
  if (len == kBlock) return Eigen::Map<const Block<T>>(p);
  Block<T> b = Block<T>::Constant(pad);
  for (int k = 0; k < len; ++k) b[k] = p[k];
  return b;
}

// Stores the first len lanes.
template <typename T>
inline void store_block(T* p, const Block<T>& b, int len) {
  if (len == kBlock) {
    Eigen::Map<Block<T>> dst(p);  // (a named map: `Map<..>(p) = b;` would declare p)
    dst = b;
  } else {
    for (int k = 0; k < len; ++k) p[k] = b[k];
  }
}

// p[0, len) += the first len lanes.
template <typename T>
inline void add_block(T* p, const Block<T>& b, int len) {
  if (len == kBlock) {
    Eigen::Map<Block<T>> dst(p);
    dst += b;
  } else {
    for (int k = 0; k < len; ++k) p[k] += b[k];
  }
}

// Zeroes lanes [len, kBlock): a tail block's padding must not reach a sum.
template <typename T>
inline Block<T> mask_tail(Block<T> b, int len) {
  for (int k = len; k < kBlock; ++k) b[k] = T(0);
  return b;
}

// The lanes' sum in a fixed order.
template <typename T>
inline T lane_sum(const Block<T>& a) {
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

// Σ_{i<n} v[i] through kBlock lane partials (fixed order).
template <typename T>
inline T row_sum(const T* v, int64_t n) {
  Block<T> acc = Block<T>::Zero();
  for (int64_t i = 0; i < n; i += kBlock) acc += load_block(v + i, block_len(i, n));
  return lane_sum(acc);
}

// max_{i<n} v[i]; −inf for n = 0.
template <typename T>
inline T row_max(const T* v, int64_t n) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  Block<T> acc = Block<T>::Constant(kNegInf);
  for (int64_t i = 0; i < n; i += kBlock) {
    acc = acc.max(load_block(v + i, block_len(i, n), kNegInf));
  }
  return acc.maxCoeff();
}

}  // namespace gtron::cpu
