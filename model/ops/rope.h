// Rotary position embedding (RoPE) in Hugging Face Llama's rotate-half convention, applied to the
// q and k heads of a packed attention projection.
//
// Note [rotate-half RoPE]
// A head vector x of HS (even) elements is split into halves x₁ = x[0, H) and x₂ = x[H, 2H),
// H = HS/2, and pair i = (x₁[i], x₂[i]) is rotated by angle pos·inv_freq[i]:
//   out[i]     = x[i]·cos − x[i + H]·sin
//   out[i + H] = x[i + H]·cos + x[i]·sin
// (Hugging Face's `x·cos + rotate_half(x)·sin`; the GPT-NeoX layout, not the interleaved one of
// the original paper.) The rotation is orthogonal, so the backward is the rotation by −angle:
//   dx[i] = dy[i]·cos + dy[i + H]·sin,   dx[i + H] = dy[i + H]·cos − dy[i]·sin.
// cos and sin are computed on the fly from an inv_freq table (no [T, HS] cos/sin cache to keep in
// step with the positions): angle = float(pos)·inv_freq[i] and sincos in fp32 for f32 and bf16
// (Hugging Face's own fp32 arithmetic: its inv_freq is fp32, its angles an fp32 product), in
// double for the f64 CPU kernel. The product is rounded once, so the angle's absolute error grows
// with pos (~pos·2^-24 rad): the price Hugging Face pays too.
#pragma once

#include <cstdint>
#include <vector>

#include "model/autograd.h"

namespace gtron {

// The "llama3" frequency rewrite (Llama 3.1 and later) of rope_scaling.
struct RopeLlama3Scaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// inv_freq[i] = theta^(-2i/HS) for i < HS/2. With `llama3`, each frequency of wavelength
// λ = 2π/inv_freq is rewritten: λ > original/low_freq_factor: divided by factor; λ <
// original/high_freq_factor: kept; otherwise interpolated, (1 − s)·f/factor + s·f with
// s = (original/λ − low_freq_factor) / (high_freq_factor − low_freq_factor).
// Computed in double (Hugging Face computes it in fp32; rounded to fp32 by rope_table, the two may
// differ by an ulp).
// REQUIRES: HS even and > 0, theta > 1; with llama3, factor > 0 and high > low freq factor.
std::vector<double> rope_inv_freq(int64_t HS, double theta,
                                  const RopeLlama3Scaling* llama3 = nullptr);

// The table rope() reads, [HS/2], as a tensor on `device` for activations in `act`: f32 on CUDA
// (whatever act), act (f32 or f64) on the CPU. Made once by the model, not per call.
Tensor rope_table(const std::vector<double>& inv_freq, Device device, DType act);

// qkv: [B, T, (NH + 2·NKV)·HS] holding q heads, then k heads, then v heads (head j of a part in
// columns [j·HS, (j+1)·HS) of the part). Returns a new tensor of the same shape with every q and
// k head rotated (Note [rotate-half RoPE]) at position pos0 + t, and the v heads copied. pos0 > 0
// places the rows after a cached prefix (generation). Backward accumulates the inverse rotation of
// dq and dk, and dv unchanged, into qkv's gradient.
// REQUIRES: HS even; NH, NKV > 0; inv_freq as made by rope_table for qkv's device and dtype;
// pos0 >= 0 and pos0 + T <= 2^24 (positions exact in fp32).
Var rope(const Var& qkv, const Tensor& inv_freq, int NH, int NKV, int HS, int64_t pos0);

namespace cpu {
// Rows [N = B·T] of W = (NH + 2·NKV)·HS; row r is at position pos0 + r % T. y must not alias x.
template <typename T>
void rope_forward(const T* x, const T* inv_freq, T* y, int64_t B, int64_t Tlen, int64_t NH,
                  int64_t NKV, int64_t HS, int64_t pos0);
// Accumulates dx += Rᵀ·dy (v columns: dx += dy).
template <typename T>
void rope_backward(const T* dy, const T* inv_freq, T* dx, int64_t B, int64_t Tlen, int64_t NH,
                   int64_t NKV, int64_t HS, int64_t pos0);
}  // namespace cpu

namespace cuda {
// The CPU contract, x, y, dy, dx in `act` (f32 or bf16), inv_freq f32, fp32 math, on `stream` (a
// cudaStream_t). The backward accumulates into dx, or writes it with `overwrite`.
void rope_forward(const void* x, const float* inv_freq, void* y, int64_t B, int64_t Tlen,
                  int64_t NH, int64_t NKV, int64_t HS, int64_t pos0, DType act, void* stream);
void rope_backward(const void* dy, const float* inv_freq, void* dx, int64_t B, int64_t Tlen,
                   int64_t NH, int64_t NKV, int64_t HS, int64_t pos0, DType act, void* stream,
                   bool overwrite = false);
// rope_forward with each batch row at its own first position, read on the device: row b's T rows
// at start[b], start[b] + 1, ... (a decode window whose starts a CUDA graph step reads from its
// input buffer, Note [decode graphs] in model/decoder.h). Bit-identical to rope_forward of row b
// alone at pos0 = start[b].
void rope_forward_at(const void* x, const float* inv_freq, void* y, int64_t B, int64_t Tlen,
                     int64_t NH, int64_t NKV, int64_t HS, const int32_t* start, DType act,
                     void* stream);
// rope_forward's rotation of the q and k heads of x in place; the v columns are not touched.
void rope_forward_inplace(void* x, const float* inv_freq, int64_t B, int64_t Tlen, int64_t NH,
                          int64_t NKV, int64_t HS, int64_t pos0, DType act, void* stream);
}  // namespace cuda

}  // namespace gtron
