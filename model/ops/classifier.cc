#include "model/ops/classifier.h"

#include <algorithm>
#include <cstdlib>

#include "model/check.h"
#include "model/ops/add.h"
#include "model/ops/device_util.h"
#include "model/ops/linear.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

namespace {

// A block's logits take at most this many bytes (GPT-2 124M at B·T = 16k: 4 blocks of 4096 rows).
constexpr int64_t kBlockBytes = int64_t{512} << 20;
constexpr int64_t kRowAlign = 128;  // block rows are a multiple of it (GEMM tiles)

const char* byte_ptr(const Tensor& t, int64_t offset_bytes) {
  return static_cast<const char*>(t.raw()) + offset_bytes;
}

}  // namespace

int64_t classifier_block_rows(int64_t N, int64_t Vp) {
  if (const char* e = std::getenv("GTRON_CLASSIFIER_ROWS")) {
    char* end = nullptr;
    const long long rows = std::strtoll(e, &end, 10);
    if (*e == '\0' || *end != '\0' || rows < 0) {
      throw UserError(str_cat("GTRON_CLASSIFIER_ROWS is '", e,
                              "'; expected a row count >= 0 (0: the blocked classifier off)"));
    }
    return rows;
  }
  const int64_t bytes = N * Vp * static_cast<int64_t>(dtype_size(DType::kBF16));
  const int64_t blocks = std::max<int64_t>(1, (bytes + kBlockBytes - 1) / kBlockBytes);
  const int64_t rows = (N + blocks - 1) / blocks;
  return (rows + kRowAlign - 1) / kRowAlign * kRowAlign;
}

bool classifier_supported(const Var& x, const Var& w, const KnownLossGrad* known) {
  if (known == nullptr || !known->seed.defined() || !grad_enabled()) return false;
  if (!x.device().is_cuda() || x.dtype() != DType::kBF16 || w.dtype() != DType::kBF16) return false;
  if (!x.requires_grad() && !w.requires_grad()) return false;
  // The weight's slot must be bound now (GTP binds a gathered weight's only in its backward).
  if (w.requires_grad() && (!w.has_grad() || w.grad_dtype() != DType::kF32)) return false;
  const int64_t C = x.shape()[x.shape().rank() - 1];
  return classifier_block_rows(x.value().numel() / C, w.shape()[0]) > 0;
}

Var classifier_cross_entropy(const Var& x, const Var& w, const Tensor& targets, int64_t V,
                             const KnownLossGrad& known) {
  GTRON_CHECK(classifier_supported(x, w, &known), "classifier_cross_entropy: not applicable to ",
              x.device().str(), "/", dtype_name(x.dtype()), " (see classifier_supported)");
  const int64_t C = x.shape()[x.shape().rank() - 1];
  const int64_t Vp = w.shape()[0];
  check_shape("classifier weight", w.shape(), Shape{Vp, C});
  std::vector<int64_t> lead = x.shape().vec();
  lead.pop_back();
  check_shape("classifier targets", targets.shape(), Shape(lead));
  GTRON_CHECK(V > 0 && V <= Vp, "classifier: V = ", V, " outside (0, Vp = ", Vp, "]");
  GTRON_CHECK(targets.dtype() == DType::kI32, "classifier: targets must be i32");
  const Tensor& seed = known.seed;
  GTRON_CHECK(seed.dtype() == DType::kF32 && seed.numel() == 1 && seed.device() == x.device(),
              "classifier: the known gradient's seed must be one f32 value on ", x.device().str());
  const int64_t N = targets.numel();
  Device dev = x.device();
  Stream& s = current_stream(dev);
  if (targets.device().is_cpu()) check_targets_on_host(targets, V);
  const Tensor tg = ids_on_device(targets, s);
  const float weight = static_cast<float>(known.weight);

  Tensor loss = Tensor::empty(Shape{}, DType::kF32, dev, &s);
  Tensor rmax = Tensor::empty(Shape{N}, DType::kF32, dev, &s);
  Tensor rlse = Tensor::empty(Shape{N}, DType::kF32, dev, &s);
  Tensor tlogit = Tensor::empty(Shape{N}, DType::kF32, dev, &s);
  Tensor count = Tensor::empty(Shape{1}, DType::kI32, dev, &s);
  Tensor dx;
  if (x.requires_grad()) dx = Tensor::empty(x.shape(), DType::kBF16, dev, &s);
  bool dw_overwrite = false;  // Note [first gradient write] in parallel/ddp.h
  Tensor* dw = w.requires_grad() ? &w.weight_grad(&dw_overwrite) : nullptr;

  const int64_t R = std::min(N, classifier_block_rows(N, Vp));
  Tensor logits = Tensor::empty(Shape{std::max<int64_t>(R, 1), Vp}, DType::kBF16, dev, &s);
  cuda::cross_entropy_count(tg.data<int32_t>(), count.data<int32_t>(), N, V, s.native());
  const int64_t row_bytes = C * static_cast<int64_t>(dtype_size(DType::kBF16));
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t rows = std::min(R, N - r0);
    const void* xb = byte_ptr(x.value(), r0 * row_bytes);
    cuda::linear_forward(xb, w.value().raw(), nullptr, DType::kBF16, logits.raw(), rows, C, Vp,
                         DType::kBF16, s.native());
    cuda::cross_entropy_onepass_rows(logits.raw(), tg.data<int32_t>() + r0, rmax.data<float>() + r0,
                                     rlse.data<float>() + r0, tlogit.data<float>() + r0,
                                     count.data<int32_t>(), seed.data<float>(), weight, rows, V, Vp,
                                     DType::kBF16, s.native());
    void* dxb = dx.defined() ? static_cast<char*>(dx.raw()) + r0 * row_bytes : nullptr;
    cuda::linear_backward(xb, w.value().raw(), logits.raw(), dxb, dw ? dw->raw() : nullptr,
                          DType::kF32, nullptr, nullptr, rows, C, Vp, DType::kBF16, s.native(),
                          /*dx_overwrite=*/true, /*dw_overwrite=*/dw_overwrite && r0 == 0);
  }
  cuda::cross_entropy_onepass_finalize(tg.data<int32_t>(), rmax.data<float>(), rlse.data<float>(),
                                       tlogit.data<float>(), count.data<int32_t>(),
                                       loss.data<float>(), N, s.native());

  Var out = Var::output(loss, true);
  record_backward([x, out, dx, seed, weight] {
    // w's gradient was summed in the forward: a loss that gets no gradient broke the promise.
    GTRON_CHECK(out.has_grad(),
                "classifier_cross_entropy: its loss took no part in the backward, "
                "but the head's gradient was already formed");
    Stream& s = current_stream(out.device());
    cuda::cross_entropy_promise_check(seed.data<float>(), weight, out.grad().data<float>(),
                                      s.native());
    if (!x.requires_grad()) return;
    if (x.has_grad()) {
      accumulate_into(x.grad(), dx);
    } else {
      x.set_grad(dx);
    }
  });
  return out;
}

}  // namespace gtron
