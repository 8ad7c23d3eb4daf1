#include "model/ops/attention.h"

#include <cmath>

#include "model/ops/column_scratch.h"
#include "model/ops/device_util.h"
#include "model/ops/rope.h"
#include "model/ops/shape_check.h"
#include "model/stream.h"

namespace gtron {

namespace {

float score_scale(int64_t HS) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
}

// The flash kernels' view of the attention's tensors: qkv [B, T, W] packed (NH q heads, NKV k
// heads, NKV v heads of HS; W = (NH + 2·NKV)·HS), y [B, T, NH·HS].
cuda::FlashForwardArgs flash_forward_args(const Tensor& qkv, Tensor& y, Tensor& lse, int NH,
                                          int NKV, int64_t HS) {
  cuda::FlashForwardArgs a;
  const int64_t T = qkv.shape()[1], W = qkv.shape()[2], Cq = NH * HS;
  const char* base = static_cast<const char*>(qkv.raw());
  a.q = base;
  a.k = base + Cq * dtype_size(qkv.dtype());
  a.v = base + (Cq + NKV * HS) * dtype_size(qkv.dtype());
  a.o = y.raw();
  a.lse = lse.data<float>();
  a.q_ld = a.kv_ld = W;
  a.o_ld = Cq;
  a.q_batch = a.kv_batch = T * W;
  a.o_batch = T * Cq;
  a.B = static_cast<int>(qkv.shape()[0]);
  a.NH = NH;
  a.NKV = NKV;
  a.HS = static_cast<int>(HS);
  a.Tq = a.Tk = static_cast<int>(T);
  a.scale = score_scale(HS);
  return a;
}

cuda::FlashBackwardArgs flash_backward_args(const Tensor& qkv, const Tensor& y, const Tensor& dy,
                                            const Tensor& lse, Tensor& dqkv, int NH, int NKV,
                                            int64_t HS) {
  cuda::FlashBackwardArgs a;
  const int64_t T = qkv.shape()[1], W = qkv.shape()[2], Cq = NH * HS;
  a.qkv = qkv.raw();
  a.o = y.raw();
  a.dout = dy.raw();
  a.lse = lse.data<float>();
  a.dqkv = dqkv.raw();
  a.qkv_ld = W;
  a.qkv_batch = T * W;
  a.o_ld = Cq;
  a.o_batch = T * Cq;
  a.B = static_cast<int>(qkv.shape()[0]);
  a.NH = NH;
  a.NKV = NKV;
  a.HS = static_cast<int>(HS);
  a.T = static_cast<int>(T);
  a.scale = score_scale(HS);
  return a;
}

}  // namespace

namespace {

// RoPE before the flash kernels (causal_attention_gqa_rope): the f32 [HS/2] table and the first
// position.
struct FlashRope {
  Tensor inv_freq;
  int64_t pos0 = 0;
  bool rotated = false;  // q and k arrive rotated (Note [RoPE in the q/k norm])
};

// segments: undefined, or i32 [B, Tlen] on qkv's device (Note [document masking]).
void check_segments(const Tensor& seg, const Var& qkv, int64_t B, int64_t Tlen) {
  if (!seg.defined()) return;
  GTRON_CHECK(seg.dtype() == DType::kI32 && seg.device() == qkv.device(),
              "causal attention: segment ids must be i32 on ", qkv.device().str(), "; got ",
              dtype_name(seg.dtype()), " on ", seg.device().str());
  check_shape("causal attention: segments", seg.shape(), Shape{B, Tlen});
}

// Every entry point: the flash kernels when `flash`, else the reference kernels of the grouped
// layout (NKV = NH is GPT-2's [q | k | v]). qkv: [B, T, (NH + 2·NKV)·HS]. With `rope` (flash
// only), q and k are first rotated in place in qkv's value, which the kernels read, and the
// backward delivers the gradient of the un-rotated qkv (Note [RoPE in the flash backward]).
// `seg` (may be undefined): the document segments, checked by check_segments.
Var attention_of(const Var& qkv, int64_t B, int64_t Tlen, int NH, int NKV, int64_t HS, bool flash,
                 const Tensor& seg, const FlashRope* rope = nullptr) {
  check_segments(seg, qkv, B, Tlen);
  const int32_t* sp = seg.defined() ? seg.data<int32_t>() : nullptr;
  Device dev = qkv.device();
  Stream& s = current_stream(dev);
  Tensor y = Tensor::empty(Shape{B, Tlen, NH * HS}, qkv.dtype(), dev, &s);
  // [B, NH, T] log-sum-exps, kept for the backward; fp32 on CUDA.
  Tensor lse =
      Tensor::empty(Shape{B, NH, Tlen}, dev.is_cuda() ? DType::kF32 : qkv.dtype(), dev, &s);
  GTRON_CHECK(rope == nullptr || flash,
              "attention: RoPE inside the attention needs the flash path");
  Tensor in = qkv.value();  // what the kernels read: qkv, rotated in place with `rope`
  if (rope != nullptr && !rope->rotated) {
    cuda::rope_forward_inplace(in.raw(), rope->inv_freq.data<float>(), B, Tlen, NH, NKV, HS,
                               rope->pos0, qkv.dtype(), s.native());
  }
  const FlashRope rope_copy = rope != nullptr ? *rope : FlashRope{};
  const bool roped = rope != nullptr;
  if (flash) {
    cuda::FlashForwardArgs a = flash_forward_args(in, y, lse, NH, NKV, HS);
    a.seg = sp;
    a.seg_batch = Tlen;
    cuda::flash_attention_forward(a, s.native());
  } else if (dev.is_cuda()) {
    Tensor scratch = scratch_bytes(
        cuda::attention_gqa_forward_scratch_bytes(B, Tlen, NH, NKV, HS, qkv.dtype()), s);
    cuda::attention_gqa_forward(qkv.value().raw(), y.raw(), lse.data<float>(), scratch.raw(), B,
                                Tlen, NH, NKV, HS, qkv.dtype(), s.native(), sp);
  } else {
    dispatch_float(qkv.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* qp = qkv.value().data<T>();
      T* yp = y.data<T>();
      T* lp = lse.data<T>();
      s.run([=] { cpu::attention_gqa_forward<T>(qp, yp, lp, B, Tlen, NH, NKV, HS, sp); });
    });
  }

  Var out = Var::output(y, qkv.requires_grad());
  if (out.requires_grad()) {
    // The closure holds the segments: their buffer lives as long as the backward may read it.
    record_backward([qkv, in, lse, out, B, Tlen, NH, NKV, HS, flash, roped, rope_copy, seg] {
      if (!out.has_grad()) return;
      const int32_t* sp = seg.defined() ? seg.data<int32_t>() : nullptr;
      Stream& s = current_stream(out.device());
      if (flash) {
        Tensor scratch =
            scratch_floats(cuda::flash_attention_backward_scratch_floats(B, Tlen, NH), s);
        bool overwrite = false;
        Tensor& dqkv = qkv.grad_for_write(&overwrite);
        cuda::FlashBackwardArgs a =
            flash_backward_args(in, out.value(), out.grad(), lse, dqkv, NH, NKV, HS);
        a.accumulate = !overwrite;
        a.seg = sp;
        a.seg_batch = Tlen;
        if (roped) {
          a.rope_inv_freq = rope_copy.inv_freq.data<float>();
          a.rope_pos0 = rope_copy.pos0;
        }
        // Note [qkv bias partials]: the linear that made qkv finishes its bias gradient from them.
        Tensor partials;
        const int64_t chunks = cuda::flash_column_chunks(B, Tlen);
        if (qkv.col_partials_requested()) {
          partials = column_scratch(chunks * (NH + 2 * NKV) * HS, s);
          a.col_partial = partials.data<float>();
        }
        cuda::flash_attention_backward(a, scratch.data<float>(), s.native());
        if (partials.defined()) qkv.set_col_partials(partials, chunks);
        return;
      }
      if (out.device().is_cuda()) {
        Tensor scratch = scratch_bytes(
            cuda::attention_gqa_backward_scratch_bytes(B, Tlen, NH, NKV, HS, out.dtype()), s);
        cuda::attention_gqa_backward(qkv.value().raw(), lse.data<float>(), out.grad().raw(),
                                     qkv.grad().raw(), scratch.raw(), B, Tlen, NH, NKV, HS,
                                     out.dtype(), s.native(), sp);
        return;
      }
      dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* qp = qkv.value().data<T>();
        const T* lp = lse.data<T>();
        const T* dyp = out.grad().data<T>();
        T* dq = qkv.grad().data<T>();
        s.run([=] { cpu::attention_gqa_backward<T>(qp, lp, dyp, dq, B, Tlen, NH, NKV, HS, sp); });
      });
    });
  }
  return out;
}

}  // namespace

Var causal_attention(const Var& qkv, int NH, const Tensor& segments) {
  GTRON_CHECK(qkv.shape().rank() == 3, "causal_attention: qkv ", qkv.shape().str(),
              ", expected [B, T, 3C]");
  const int64_t C3 = qkv.shape()[2];
  GTRON_CHECK(NH > 0 && C3 % (3 * static_cast<int64_t>(NH)) == 0, "causal_attention: qkv width ",
              C3, " is not 3·NH·HS for NH = ", NH);
  const int64_t HS = C3 / 3 / NH;
  const bool flash = qkv.device().is_cuda() && cuda::flash_attention_supported(HS, qkv.dtype());
  return attention_of(qkv, qkv.shape()[0], qkv.shape()[1], NH, NH, HS, flash, segments);
}

Var causal_attention_gqa(const Var& qkv, int NH, int NKV, int HS, const Tensor& segments) {
  GTRON_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0, "causal_attention_gqa: NKV = ", NKV,
              " k/v heads must divide NH = ", NH, " query heads");
  GTRON_CHECK(HS > 0 && HS % 2 == 0, "causal_attention_gqa: head size ", HS,
              " must be even and > 0 (RoPE rotates pairs)");
  GTRON_CHECK(qkv.shape().rank() == 3, "causal_attention_gqa: qkv ", qkv.shape().str(),
              ", expected [B, T, (NH + 2·NKV)·HS]");
  const int64_t B = qkv.shape()[0];
  const int64_t Tlen = qkv.shape()[1];
  check_shape("causal_attention_gqa: qkv", qkv.shape(),
              Shape{B, Tlen, (NH + 2 * int64_t{NKV}) * HS});
  const bool flash = qkv.device().is_cuda() && cuda::flash_attention_supported(HS, qkv.dtype());
  return attention_of(qkv, B, Tlen, NH, NKV, HS, flash, segments);
}

bool rope_rotated_input_supported(const Var& qkv, int HS) {
  return qkv.device().is_cuda() && qkv.shape().rank() == 3 &&
         cuda::flash_attention_supported(HS, qkv.dtype());
}

Var causal_attention_gqa_rope(const Var& qkv, const Tensor& inv_freq, int NH, int NKV, int HS,
                              int64_t pos0, bool rotated, const Tensor& segments) {
  const bool flash = rope_rotated_input_supported(qkv, HS);
  GTRON_CHECK(flash || !rotated,
              "causal_attention_gqa_rope: pre-rotated q and k need the flash path (CUDA, [B, T, W] "
              "rows, a supported head size); got ",
              qkv.device().str(), " ", qkv.shape().str(), ", HS ", HS);
  if (!flash) {
    return causal_attention_gqa(rope(qkv, inv_freq, NH, NKV, HS, pos0), NH, NKV, HS, segments);
  }
  GTRON_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0, "causal_attention_gqa_rope: NKV = ", NKV,
              " k/v heads must divide NH = ", NH, " query heads");
  const int64_t B = qkv.shape()[0];
  const int64_t Tlen = qkv.shape()[1];
  check_shape("causal_attention_gqa_rope: qkv", qkv.shape(),
              Shape{B, Tlen, (NH + 2 * int64_t{NKV}) * HS});
  check_shape("causal_attention_gqa_rope: inv_freq", inv_freq.shape(), Shape{HS / 2});
  GTRON_CHECK(inv_freq.device() == qkv.device() && inv_freq.dtype() == DType::kF32,
              "causal_attention_gqa_rope: inv_freq must be rope_table's f32 table on ",
              qkv.device().str());
  GTRON_CHECK(pos0 >= 0 && pos0 + Tlen <= (int64_t{1} << 24),
              "causal_attention_gqa_rope: positions up to ", pos0 + Tlen, " are not exact in fp32");
  const FlashRope r{inv_freq, pos0, rotated};
  return attention_of(qkv, B, Tlen, NH, NKV, HS, /*flash=*/true, segments, &r);
}

}  // namespace gtron
