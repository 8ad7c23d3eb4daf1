// The rotation of one rotate-half RoPE pair on CUDA (Note [rotate-half RoPE] in model/ops/rope.h),
// shared by every kernel that rotates (the rope kernels, the q/k norm's fused rotation: Note [RoPE
// in the q/k norm] in model/ops/qk_norm.h), so that they give the same bits.
#pragma once

namespace gtron::cuda {

// (a, b) = (x_i, x_{i + HS/2}) of a head at position `pos`, frequency `inv_freq` (= inv_freq[i]):
// lo = a·cos θ − b·sin θ, hi = b·cos θ + a·sin θ with θ = pos·inv_freq; kSign = −1 rotates back
// (θ → −θ). fp32 with the accurate sincosf: θ reaches pos radians, which __sincosf would lose.
template <int kSign>
__device__ __forceinline__ void rope_rotate(float pos, float inv_freq, float a, float b, float* lo,
                                            float* hi) {
  float sn, cs;
  sincosf(pos * inv_freq, &sn, &cs);
  sn *= kSign;
  *lo = a * cs - b * sn;
  *hi = b * cs + a * sn;
}

}  // namespace gtron::cuda
