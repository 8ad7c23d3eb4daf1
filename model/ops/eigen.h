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

}  // namespace gtron::cpu
