// Kernels of the CUDA-IPC communicator: stage, barrier, gather, reduce (Note [IPC arena] in
// parallel/ipc_kernels.h) and the one-launch all_to_all (Note [IPC all_to_all]). Peers' slots are
// read with ld.global.cg (L2, not L1): another process wrote them, and the L1 of this SM may hold
// an older line of the same slot.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "model/cuda/check.h"
#include "model/cuda/kernel_util.cuh"
#include "parallel/ipc_kernels.h"

namespace gtron::parallel::ipc {
namespace {

using cuda::bf16;
using cuda::ceil_div;

__device__ __forceinline__ uint64_t* flag_arrive(char* base) {
  return reinterpret_cast<uint64_t*>(base);
}
// Written by this rank's barrier kernel, read by its next launches: volatile, never a stale line.
__device__ __forceinline__ volatile uint64_t* flag_epoch(char* base) {
  return reinterpret_cast<volatile uint64_t*>(base) + 1;
}
// need[parity]: the rounds this rank's all_to_all at a barrier of that parity asks for.
__device__ __forceinline__ volatile int64_t* flag_need(char* base, uint64_t parity) {
  return reinterpret_cast<volatile int64_t*>(base) + 2 + (parity & 1);
}
// Slot `parity` of an arena.
__device__ __forceinline__ char* slot(char* base, uint64_t parity, size_t slot_bytes) {
  return base + kIpcFlagBytes + (parity & 1) * slot_bytes;
}

__device__ __forceinline__ void store_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int64_t global_ns() {
  int64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Row copy in units of U (the widest the pointers and sizes allow), grid-stride over rows × units.
template <typename U>
__global__ void stage_kernel(Peers peers, int rank, size_t slot_bytes, const char* src,
                             size_t src_pitch, size_t row_bytes, int rows) {
  char* dst = slot(peers.base[rank], *flag_epoch(peers.base[rank]) + 1, slot_bytes);
  const size_t per_row = row_bytes / sizeof(U);
  const size_t total = per_row * static_cast<size_t>(rows);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / per_row, k = i % per_row;
    reinterpret_cast<U*>(dst + r * row_bytes)[k] =
        reinterpret_cast<const U*>(src + r * src_pitch)[k];
  }
}

// Waits until peer p's arrive reaches `target`, for at most timeout_ns (Note [IPC bounded wait]);
// false if this wait or another of this rank's failed.
__device__ bool wait_arrival(char* peer_base, int p, uint64_t target, int64_t timeout_ns,
                             volatile ErrorWord* err) {
  const uint64_t* arrive = flag_arrive(peer_base);
  const int64_t start = global_ns();
  while (load_acquire_sys(arrive) < target) {
    if (err->code != 0) return false;  // another wait of this rank timed out already
    if (global_ns() - start > timeout_ns) {
      err->peer = p;
      __threadfence_system();
      err->code = 1;
      __threadfence_system();
      return false;
    }
    __nanosleep(200);
  }
  return true;
}

// One block; thread 0 advances the counters, threads [0, size) wait for one peer each.
__global__ void barrier_kernel(Peers peers, int rank, int size, int64_t timeout_ns,
                               ErrorWord* error) {
  __shared__ uint64_t target;
  volatile ErrorWord* err = error;
  if (threadIdx.x == 0) {
    target = 0;
    if (err->code == 0) {
      const uint64_t e = *flag_epoch(peers.base[rank]) + 1;
      *flag_epoch(peers.base[rank]) = e;
      __threadfence_system();  // the stage's writes before the arrival
      store_release_sys(flag_arrive(peers.base[rank]), e);
      target = e;
    }
  }
  __syncthreads();
  const int p = threadIdx.x;
  if (target == 0 || p >= size || p == rank) return;
  wait_arrival(peers.base[p], p, target, timeout_ns, err);
}

template <typename U>
__global__ void gather_kernel(Peers peers, int rank, int first, int count, size_t slot_bytes,
                              char* dst, size_t dst_pitch, size_t row_bytes) {
  const uint64_t parity = *flag_epoch(peers.base[rank]);
  const size_t per_row = row_bytes / sizeof(U);
  const size_t total = per_row * static_cast<size_t>(count);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / per_row, k = i % per_row;
    const U* src = reinterpret_cast<const U*>(slot(peers.base[first + r], parity, slot_bytes));
    reinterpret_cast<U*>(dst + r * dst_pitch)[k] = __ldcg(src + k);
  }
}

template <typename T>
struct Acc {
  using type = T;
};
template <>
struct Acc<bf16> {
  using type = float;
};

template <typename T>
__device__ __forceinline__ typename Acc<T>::type widen(T v) {
  return v;
}
template <>
__device__ __forceinline__ float widen(bf16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T narrow(typename Acc<T>::type v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 narrow<bf16>(float v) {
  return __float2bfloat16_rn(v);
}
template <typename T>
__device__ __forceinline__ T load_cg(const T* p) {
  return __ldcg(p);
}
template <>
__device__ __forceinline__ bf16 load_cg(const bf16* p) {
  const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(p));
  return __ushort_as_bfloat16(bits);
}

template <typename T, bool kMax>
__global__ void reduce_kernel(Peers peers, int rank, int size, size_t slot_bytes, int64_t offset,
                              T* dst, int64_t n) {
  // Each rank's source: its current slot, or (slot_bytes = 0) its window itself.
  __shared__ const T* src[kMaxRanks];
  if (threadIdx.x < size) {
    char* base = peers.base[threadIdx.x];
    if (slot_bytes > 0) base = slot(base, *flag_epoch(peers.base[rank]), slot_bytes);
    src[threadIdx.x] = reinterpret_cast<const T*>(base) + offset;
  }
  __syncthreads();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    using A = typename Acc<T>::type;
    A acc = widen(load_cg(src[0] + i));
    for (int r = 1; r < size; ++r) {
      const A v = widen(load_cg(src[r] + i));
      acc = kMax ? (v > acc ? v : acc) : acc + v;
    }
    dst[i] = narrow<T>(acc);
  }
}

// `bytes` (a multiple of sizeof(U)) from src to dst by the block's threads; peers' memory through
// L2 (ld.global.cg).
template <typename U, bool kFromPeer>
__device__ __forceinline__ void block_copy(char* dst, const char* src, int64_t bytes) {
  const U* s = reinterpret_cast<const U*>(src);
  U* d = reinterpret_cast<U*>(dst);
  for (int64_t i = threadIdx.x; i < bytes / static_cast<int64_t>(sizeof(U)); i += blockDim.x) {
    d[i] = kFromPeer ? __ldcg(s + i) : s[i];
  }
}

// Bytes [k·part, (k + 1)·part) of a block of `bytes`: their count (0 past the end).
__device__ __forceinline__ int64_t piece(int64_t bytes, int64_t k, int64_t part) {
  const int64_t left = bytes - k * part;
  return left <= 0 ? 0 : (left < part ? left : part);
}

// Note [IPC all_to_all]: one block, `rounds` of stage, arrive/wait, consume.
template <typename U>
__global__ void all_to_all_kernel(Peers peers, int rank, int size, size_t slot_bytes,
                                  const char* in, char* out, AllToAllPlan plan, int64_t timeout_ns,
                                  ErrorWord* error) {
  __shared__ uint64_t epoch0;            // this rank's epoch before the call
  __shared__ unsigned long long rounds;  // grows to the maximum over ranks in round 0
  __shared__ int broken;
  volatile ErrorWord* err = error;
  char* mine = peers.base[rank];
  const int64_t part = static_cast<int64_t>(slot_bytes / size) / 16 * 16;
  int64_t own_rounds = 0;  // thread 0: the rounds this rank's blocks need
  if (threadIdx.x == 0) {
    epoch0 = *flag_epoch(mine);
    int64_t largest = 0;
    for (int q = 0; q < size; ++q) {
      if (q == rank) continue;
      if (plan.send_bytes[q] > largest) largest = plan.send_bytes[q];
      if (plan.recv_bytes[q] > largest) largest = plan.recv_bytes[q];
    }
    own_rounds = largest > part ? (largest + part - 1) / part : 1;
    rounds = static_cast<unsigned long long>(own_rounds);
    broken = err->code != 0;
  }
  __syncthreads();
  if (broken) return;
  block_copy<U, false>(out + plan.recv_off[rank], in + plan.send_off[rank], plan.send_bytes[rank]);
  for (int64_t k = 0; k < static_cast<int64_t>(rounds); ++k) {
    const uint64_t e = epoch0 + static_cast<uint64_t>(k) + 1;
    char* staged = slot(mine, e, slot_bytes);
    for (int q = 0; q < size; ++q) {
      if (q == rank) continue;
      block_copy<U, false>(staged + q * part, in + plan.send_off[q] + k * part,
                           piece(plan.send_bytes[q], k, part));
    }
    __threadfence_system();  // every thread's staging before the arrival
    __syncthreads();
    if (threadIdx.x == 0) {
      if (k == 0) *flag_need(mine, e) = own_rounds;
      *flag_epoch(mine) = e;
      __threadfence_system();
      store_release_sys(flag_arrive(mine), e);
    }
    const int p = threadIdx.x;
    if (p < size && p != rank && wait_arrival(peers.base[p], p, e, timeout_ns, err) && k == 0) {
      atomicMax(&rounds, static_cast<unsigned long long>(*flag_need(peers.base[p], e)));
    }
    __syncthreads();
    if (threadIdx.x == 0) broken = err->code != 0;
    __syncthreads();
    if (broken) return;
    for (int q = 0; q < size; ++q) {
      if (q == rank) continue;
      block_copy<U, true>(out + plan.recv_off[q] + k * part,
                          slot(peers.base[q], e, slot_bytes) + rank * part,
                          piece(plan.recv_bytes[q], k, part));
    }
    __syncthreads();  // this round's reads end before the next arrival
  }
}

unsigned blocks_for(size_t work) {
  return static_cast<unsigned>(
      std::min<size_t>(ceil_div<size_t>(std::max<size_t>(work, 1), 256), 132 * 8));
}

// The widest unit of 16, 8, 4, 2 or 1 bytes that divides every argument.
int unit_of(uintptr_t a, uintptr_t b, size_t c, size_t d) {
  const uintptr_t all = a | b | c | d;
  for (int u : {16, 8, 4, 2}) {
    if (all % u == 0) return u;
  }
  return 1;
}

template <template <typename> class Kernel, typename... Args>
void launch_by_unit(int unit, unsigned blocks, cudaStream_t s, Args... args) {
  switch (unit) {
    case 16:
      Kernel<uint4>::launch(blocks, s, args...);
      break;
    case 8:
      Kernel<uint2>::launch(blocks, s, args...);
      break;
    case 4:
      Kernel<uint32_t>::launch(blocks, s, args...);
      break;
    case 2:
      Kernel<uint16_t>::launch(blocks, s, args...);
      break;
    default:
      Kernel<uint8_t>::launch(blocks, s, args...);
  }
}

template <typename U>
struct Stage {
  template <typename... Args>
  static void launch(unsigned blocks, cudaStream_t s, Args... args) {
    stage_kernel<U><<<blocks, 256, 0, s>>>(args...);
  }
};
template <typename U>
struct Gather {
  template <typename... Args>
  static void launch(unsigned blocks, cudaStream_t s, Args... args) {
    gather_kernel<U><<<blocks, 256, 0, s>>>(args...);
  }
};

template <typename U>
struct AllToAll {
  template <typename... Args>
  static void launch(unsigned blocks, cudaStream_t s, Args... args) {
    all_to_all_kernel<U><<<blocks, 1024, 0, s>>>(args...);
  }
};

template <typename T>
void launch_reduce(const Peers& peers, int rank, int size, size_t slot_bytes, int64_t offset,
                   void* dst, int64_t n, Op op, cudaStream_t s) {
  const unsigned blocks = blocks_for(static_cast<size_t>(n));
  if (op == Op::kMax) {
    reduce_kernel<T, true>
        <<<blocks, 256, 0, s>>>(peers, rank, size, slot_bytes, offset, static_cast<T*>(dst), n);
  } else {
    reduce_kernel<T, false>
        <<<blocks, 256, 0, s>>>(peers, rank, size, slot_bytes, offset, static_cast<T*>(dst), n);
  }
}

}  // namespace

void stage(const Peers& peers, int rank, size_t slot_bytes, const void* src, size_t src_pitch,
           size_t row_bytes, int rows, void* stream) {
  GTRON_CHECK(rows >= 0 && row_bytes * static_cast<size_t>(rows) <= slot_bytes, "ipc stage: ", rows,
              " rows of ", row_bytes, " bytes exceed a slot of ", slot_bytes);
  if (rows == 0 || row_bytes == 0) return;
  const int unit = unit_of(reinterpret_cast<uintptr_t>(src), src_pitch, row_bytes, slot_bytes);
  launch_by_unit<Stage>(unit, blocks_for(row_bytes / unit * rows),
                        static_cast<cudaStream_t>(stream), peers, rank, slot_bytes,
                        static_cast<const char*>(src), src_pitch, row_bytes, rows);
  CUDA_CHECK_LAUNCH();
}

void barrier(const Peers& peers, int rank, int size, int64_t timeout_ns, ErrorWord* error,
             void* stream) {
  GTRON_CHECK(size >= 1 && size <= kMaxRanks && rank >= 0 && rank < size, "ipc barrier: rank ",
              rank, " of ", size);
  barrier_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(peers, rank, size, timeout_ns,
                                                                  error);
  CUDA_CHECK_LAUNCH();
}

void gather(const Peers& peers, int rank, int first, int count, size_t slot_bytes, void* dst,
            size_t dst_pitch, size_t row_bytes, void* stream) {
  GTRON_CHECK(first >= 0 && count >= 0 && first + count <= kMaxRanks && row_bytes <= slot_bytes,
              "ipc gather: ranks [", first, ", ", first + count, "), ", row_bytes, " bytes");
  if (count == 0 || row_bytes == 0) return;
  const int unit = unit_of(reinterpret_cast<uintptr_t>(dst), dst_pitch, row_bytes, slot_bytes);
  launch_by_unit<Gather>(unit, blocks_for(row_bytes / unit * count),
                         static_cast<cudaStream_t>(stream), peers, rank, first, count, slot_bytes,
                         static_cast<char*>(dst), dst_pitch, row_bytes);
  CUDA_CHECK_LAUNCH();
}

void reduce(const Peers& peers, int rank, int size, size_t slot_bytes, int64_t offset, void* dst,
            int64_t n, Dtype dtype, Op op, void* stream) {
  if (n == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case Dtype::kF32:
      launch_reduce<float>(peers, rank, size, slot_bytes, offset, dst, n, op, s);
      break;
    case Dtype::kBF16:
      launch_reduce<bf16>(peers, rank, size, slot_bytes, offset, dst, n, op, s);
      break;
    case Dtype::kF64:
      launch_reduce<double>(peers, rank, size, slot_bytes, offset, dst, n, op, s);
      break;
    case Dtype::kI32:
      launch_reduce<int32_t>(peers, rank, size, slot_bytes, offset, dst, n, op, s);
      break;
  }
  CUDA_CHECK_LAUNCH();
}

void all_to_all(const Peers& peers, int rank, int size, size_t slot_bytes, const void* in,
                void* out, const AllToAllPlan& plan, int64_t timeout_ns, ErrorWord* error,
                void* stream) {
  GTRON_CHECK(size >= 1 && size <= kMaxRanks && rank >= 0 && rank < size && slot_bytes / size >= 16,
              "ipc all_to_all: rank ", rank, " of ", size, ", slot of ", slot_bytes, " bytes");
  uintptr_t all = reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out);
  for (int q = 0; q < size; ++q) {
    all |= static_cast<uintptr_t>(plan.send_off[q] | plan.send_bytes[q] | plan.recv_off[q] |
                                  plan.recv_bytes[q]);
  }
  launch_by_unit<AllToAll>(unit_of(all, 0, 16, 16), 1, static_cast<cudaStream_t>(stream), peers,
                           rank, size, slot_bytes, static_cast<const char*>(in),
                           static_cast<char*>(out), plan, timeout_ns, error);
  CUDA_CHECK_LAUNCH();
}

}  // namespace gtron::parallel::ipc
