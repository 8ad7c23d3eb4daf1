#include "parallel/cuda_comm.h"

#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "model/cuda/check.h"

namespace gtron::parallel {
namespace {

cudaStream_t as_stream(void* p) { return static_cast<cudaStream_t>(p); }

// Where a timed interval goes: the collective kinds, then the caller's waits.
constexpr int kExposed = 5;

}  // namespace

// Event pairs (timing events, reused through a free list) waiting to be read.
class CommTimer {
 public:
  explicit CommTimer(Device device) : device_(device) {}
  ~CommTimer() {
    for (const Pair& p : pending_) {
      cudaEventDestroy(p.a);
      cudaEventDestroy(p.b);
    }
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  // Records the pair's start on `stream`; finish() records its end.
  size_t start(cudaStream_t stream, int kind) {
    Pair p{event(), event(), kind};
    CUDA_CHECK(cudaEventRecord(p.a, stream));
    pending_.push_back(p);
    return pending_.size() - 1;
  }
  void finish(size_t i, cudaStream_t stream) { CUDA_CHECK(cudaEventRecord(pending_[i].b, stream)); }
  CommTiming take() {
    for (const Pair& p : pending_) {
      CUDA_CHECK(cudaEventSynchronize(p.b));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, p.a, p.b));
      double* slot[] = {&totals_.all_gather_ms, &totals_.reduce_scatter_ms, &totals_.all_reduce_ms,
                        &totals_.broadcast_ms,  &totals_.all_to_all_ms,     &totals_.exposed_ms};
      *slot[p.kind] += ms;
      if (p.kind != kExposed) ++totals_.collectives;
      free_.push_back(p.a);
      free_.push_back(p.b);
    }
    pending_.clear();
    CommTiming out = totals_;
    totals_ = CommTiming();
    return out;
  }

 private:
  struct Pair {
    cudaEvent_t a, b;
    int kind;
  };
  cudaEvent_t event() {
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    CUDA_CHECK(cudaSetDevice(device_.index));
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  Device device_;
  std::vector<Pair> pending_;
  std::vector<cudaEvent_t> free_;
  CommTiming totals_;
};

namespace {

// An event recorded after the collective; holds the collective's tensors until released.
class CudaCompletion final : public Completion {
 public:
  CudaCompletion(Device device, std::vector<Tensor> keep, std::shared_ptr<CommTimer> timer,
                 std::function<void()> check)
      : keep_(std::move(keep)), timer_(std::move(timer)), check_(std::move(check)) {
    CUDA_CHECK(cudaSetDevice(device.index));
    CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~CudaCompletion() override { cudaEventDestroy(event_); }

  cudaEvent_t event() const { return event_; }

  void wait(Stream& stream) override {
    GTRON_CHECK(stream.device().is_cuda(), "a GPU collective's work waited on ",
                stream.device().str(), "; use synchronize() to wait on the host");
    const bool timed = timer_ != nullptr && !stream.capturing();
    const size_t pair = timed ? timer_->start(as_stream(stream.native()), kExposed) : 0;
    CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream.native()), event_, 0));
    if (timed) timer_->finish(pair, as_stream(stream.native()));
  }
  void synchronize() override {
    CUDA_CHECK(cudaEventSynchronize(event_));
    if (check_) check_();
  }
  bool done() override {
    cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) return false;
    CUDA_CHECK(err);
    if (check_) check_();
    return true;
  }

 private:
  cudaEvent_t event_ = nullptr;
  std::vector<Tensor> keep_;
  std::shared_ptr<CommTimer> timer_;  // null: untimed
  std::function<void()> check_;       // empty: nothing can fail after launch
};

}  // namespace

CudaCommunicator::CudaCommunicator(Device device)
    : device_(device), stream_(device), ready_(device) {
  GTRON_CHECK(device.is_cuda(), "a GPU communicator needs a CUDA device, got ", device.str());
}

CudaCommunicator::~CudaCommunicator() {
  cudaSetDevice(device_.index);
  stream_.synchronize();
}

Work CudaCommunicator::launch(const Tensor& a, const Tensor& b, CollectiveKind kind,
                              const std::function<void(void* stream)>& call,
                              std::function<void()> check) {
  CUDA_CHECK(cudaSetDevice(device_.index));
  Stream& caller = current_stream(device_);
  ready_.record(caller);
  ready_.wait(stream_);
  std::shared_ptr<CommTimer> timer = caller.capturing() ? nullptr : timer_;
  cudaStream_t s = as_stream(stream_.native());
  const size_t pair = timer ? timer->start(s, static_cast<int>(kind)) : 0;
  call(s);
  if (timer) timer->finish(pair, s);
  auto completion =
      std::make_shared<CudaCompletion>(device_, std::vector<Tensor>{a, b}, timer, std::move(check));
  CUDA_CHECK(cudaEventRecord(completion->event(), s));
  // Note [eager collectives around graphs]
  if (caller.capturing()) {
    captured_ = true;
  } else if (captured_) {
    CUDA_CHECK(cudaStreamWaitEvent(as_stream(caller.native()), completion->event(), 0));
  }
  return Work(completion);
}

void CudaCommunicator::set_timing(bool on) {
  if (on && !timer_) timer_ = std::make_shared<CommTimer>(device_);
  if (!on) timer_.reset();
}

CommTiming CudaCommunicator::take_timing() { return timer_ ? timer_->take() : CommTiming(); }

}  // namespace gtron::parallel
