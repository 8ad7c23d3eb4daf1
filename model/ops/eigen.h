// Eigen views over raw row-major buffers, shared by the CPU kernels.
#pragma once

#include <Eigen/Core>
#include <cstdint>

namespace gtron::cpu {

// Eigen sizes its GEMM blocks from the cache sizes it reads through CPUID, and the blocking decides
// the order of every sum. Fixing the sizes (to what this project's machines report: L1 48 KiB,
// L2 1 MiB, L3 384 MiB) keeps CPU results bit-identical across machines whose caches differ — the
// golden loss curves are compared digit for digit. Call before any Eigen product; thread-safe.
inline void fix_eigen_blocking() {
  static const bool done = [] {
    Eigen::setCpuCacheSizes(49152, 1048576, 402653184);
    return true;
  }();
  (void)done;
}

template <typename T>
using Mat = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <typename T>
using CMat = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <typename T>
using Vec = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>>;
template <typename T>
using CVec = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>>;

// An owning row-major matrix (scratch), and [rows, cols] blocks of a wider row-major buffer
// (row stride given): the per-head q, k, v columns of a packed qkv, read in place.
template <typename T>
using RowMajorMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using StridedRows = Eigen::Map<RowMajorMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using CStridedRows = Eigen::Map<const RowMajorMat<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

}  // namespace gtron::cpu
