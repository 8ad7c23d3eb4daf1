// The rotation of one rotate-half RoPE pair on CUDA (Note [rotate-half RoPE] in model/ops/rope.h),
// shared by every kernel that rotates (the rope kernels, the q/k norm's fused rotation: Note [RoPE
// in the q/k norm] in model/ops/qk_norm.h), so that they give the same bits.
#pragma once

namespace gtron::cuda {

// θ = pos·inv_freq's sine and cosine, as every rotation here forms them: fp32 with the accurate
// sincosf (θ reaches pos radians, which __sincosf would lose).
__device__ __forceinline__ void rope_angle(float pos, float inv_freq, float* sn, float* cs) {
  sincosf(pos * inv_freq, sn, cs);
}

// The rotation by an angle whose sine and cosine rope_angle formed. Each product is rounded on
// its own (the _rn intrinsics are never contracted into an FMA): left to the compiler, which of
// the two products joins an FMA differed between kernels, and with it the f32 bits.
template <int kSign>
__device__ __forceinline__ void rope_apply(float sn, float cs, float a, float b, float* lo,
                                           float* hi) {
  sn *= kSign;
  *lo = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
  *hi = __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn));
}

// (a, b) = (x_i, x_{i + HS/2}) of a head at position `pos`, frequency `inv_freq` (= inv_freq[i]):
// lo = a·cos θ − b·sin θ, hi = b·cos θ + a·sin θ with θ = pos·inv_freq; kSign = −1 rotates back
// (θ → −θ).
template <int kSign>
__device__ __forceinline__ void rope_rotate(float pos, float inv_freq, float a, float b, float* lo,
                                            float* hi) {
  float sn, cs;
  rope_angle(pos, inv_freq, &sn, &cs);
  rope_apply<kSign>(sn, cs, a, b, lo, hi);
}

}  // namespace gtron::cuda
