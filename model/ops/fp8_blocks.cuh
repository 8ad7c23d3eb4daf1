// The 128x128 weight block of the FP8 recipe (Note [fp8 recipe] in model/ops/fp8.h) as a CTA of
// 512 threads holds it, and its coding: the quantizer fp8_quantize_blocks (fp8_cuda.cu) loads a
// block of w and codes it; AdamW's fused update (trainer/optimizer_cuda.cu, Note [fp8 codes from
// the update] in trainer/optimizer_cuda.h) updates a block of the master and codes the new values,
// through the same function: the same codes and scales bit for bit.
//
// The layout: warp w takes rows 8w .. 8w + 7 of the block, lane l columns 4l .. 4l + 3 of each (a
// warp reads a 512-byte fp32 row at once). The block's amax goes through the warps' shuffles and
// 16 floats of shared memory; q is stored from registers (4 codes a lane, a warp a 128-byte row);
// the codes also go to shared memory, word c of row r at c ^ 2·(r / 8 % 16), from which thread t
// reads word t / 16 of rows 8·(t % 16) .. + 7 (conflict-free), transposes the 4x4 bytes twice and
// stores 8 codes of each of its 4 qt rows (16 lanes fill a 128-byte line).
#pragma once

#include <cstdint>

#include "model/ops/fp8_tile.cuh"

namespace gtron::cuda {

constexpr int kBlockThreads = 512;
constexpr int kBlockTile = 128;  // fp8::kTile (fp8_cuda.cu checks it)

// out[m] = byte m of each of a[0..3] (a[i]'s in byte i): a 4x4 byte transpose.
__device__ __forceinline__ void transpose4x4(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t (&out)[4]) {
  const uint32_t t0 = __byte_perm(a0, a1, 0x5140), t1 = __byte_perm(a2, a3, 0x5140);
  const uint32_t t2 = __byte_perm(a0, a1, 0x7362), t3 = __byte_perm(a2, a3, 0x7362);
  out[0] = __byte_perm(t0, t1, 0x5410);
  out[1] = __byte_perm(t0, t1, 0x7632);
  out[2] = __byte_perm(t2, t3, 0x5410);
  out[3] = __byte_perm(t2, t3, 0x7632);
}

// Where block (blockIdx.y, blockIdx.x) of w[N, K] sits and what this thread holds of it.
struct BlockPlace {
  int64_t N, K, n0, k0;
  int rows, cols;  // of the block inside w (edges: fewer than 128)
  int lane, warp;
  int ncols;   // of this lane's 4 columns, in the block
  int64_t at;  // w's index of row 8·warp, this lane's first column
  __device__ __forceinline__ BlockPlace(int64_t n, int64_t k, int64_t by, int64_t bx)
      : N(n), K(k), n0(by * kBlockTile), k0(bx * kBlockTile) {
    rows = static_cast<int>(min(static_cast<int64_t>(kBlockTile), N - n0));
    cols = static_cast<int>(min(static_cast<int64_t>(kBlockTile), K - k0));
    lane = threadIdx.x & 31;
    warp = threadIdx.x / 32;
    ncols = min(max(cols - 4 * lane, 0), 4);
    at = (n0 + 8 * warp) * K + k0 + 4 * lane;
  }
  // How many of row j's (0-7) four values this thread holds.
  __device__ __forceinline__ int count(int j) const { return 8 * warp + j < rows ? ncols : 0; }
};

// Codes the block whose values this thread holds in v (v[j] = row 8·warp + j, its 4 columns; zeros
// outside w) into q [N, K], qt [K, N] (either may be null) and the blocks-layout scales s, st:
// fp8_quantize_blocks' codes. kVec: 4-byte stores into q (K % 4 == 0, q 4-byte aligned); qt_vec:
// 8-byte stores into qt (N % 8 == 0, qt 8-byte aligned). All 512 threads call it;
// `block_row`/`block_col` are the block's indices (by, bx). Uses two __syncthreads.
template <bool kVec>
__device__ __forceinline__ void code_block(const float (&v)[8][4], const BlockPlace& b,
                                           int64_t block_row, int64_t block_col,
                                           uint8_t* __restrict__ q, float* __restrict__ s,
                                           uint8_t* __restrict__ qt, float* __restrict__ st,
                                           bool qt_vec) {
  __shared__ uint32_t codes[kBlockTile][kBlockTile / 4];
  __shared__ float warp_max[kBlockThreads / 32];
  const int lane = b.lane, warp = b.warp;
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int m = 0; m < 4; ++m) amax = e4m3_absmax(amax, v[j][m]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = e4m3_absmax(amax, __shfl_xor_sync(~0u, amax, o));
  if (lane == 0) warp_max[warp] = amax;
  __syncthreads();
  amax = warp_max[lane % 16];
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = e4m3_absmax(amax, __shfl_xor_sync(~0u, amax, o));
  const E4M3Scale t(amax);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int r = 8 * warp + j;
    const uint32_t c = t.encode4(v[j][0], v[j][1], v[j][2], v[j][3]);
    codes[r][lane ^ (2 * warp)] = c;
    if (q == nullptr || r >= b.rows) continue;
    uint8_t* dst = q + b.at + j * b.K;
    if (kVec && b.ncols == 4) {
      *reinterpret_cast<uint32_t*>(dst) = c;
    } else {
      for (int m = 0; m < b.ncols; ++m) dst[m] = static_cast<uint8_t>(c >> (8 * m));
    }
  }
  const int64_t tiles_n = (b.N + kBlockTile - 1) / kBlockTile;
  const int64_t tiles_k = (b.K + kBlockTile - 1) / kBlockTile;
  const int64_t ld = (tiles_k + 3) / 4 * 4, ld_t = (tiles_n + 3) / 4 * 4;
  if (threadIdx.x == 0) {
    if (s != nullptr) {
      s[block_row * ld + block_col] = t.scale();
      if (block_col == tiles_k - 1)
        for (int64_t j = tiles_k; j < ld; ++j) s[block_row * ld + j] = 0.0f;
    }
    if (st != nullptr) {
      st[block_col * ld_t + block_row] = t.scale();
      if (block_row == tiles_n - 1)
        for (int64_t j = tiles_n; j < ld_t; ++j) st[block_col * ld_t + j] = 0.0f;
    }
  }
  if (qt == nullptr) return;
  __syncthreads();
  // Thread t: qt rows (w's columns) 4·group + m, their elements (w's rows) 8·part + i.
  const int group = threadIdx.x / 16, part = threadIdx.x % 16;
  uint32_t a[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = codes[8 * part + i][group ^ (2 * part)];
  uint32_t lo[4], hi[4];
  transpose4x4(a[0], a[1], a[2], a[3], lo);
  transpose4x4(a[4], a[5], a[6], a[7], hi);
  const int r = 8 * part;
  if (r >= b.rows) return;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int c = 4 * group + m;
    if (c >= b.cols) break;
    uint8_t* dst = qt + (b.k0 + c) * b.N + b.n0 + r;
    if (qt_vec) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(lo[m], hi[m]);
    } else {
      for (int i = 0; i < min(8, b.rows - r); ++i)
        dst[i] = static_cast<uint8_t>((i < 4 ? lo[m] : hi[m]) >> (8 * (i % 4)));
    }
  }
}

}  // namespace gtron::cuda
