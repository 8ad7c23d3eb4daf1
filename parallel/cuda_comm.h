// What the GPU backends of Communicator share (NCCL, parallel/nccl_communicator.h, and CUDA IPC,
// parallel/ipc_communicator.h): a stream of their own, the ordering against the caller's stream,
// the Work of a collective (an event recorded after it), and optional timing.
//
// Policy:
// - A collective makes the backend's stream wait the caller's current stream of the device (an
//   event recorded there), runs on it, and records a fresh event after it; the Work waits or
//   queries that event. No host synchronization on the hot path; the calls are graph-capturable.
// - A backend may pass a `check` to launch(): it runs on the host after the Work's event is known
//   to have completed (synchronize(), done()) and throws CommError if the collective failed
//   (the IPC backend's bounded waits report through it).
//
//
// Note [eager collectives around graphs]
// A collective captured into a graph runs, at replay, on the graph's own branch, not on the
// communicator's stream: a replay is ordered after the work of the stream it is launched on and
// nothing else. An eager collective still running on the communicator's stream when a graph that
// holds collectives of the same communicator is replayed would run at the same time as them, in
// an order that differs between ranks (graphs.scope "layers" replays blocks between the eager
// embedding, head and MTP work, whose reduce-scatters finish late by design). So once a
// communicator has had a collective captured, every eager collective of it also makes the caller's
// stream wait for its completion: the next replay on that stream starts after it. Eager
// collectives before any capture, and every collective of a run without graphs, keep their
// overlap with compute.
//
// This header includes no CUDA header: handles are opaque pointers.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "model/stream.h"
#include "model/tensor.h"
#include "parallel/communicator.h"

namespace gtron::parallel {

// Time spent in a communicator's collectives (on its stream) and stalled on them (the caller's
// stream waiting in Work::wait), in milliseconds, measured with CUDA event pairs.
struct CommTiming {
  double all_gather_ms = 0, reduce_scatter_ms = 0, all_reduce_ms = 0, broadcast_ms = 0;
  double all_to_all_ms = 0;
  double exposed_ms = 0;  // caller-stream time blocked in waits: communication not hidden
  int64_t collectives = 0;
};

class CommTimer;  // cuda_comm.cc

enum class CollectiveKind { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kAllToAll };

class CudaCommunicator : public Communicator {
 public:
  // REQUIRES: `device` a CUDA device.
  explicit CudaCommunicator(Device device);
  // Waits for the communicator's stream.
  ~CudaCommunicator() override;
  CudaCommunicator(const CudaCommunicator&) = delete;
  CudaCommunicator& operator=(const CudaCommunicator&) = delete;

  Device device() const override { return device_; }
  // The communicator's own stream (collectives run there).
  Stream& stream() { return stream_; }

  // Timing (off by default): an event pair around every collective and every Work::wait outside
  // graph capture. take_timing() waits for the recorded pairs (a host sync: call it at log time),
  // returns the totals since the last call and resets them.
  void set_timing(bool on);
  CommTiming take_timing();

 protected:
  // Orders the communicator's stream after the caller's, runs `call` on it (the cudaStream_t is
  // passed as void*), and returns a Work that keeps `a` and `b` alive; `check` (may be empty) runs
  // once the Work is known to be complete (see the policy).
  Work launch(const Tensor& a, const Tensor& b, CollectiveKind kind,
              const std::function<void(void* stream)>& call, std::function<void()> check = {});

 private:
  Device device_;
  Stream stream_;
  Event ready_;                       // recorded on the caller's stream before each collective
  std::shared_ptr<CommTimer> timer_;  // null: timing off
  bool captured_ = false;  // a collective was captured (Note [eager collectives around graphs])
};

}  // namespace gtron::parallel
