// What the GPU microbenchmarks of tests/model (bench_add_norm, bench_norm) share: their flags and
// their deterministic inputs.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/device.h"
#include "model/tensor.h"

namespace gtron::bench {

// The value after `--name` on the command line, or `def`.
inline int64_t arg(int argc, char** argv, const std::string& name, int64_t def) {
  int64_t v = def;
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == "--" + name) v = std::atoll(argv[i + 1]);
  return v;
}

// A CUDA tensor of `dt` holding offset + v·((i·7919) mod 13 − 6) at element i.
inline Tensor filled(const Shape& shape, DType dt, double v, double offset = 0.0) {
  Tensor t = Tensor::zeros(shape, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    p[i] = static_cast<float>(offset + v * ((i * 7919) % 13 - 6));
  }
  return t.to(dt).to(Device::cuda(0));
}

}  // namespace gtron::bench
