// Hopper's tensor-memory-accelerator loads and the synchronization of warp-specialized kernels
// (sm_90a only): TMA tile loads (cp.async.bulk.tensor) and plain bulk copies (cp.async.bulk) that
// complete on a shared-memory mbarrier, the mbarrier operations of a producer/consumer ring, named
// barriers among some of a CTA's warps, and setmaxnreg. Include only from a file compiled for
// sm_90a; the tensor maps are made on the host (cuTensorMapEncodeTiled) and passed as
// __grid_constant__ kernel parameters.
//
// Note [mbarrier phases]
// An mbarrier counts the arrivals of its current phase and, after an expect_tx, the bytes still
// to land; when both are done the phase completes and the next begins, the phases' parity
// alternating 0, 1, 0, ... try_wait.parity(P) is true once the phase of parity P has completed,
// i.e. while the current phase has the other parity. So in a ring whose slot s is filled for the
// k-th time (k = 0, 1, ...):
// - a consumer waits for the k-th fill with parity k & 1 on the slot's full barrier (one
//   arrival, the producer's expect_tx, plus the bytes of the TMA loads);
// - the producer waits before the k-th fill with parity (k & 1) ^ 1 on the slot's empty barrier
//   (one arrival per consumer warp that read the slot): for k = 0 that is the phase before a
//   fresh barrier's first, which try_wait reports as complete, so the first fill does not wait.
// TMA writes and wgmma reads are both the async proxy, and the mbarrier orders them: no proxy
// fence is needed between a load landing and a product reading it, nor between a product's
// wait_group and the arrival that lets the producer overwrite its operands.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "model/cuda/mma_tile.cuh"

namespace gtron::cuda::tma {

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals)
               : "memory");
}

// Makes the mbarrier.init of this thread visible to the async proxy (TMA's complete_tx) and, after
// a CTA barrier, to the other threads.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The producer's arrival on a full barrier, announcing `bytes` that TMA loads will deliver.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
          smem_u32(bar)),
      "r"(bytes)
      : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_u32(bar))
      : "memory");
}

// Spins until the phase of parity `parity` of *bar has completed (Note [mbarrier phases]).
// Without a watchdog: a __trap() after too many tries would turn a broken ring's hang into an
// error, but ptxas (CUDA 13.0) then stops giving the code after a setmaxnreg its budget (the
// FlashAttention-3 forward's consumers spilled 240 bytes at 168 registers, and a test kernel
// after setmaxnreg.dec 24 spilled at 16 live values), so a hang it stays: run with a timeout.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_u32(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (done == 0);
}

__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The box of a 4-d tensor map at coordinates (c0 innermost, .., c3) into shared memory at dst
// (1024-byte aligned for the 128-byte swizzle), completing on *bar. Elements outside the tensor
// land as zeros and count towards the box's bytes.
__device__ __forceinline__ void load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                        int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
      : "memory");
}

// The box of a 2-d tensor map at coordinates (c0 innermost, c1) into shared memory at dst
// (1024-byte aligned for the 128-byte swizzle), completing on *bar: the FP8 code tiles of
// tma::codes_map (model/cuda/tma_map.h).
__device__ __forceinline__ void load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                        int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3}], [%4];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}

// `bytes` contiguous bytes from global memory at src into shared memory at dst, completing on
// *bar (a bulk copy without a tensor map: scale rows). REQUIRES: src and dst 16-byte aligned,
// bytes a multiple of 16.
__device__ __forceinline__ void load_bulk(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// Named barrier `id` (1..15; 0 is __syncthreads') of kThreads threads: bar_sync waits until
// kThreads threads have arrived (itself included), bar_arrive counts this thread and goes on.
// Called by whole warps.
template <int kThreads>
__device__ __forceinline__ void bar_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
template <int kThreads>
__device__ __forceinline__ void bar_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// A warpgroup's registers per thread lowered (dec) or raised (inc) to kRegs, a multiple of 8 in
// [24, 256]; inc waits until the CTA's pool has them. Called by all 128 threads of a warpgroup.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace gtron::cuda::tma
