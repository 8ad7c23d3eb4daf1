// The kernels of the CUDA-IPC communicator (parallel/ipc_communicator.h): launchers only, no CUDA
// headers. Every launcher takes the cudaStream_t as void* and checks its launch.
//
// Note [IPC arena]
// Each rank of an IPC communicator owns one arena (cudaMalloc), opened by every peer through CUDA
// IPC, laid out identically on every rank (symmetric offsets):
//   [0, kIpcFlagBytes)       flags: word 0 `arrive`, the last barrier this rank reached (peers read
//                            it); word 1 `epoch`, the barriers this rank has passed (its own);
//   slot 0, slot 1           two staging slots of `slot_bytes` each, at kIpcFlagBytes and
//                            kIpcFlagBytes + slot_bytes.
// A collective (or each chunk of a large one) is three launches on the communicator's stream:
//   stage    copies this rank's input into its slot (epoch + 1) & 1;
//   barrier  epoch += 1; arrive = epoch (system-scope release); then waits until every peer's
//            arrive >= epoch (system-scope acquire), for at most `timeout_ns`;
//   consume  reads the peers' slot epoch & 1 (gather, reduce in rank order 0..P-1, or copy).
// Every counter lives in device memory and is advanced by the kernels, so a captured graph that
// replays the three launches stays correct. Two slots make one barrier per collective enough: a
// peer writes slot s again two barriers later, and it can pass the barrier in between only after
// this rank arrived there, which is after this rank's consume of slot s (stream order).
//
// Note [IPC bounded wait]
// A barrier that waits longer than `timeout_ns` for peer p writes {1, p} into `error` (host-mapped
// memory the host reads without a sync) and returns. Every later barrier sees the error and
// returns at once; the host turns it into CommError at the next collective or wait. The data of a
// failed collective is garbage; the communicator is broken from then on.
//
// Note [IPC all_to_all]
// An all-to-all-v cannot be stage, barrier, consume in host-counted chunks: rank p knows only
// the counts it sends and receives, not how much its peers exchange with each other, so no rank
// can tell the host how many chunks (barriers) the largest pair needs. It is one launch instead,
// a single block that runs its own rounds:
//   - the slot is cut into P parts of `part` bytes; in round k this rank stages bytes
//     [k·part, (k + 1)·part) of its block for rank q into part q of slot (epoch + 1) & 1;
//   - it arrives as the barrier kernel does (epoch += 1, arrive = epoch); in round 0 it first
//     writes the rounds it needs, ceil(largest block sent or received / part), into
//     need[epoch & 1] of its flags; after the wait every rank takes the maximum over all ranks'
//     words, so every rank runs the same rounds and passes the same barriers;
//   - after the wait it copies bytes [k·part, (k + 1)·part) of rank q's part `rank` into its
//     block from q (the block to itself is copied straight from the input, in round 0).
// Rounds are separated by the barrier as the two-slot argument of Note [IPC arena] asks: every
// thread's reads of round k end (__syncthreads) before thread 0 arrives at round k + 1. `need`
// has one word per parity for the same reason: a peer writes need[e & 1] again only at barrier
// e + 2, which it passes after this rank read the word. The counters advance on the device, so
// later collectives and graph replays stay in step whatever the round count. The cost: one block
// moves the data (one SM's bandwidth), fine for the routed rows of a mixture of experts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gtron::parallel::ipc {

constexpr int kMaxRanks = 8;
constexpr size_t kIpcFlagBytes = 256;

// Every rank's arena base in this process's address space, by rank (own included).
struct Peers {
  char* base[kMaxRanks] = {};
};

// Where a barrier's timeout is reported: host-mapped memory (Note [IPC bounded wait]).
struct ErrorWord {
  int code;  // 0: fine; 1: a peer did not arrive in time
  int peer;  // the rank that did not arrive
};

enum class Dtype { kF32, kBF16, kF64, kI32 };
enum class Op { kSum, kMax };

// Copies `rows` rows of `row_bytes` bytes (source pitch `src_pitch` bytes) into this rank's next
// slot, back to back. REQUIRES: rows * row_bytes <= slot_bytes.
void stage(const Peers& peers, int rank, size_t slot_bytes, const void* src, size_t src_pitch,
           size_t row_bytes, int rows, void* stream);

// The barrier of Note [IPC arena]; see Note [IPC bounded wait] for `timeout_ns` and `error`.
void barrier(const Peers& peers, int rank, int size, int64_t timeout_ns, ErrorWord* error,
             void* stream);

// Row k of dst (at dst + k * dst_pitch) = bytes [0, row_bytes) of rank first + k's current slot,
// for k in [0, count).
void gather(const Peers& peers, int rank, int first, int count, size_t slot_bytes, void* dst,
            size_t dst_pitch, size_t row_bytes, void* stream);

// dst[i] = op over r = 0, 1, ..., size − 1 of element `offset + i` of rank r's source, for i in
// [0, n): bf16 accumulates in fp32 and rounds once; the same order on every rank. The source is
// rank r's current slot when slot_bytes > 0, else `peers` are the sources themselves (a window:
// parallel/ipc_communicator.h).
void reduce(const Peers& peers, int rank, int size, size_t slot_bytes, int64_t offset, void* dst,
            int64_t n, Dtype dtype, Op op, void* stream);

// The bytes rank `rank` exchanges in one all_to_all (Note [IPC all_to_all]), by peer: block q of
// `in` is [send_off[q], send_off[q] + send_bytes[q]), the block from q lands at out + recv_off[q].
struct AllToAllPlan {
  int64_t send_off[kMaxRanks] = {}, send_bytes[kMaxRanks] = {};
  int64_t recv_off[kMaxRanks] = {}, recv_bytes[kMaxRanks] = {};
};

// Note [IPC all_to_all]. REQUIRES: the peers' plans agree (recv_bytes[q] here == send_bytes[rank]
// on q); `in` and `out` do not overlap.
void all_to_all(const Peers& peers, int rank, int size, size_t slot_bytes, const void* in,
                void* out, const AllToAllPlan& plan, int64_t timeout_ns, ErrorWord* error,
                void* stream);

}  // namespace gtron::parallel::ipc
