#include "model/ops/segments.h"

#include "model/ops/device_util.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

namespace cpu {

void document_segments(const int32_t* tokens, int32_t start_id, int32_t* seg, int32_t* pos,
                       int64_t B, int64_t T) {
  for (int64_t b = 0; b < B; ++b) {
    int32_t s = 0;
    int64_t first = 0;  // where the current segment began
    for (int64_t t = 0; t < T; ++t) {
      if (t > 0 && tokens[b * T + t] == start_id) {
        ++s;
        first = t;
      }
      seg[b * T + t] = s;
      if (pos != nullptr) pos[b * T + t] = static_cast<int32_t>(t - first);
    }
  }
}

}  // namespace cpu

void document_segments(const Tensor& tokens, int32_t start_id, Tensor& seg, Tensor* pos) {
  GTRON_CHECK(tokens.rank() == 2 && tokens.dtype() == DType::kI32,
              "document_segments: tokens must be i32 [B, T]; got ", tokens.shape().str(), " ",
              dtype_name(tokens.dtype()));
  const int64_t B = tokens.dim(0), T = tokens.dim(1);
  const Device dev = seg.device();  // the model's: where attention reads the segments
  GTRON_CHECK(tokens.device().is_cpu() || tokens.device() == dev,
              "document_segments: tokens must be on the CPU or the outputs' device ", dev.str(),
              "; got ", tokens.device().str());
  for (const Tensor* out : {static_cast<const Tensor*>(&seg), static_cast<const Tensor*>(pos)}) {
    if (out == nullptr) continue;
    GTRON_CHECK(out->dtype() == DType::kI32 && out->device() == dev,
                "document_segments: outputs must be i32 on one device, ", dev.str());
    check_shape("document_segments: output", out->shape(), Shape{B, T});
  }
  int32_t* sp = seg.data<int32_t>();
  int32_t* pp = pos != nullptr ? pos->data<int32_t>() : nullptr;
  Stream& s = current_stream(dev);
  if (dev.is_cuda()) {
    // The training step's tokens are already on the device (no copy); host tokens (evaluation,
    // sampling) are staged onto it first, as embedding() does with them.
    const Tensor ids = ids_on_device(tokens, s);
    cuda::document_segments(ids.data<int32_t>(), start_id, sp, pp, B, T, s.native());
    return;
  }
  const int32_t* tp = tokens.data<int32_t>();
  // On the CPU stream, so that a captured graph recomputes them at every replay.
  s.run([=] { cpu::document_segments(tp, start_id, sp, pp, B, T); });
}

}  // namespace gtron
