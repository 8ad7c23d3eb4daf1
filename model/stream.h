// Streams and events: the one abstraction that orders work on both backends.
//
// - A CUDA stream wraps a cudaStream_t; kernels are launched on native().
// - A CPU stream runs a kernel's closure at once (run()) — unless the stream is capturing, then it
//   records the closure, and the recorded list replays later (graphs/ builds on this seam).
// - An Event orders streams: record() on one, wait() on another. On CPU an event can also be
//   completed from another thread (complete()): the Gloo worker does this, so a CPU stream that
//   waits on a collective really blocks until the collective is done.
//
// Thread safety: a Stream is used by one thread at a time; Event methods are thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "model/device.h"

namespace gtron {

class Stream {
 public:
  // Creates a new stream on `device` (CUDA: a non-blocking cudaStream_t).
  explicit Stream(Device device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device device() const { return device_; }
  void* native() const { return native_; }  // cudaStream_t, or nullptr on CPU
  uintptr_t id() const { return reinterpret_cast<uintptr_t>(this); }

  // Runs `fn` now, or records it while capturing. REQUIRES: a CPU stream.
  void run(std::function<void()> fn);
  // Blocks the host until all work queued on the stream is done.
  void synchronize();

  // Capture seam: between begin_capture() and end_capture(), run() records instead of running
  // (CPU). On CUDA only the flag changes: graphs/ drives cudaStreamBeginCapture itself.
  bool capturing() const { return capturing_; }
  void begin_capture();
  std::vector<std::function<void()>> end_capture();

 private:
  Device device_;
  void* native_ = nullptr;
  bool capturing_ = false;
  std::vector<std::function<void()>> recorded_;
};

// The per-device default stream (created on first use, lives for the process).
Stream& default_stream(Device device);

// The stream ops launch on for `device` in this thread: the innermost StreamGuard's stream, else
// the default stream.
Stream& current_stream(Device device);

// Makes `stream` the current stream of its device in this thread for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream* prev_;
  Device device_;
};

class Event {
 public:
  explicit Event(Device device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Marks the point after all work queued so far on `stream`.
  void record(Stream& stream);
  // Makes later work on `stream` wait for the last record(). CPU: blocks (or records the wait).
  void wait(Stream& stream);
  // Blocks the host until the last record() has completed.
  void synchronize();
  // CPU only: an event completed by another thread (collective workers). Arms it first with arm().
  void arm();
  void complete();

 private:
  struct CpuState {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t armed = 0;
    uint64_t done = 0;
  };
  Device device_;
  void* native_ = nullptr;
  std::shared_ptr<CpuState> cpu_;
};

}  // namespace gtron
