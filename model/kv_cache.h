// Key/value caches for incremental decoding, and the attention of a window of new positions
// against them (generation only: no backward).
//
// Note [decode windows]
// Rows of a decoding batch advance independently (speculative decoding accepts a different number
// of drafts per row), so each row b has its own number of cached positions. One forward pass feeds
// a window of W slots per row: slot i of row b is position start[b] + i for i < count[b]; slots at
// and past count[b] are padding (W is the widest row), computed but never written into a cache and
// never read back. The attention of slot i sees cached positions 0 .. start[b] + min(i,
// count[b]-1): the causal mask aligned to the row's own positions, so a real slot attends exactly
// as the training forward's query at that position does.
//
// Rolling back is free: positions at or past a row's valid length are dead (the next window
// overwrites them before any query reads them), so the caller only moves its own start.
//
// Note [decode RoPE]
// The llama family has no position table: a position enters only through the rotation of q and
// k (model/ops/rope.h). Keys are cached already rotated, each at its absolute position, so a
// cached key never moves again; every window rotates its own q and k at start[b] + i, row by row
// (rows sit at different positions), before cached_attention writes the keys into the cache.
// A window that rewrites rolled-back positions rotates its keys at those same positions, so it
// leaves exactly what a fresh decode would. The rotation of a row depends only on its position,
// so it is the training forward's (causal_attention_gqa_rope at pos0 = 0) bit for bit on the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "model/autograd.h"

namespace gtron {

struct DecodeWindow {
  int64_t width = 0;           // W: slots per row
  std::vector<int64_t> start;  // [B] position of slot 0 of row b
  std::vector<int64_t> count;  // [B] real slots of row b, in [0, W]
  // CUDA: start then count as i32 [2B] on the caches' device, made once per window and shared
  // by its layers (undefined: cached_attention and rope_window make their own copy).
  Tensor device_start_count;

  int64_t rows() const { return static_cast<int64_t>(start.size()); }
  // The position of slot i of row b (padding slots repeat a real one), clamped below Tmax.
  int64_t position(int64_t b, int64_t i, int64_t Tmax) const;
  // start then count as a CPU i32 tensor [2B].
  Tensor start_count_ids() const;
  // device_start_count, or (undefined) a copy of start_count_ids() on s's device.
  Tensor device_extents(Stream& s) const;
};

// The keys and values of one attention layer for B rows of up to Tmax positions (here: what the
// cache holds, at most the model's context length), NKV key/value heads of HS each (GPT-2: NKV =
// NH; the llama family: its n_kv_head, whatever the number of query heads). Allocated once;
// windows write their slots in place.
class KVCache {
 public:
  KVCache(int64_t B, int64_t Tmax, int64_t NKV, int64_t HS, DType dtype, Device device);
  int64_t batch() const { return keys_.dim(0); }
  int64_t capacity() const { return keys_.dim(2); }  // Tmax
  Tensor& keys() { return keys_; }                   // [B, NKV, Tmax, HS]
  Tensor& values() { return values_; }               // [B, NKV, Tmax, HS]

 private:
  Tensor keys_;
  Tensor values_;
};

// qkv: [B, W, (NH + 2·NKV)·HS] of the window's slots: NH query heads, then the cache's NKV key
// heads, then its NKV value heads (causal_attention_gqa's packing; GPT-2's [q | k | v] of 3C is
// its NKV = NH case), NH read off the width. Writes the key and value heads of each real slot
// into `cache` at its position, then returns out [B, W, NH·HS], query head h reading key/value
// head g = h / (NH / NKV):
//   out[b, i, h] = Σ_{s <= last} softmax_s(q[b, i, h]·k[b, s, g] / sqrt(HS)) · v[b, s, g],
//   last = start[b] + min(i, count[b] - 1)   (Note [decode windows]); rows with count 0 give 0.
// CPU (f32, f64) or CUDA (f32, bf16: model/kv_cache_cuda.h). REQUIRES: no grad, qkv and cache
// on one device, NKV divides NH, start[b] + count[b] <= Tmax.
Var cached_attention(const Var& qkv, KVCache& cache, const DecodeWindow& win);

// The llama family's positions in a decode window (Note [decode RoPE]): qkv [B, W, (NH +
// 2·NKV)·HS] with its q and k heads rotated (model/ops/rope.h) at the absolute positions start[b]
// + i of row b's slots, the v heads copied; padding slots are rotated too (nothing reads them).
// inv_freq: the block's rope_table. A new tensor, no grad; CPU (f32, f64) or CUDA (f32, bf16).
Var rope_window(const Var& qkv, const Tensor& inv_freq, int NH, int NKV, int HS,
                const DecodeWindow& win);

namespace cpu {
// kc, vc: [B, NKV, Tmax, HS]; start, count: [B]. See cached_attention.
template <typename T>
void cached_attention_forward(const T* qkv, T* kc, T* vc, T* out, const int64_t* start,
                              const int64_t* count, int64_t B, int64_t W, int64_t Tmax, int64_t NH,
                              int64_t NKV, int64_t HS);
}  // namespace cpu

}  // namespace gtron
