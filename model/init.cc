#include "model/init.h"

#include <cmath>

namespace gtron {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_string(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

namespace {

// Uniform in (0, 1) from 53 random bits, never 0 (Box–Muller takes its log).
double uniform_open(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

// Element pairs (2j, 2j + 1) depend on (key, j) alone, so any split of the pairs over threads
// writes the same bits; tensors of a million elements or more use every OpenMP thread (a
// 4-billion-parameter model takes a minute on one core).
template <typename T>
void fill_normal(T* p, int64_t n, double std, uint64_t key) {
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 20))
  for (int64_t i = 0; i < n; i += 2) {
    double u1 = uniform_open(splitmix64(key + 2 * static_cast<uint64_t>(i)));
    double u2 = uniform_open(splitmix64(key + 2 * static_cast<uint64_t>(i) + 1));
    double r = std::sqrt(-2.0 * std::log(u1));
    p[i] = static_cast<T>(std * r * std::cos(2 * M_PI * u2));
    if (i + 1 < n) p[i + 1] = static_cast<T>(std * r * std::sin(2 * M_PI * u2));
  }
}

}  // namespace

void init_normal(Tensor& t, double std, uint64_t seed, const std::string& name) {
  GTRON_CHECK(t.device().is_cpu(), "init on ", t.device().str());
  uint64_t key = splitmix64(seed ^ hash_string(name));
  if (t.dtype() == DType::kF32) {
    fill_normal(t.data<float>(), t.numel(), std, key);
  } else {
    fill_normal(t.data<double>(), t.numel(), std, key);
  }
}

void init_constant(Tensor& t, double value) {
  GTRON_CHECK(t.device().is_cpu(), "init on ", t.device().str());
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype() == DType::kF32) {
      t.data<float>()[i] = static_cast<float>(value);
    } else {
      t.data<double>()[i] = value;
    }
  }
}

}  // namespace gtron
