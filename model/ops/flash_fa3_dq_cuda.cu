// flash_fa3_backward_dq (model/ops/flash_fa3.h): the FA3 backward with dQ from the key kernel.
//
// Note [ordered dQ in the FA3 backward]
// flash_fa3_backward gets dQ from the wgmma query kernel, which computes S and dP a second time
// (7 products a visible (query, key) pair; Note [dQ in the FlashAttention-3 backward]). Here the
// key kernel (kDq) forms dQ's part from the dS it has already: 5 products. The sums stay
// deterministic because the key blocks add into each query tile in a fixed order, and that order
// is the one in which they get there:
// - Key block j walks the query tiles from its diagonal tile j·128/kQ on, so with every CTA of a
//   head started together tile qt hears from key block qt·kQ/128 first and from key block 0 last.
//   Contributions go in that order (descending j): consumer w of key block j waits until the
//   turn counter of (b, h, qt, w) reads qt·kQ/128 − j, adds (the first one stores, so the sums
//   need no zeroing), and advances the counter. CTA j then waits only for CTA j + 1, which is
//   steps ahead of it on the same tile.
// - Each head's key blocks are launched highest first (blockIdx.x → nkb − 1 − x), so a waiting
//   CTA never waits for one not yet resident: no deadlock at any T. The cost is that the longest
//   CTAs start last (a tail of one key-block-0 walk per grid, against longest-first).
// - Per step the two consumers write their dSᵀ halves (bf16, as the dK product rounds them) into
//   a double-buffered [128 keys, kQ] tile in shared memory and meet at a named barrier over the
//   256 consumer threads (a consumer that skips the tile writes zeros). Consumer w then takes its
//   half of dQ = dS·K, both operands MN-major (keys along their rows): at head size 128 the kQ =
//   64 queries by head columns 64w .., at head size 64 queries 64w .. of kQ = 128 by the 64
//   columns; m64n64 over 128 keys, 32 fp32 a thread, live after Sᵀ and dPᵀ are dead.
// - The sums are fp32 [B, NH, T, HS] in the scratch; a last kernel scales them, rotates them back
//   under RoPE and stores or adds them into dqkv as the query kernel does (store_grad_rows). Δ
//   comes from a kernel of its own first, summed in the query kernel's order, so dK and dV equal
//   flash_fa3_backward's bit for bit (flash_fa3_bwd_cuda_test); dQ differs by its order of sums.
// Document masking shortens the walks (a CTA stops before tiles of later segments), which would
// leave turns untaken, and the column partials of dQ are not formed: both stay with
// flash_fa3_backward. Not yet run on a GPU (2026-12-07).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "model/check.h"
#include "model/cuda/check.h"
#include "model/cuda/kernel_util.cuh"
#include "model/cuda/mma_tile.cuh"
#include "model/ops/flash_common.cuh"
#include "model/ops/flash_fa3.h"

namespace gtron::cuda {

namespace {

constexpr int kDeltaRows = 32;  // rows a Δ block: 4 threads a row

// Δ = rowsum(dO ⊙ O) of the B·NH·T rows ((b·NH + h)·T + t), summed as the wgmma query kernel sums
// it (Note [Δ in the query kernel]: the 4 lanes of a quad take HS/4 columns each, 16-byte chunks
// in order, then a quad sum), so the key kernel's dK is flash_fa3_backward's bit for bit.
template <int HS>
__global__ void __launch_bounds__(4 * kDeltaRows) delta_kernel(FlashBackwardArgs a, float* delta) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kDeltaRows + threadIdx.x / 4;
  const int l = threadIdx.x & 3;
  const bool valid = row < static_cast<int64_t>(a.B) * a.NH * a.T;
  float sum = 0.0f;
  if (valid) {
    const int64_t bh = row / a.T;
    const int t = static_cast<int>(row % a.T), b = static_cast<int>(bh / a.NH);
    const int64_t at = b * a.o_batch + t * a.o_ld + (bh % a.NH) * HS;
    const bf16* dout = static_cast<const bf16*>(a.dout) + at;
    const bf16* out = static_cast<const bf16*>(a.o) + at;
#pragma unroll
    for (int cc = 0; cc < HS / 32; ++cc) {
      const int chunk = (HS / 32) * l + cc;
      float x[8], y[8];
      load_floats<8>(dout + chunk * 8, x);
      load_floats<8>(out + chunk * 8, y);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += x[e] * y[e];
    }
  }
  sum = quad_sum(sum);
  if (valid && l == 0) delta[row] = sum;
}

// dQ rows kRows·blockIdx.x .. of (b, h) = blockIdx.y from the fp32 sums into dqkv: scaled,
// rotated back under kRope, stored or added (store_grad_rows, as the query kernel stores them).
template <int HS, bool kRope>
__global__ void __launch_bounds__(kThreadsFa)
    dq_store_kernel(FlashBackwardArgs a, const float* __restrict__ sums) {
  const int b = static_cast<int>(blockIdx.y) / a.NH, h = static_cast<int>(blockIdx.y) % a.NH;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = static_cast<int>(blockIdx.x) * kRows + warp * 16;
  const float* rows = sums + static_cast<int64_t>(blockIdx.y) * a.T * HS;
  float acc[HS / 8][4];
#pragma unroll
  for (int dt = 0; dt < HS / 8; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = r0 + (lane >> 2) + (e >> 1) * 8, col = dt * 8 + 2 * (lane & 3) + (e & 1);
      acc[dt][e] = row < a.T ? __ldg(rows + static_cast<int64_t>(row) * HS + col) : 0.0f;
    }
  }
  const float sc[2] = {a.scale, a.scale};
  bf16* dq = static_cast<bf16*>(a.dqkv) + b * a.qkv_batch + static_cast<int64_t>(h) * HS;
  store_grad_rows<HS, kRope>(acc, dq, a, b, static_cast<int>(blockIdx.x), h * HS, r0, lane, warp,
                             sc, nullptr, true);
}

int64_t sums_bytes(const FlashBackwardArgs& a) {
  const int64_t bytes = static_cast<int64_t>(a.B) * a.NH * a.T * a.HS * 4;
  return (bytes + 255) / 256 * 256;
}

int64_t turns_bytes(const FlashBackwardArgs& a) {
  const int64_t kq = 8192 / a.HS;
  return static_cast<int64_t>(a.B) * a.NH * ((a.T + kq - 1) / kq) * 2 * 4;
}

template <int HS>
void launch_tail(const FlashBackwardArgs& a, float* delta, float* sums, int* turns,
                 cudaStream_t st) {
  const int64_t rows = static_cast<int64_t>(a.B) * a.NH * a.T;
  delta_kernel<HS>
      <<<static_cast<unsigned>(ceil_div<int64_t>(rows, kDeltaRows)), 4 * kDeltaRows, 0, st>>>(
          a, delta);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemsetAsync(turns, 0, static_cast<size_t>(turns_bytes(a)), st));
  fa3_backward_keys_ordered_dq(a, delta, sums, turns, st);
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(a.T, kRows)),
                  static_cast<unsigned>(a.B * a.NH));
  if (a.rope_inv_freq != nullptr) {
    dq_store_kernel<HS, true><<<grid, kThreadsFa, 0, st>>>(a, sums);
  } else {
    dq_store_kernel<HS, false><<<grid, kThreadsFa, 0, st>>>(a, sums);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

int64_t flash_fa3_backward_dq_scratch_bytes(const FlashBackwardArgs& args) {
  FlashBackwardArgs a = args;
  if (a.NKV == 0) a.NKV = a.NH;
  return sums_bytes(a) + turns_bytes(a);
}

void flash_fa3_backward_dq(const FlashBackwardArgs& args, float* delta, void* scratch,
                           void* stream) {
  const FlashBackwardArgs a = fa3_backward_checked(args, delta);
  GTRON_CHECK(a.seg == nullptr && a.col_partial == nullptr,
              "flash_fa3_backward_dq: no document masking or column partials yet "
              "(flash_fa3_backward takes them)");
  if (static_cast<int64_t>(a.B) * a.NH * a.T == 0) return;
  GTRON_CHECK(scratch != nullptr && is_aligned(scratch, 16),
              "flash_fa3_backward_dq: scratch of flash_fa3_backward_dq_scratch_bytes, 16-byte "
              "aligned");
  auto* sums = static_cast<float*>(scratch);
  auto* turns = reinterpret_cast<int*>(static_cast<char*>(scratch) + sums_bytes(a));
  const auto st = static_cast<cudaStream_t>(stream);
  if (a.HS == 64) {
    launch_tail<64>(a, delta, sums, turns, st);
  } else {
    launch_tail<128>(a, delta, sums, turns, st);
  }
}

}  // namespace gtron::cuda
