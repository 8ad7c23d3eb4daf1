// What the ops need to hand tensors to their CUDA launchers: fp32 gradient slots, scratch
// buffers, and token ids moved to the device. (No CUDA headers: launchers take raw pointers.)
#pragma once

#include <algorithm>
#include <cstdint>

#include "model/stream.h"
#include "model/tensor.h"

namespace gtron {

// The slot a CUDA kernel accumulates a parameter gradient into. CUDA parameter gradients are
// fp32 (main_grad) whatever the activation dtype.
inline float* f32_grad(const char* op, const Tensor& g) {
  GTRON_CHECK(g.dtype() == DType::kF32, op, ": CUDA parameter gradients are f32 (main_grad); got ",
              dtype_name(g.dtype()));
  return g.data<float>();
}

// Scratch of at least `floats` floats on `s` (the caching allocator orders its reuse after the
// kernels queued on `s`, so the tensor may die as soon as they are launched).
inline Tensor scratch_floats(int64_t floats, Stream& s) {
  return Tensor::empty(Shape{std::max<int64_t>(floats, 1)}, DType::kF32, s.device(), &s);
}

// Scratch of at least `bytes` bytes on `s`.
inline Tensor scratch_bytes(int64_t bytes, Stream& s) { return scratch_floats((bytes + 3) / 4, s); }

// i32 ids (tokens, targets) readable by kernels on s's device: `ids` itself when already there,
// else a copy queued on `s` (a host source is staged by the copy, so it may change afterwards).
inline Tensor ids_on_device(const Tensor& ids, Stream& s) {
  return ids.device() == s.device() ? ids : ids.to(s.device(), &s);
}

}  // namespace gtron
