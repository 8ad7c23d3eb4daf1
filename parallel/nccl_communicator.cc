#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <utility>
#include <vector>

#include "model/cuda/check.h"

// NCCL_CHECK joins the backend-call family of model/cuda/check.h (one failure policy: the call,
// file, line and device, then abort).
#define NCCL_CHECK(expr)                                                    \
  do {                                                                      \
    ncclResult_t res_ = (expr);                                             \
    GTRON_CHECK_CALL(res_ == ncclSuccess, #expr, ncclGetErrorString(res_)); \
  } while (0)

namespace gtron::parallel {
namespace {

ncclComm_t as_comm(void* p) { return static_cast<ncclComm_t>(p); }
cudaStream_t as_stream(void* p) { return static_cast<cudaStream_t>(p); }

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF64:
      return ncclFloat64;
    case DType::kI32:
      return ncclInt32;
  }
  GTRON_CHECK(false, "no NCCL type for ", dtype_name(t));
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

enum TimedKind { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kExposed };

}  // namespace

// Event pairs (timing events, reused through a free list) waiting to be read.
class NcclTimer {
 public:
  explicit NcclTimer(Device device) : device_(device) {}
  ~NcclTimer() {
    for (const Pair& p : pending_) {
      cudaEventDestroy(p.a);
      cudaEventDestroy(p.b);
    }
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  // Records the pair's start on `stream`; finish() records its end.
  size_t start(cudaStream_t stream, TimedKind kind) {
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
                        &totals_.broadcast_ms, &totals_.exposed_ms};
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
    TimedKind kind;
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
class NcclCompletion final : public Completion {
 public:
  NcclCompletion(Device device, std::vector<Tensor> keep, std::shared_ptr<NcclTimer> timer)
      : keep_(std::move(keep)), timer_(std::move(timer)) {
    CUDA_CHECK(cudaSetDevice(device.index));
    CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~NcclCompletion() override { cudaEventDestroy(event_); }

  cudaEvent_t event() const { return event_; }

  void wait(Stream& stream) override {
    GTRON_CHECK(stream.device().is_cuda(), "an NCCL work waited on ", stream.device().str(),
                "; use synchronize() to wait on the host");
    const bool timed = timer_ != nullptr && !stream.capturing();
    const size_t pair = timed ? timer_->start(as_stream(stream.native()), kExposed) : 0;
    CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream.native()), event_, 0));
    if (timed) timer_->finish(pair, as_stream(stream.native()));
  }
  void synchronize() override { CUDA_CHECK(cudaEventSynchronize(event_)); }
  bool done() override {
    cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) return false;
    CUDA_CHECK(err);
    return true;
  }

 private:
  cudaEvent_t event_ = nullptr;
  std::vector<Tensor> keep_;
  std::shared_ptr<NcclTimer> timer_;  // null: untimed
};

}  // namespace

NcclCommunicator::NcclCommunicator(StoreClient& store, const std::string& name, int rank, int size,
                                   Device device)
    : name_(name), rank_(rank), size_(size), device_(device), stream_(device), ready_(device) {
  GTRON_CHECK(device.is_cuda(), "an NCCL communicator needs a CUDA device, got ", device.str());
  GTRON_CHECK(size >= 1 && rank >= 0 && rank < size, "communicator '", name, "': rank ", rank,
              " of ", size);
  ncclUniqueId id;
  const std::string key = name + "/nccl_id";
  if (rank == 0) {
    NCCL_CHECK(ncclGetUniqueId(&id));
    store.set(key, std::string(id.internal, sizeof id.internal));
  } else {
    std::string bytes = store.get(key);
    GTRON_CHECK(bytes.size() == sizeof id.internal, "NCCL id of ", bytes.size(), " bytes");
    std::copy(bytes.begin(), bytes.end(), id.internal);
  }
  CUDA_CHECK(cudaSetDevice(device.index));
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank));
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device_.index);
  stream_.synchronize();
  if (comm_ != nullptr) ncclCommDestroy(as_comm(comm_));
}

template <typename Call>
Work NcclCommunicator::launch(const Tensor& a, const Tensor& b, int kind, Call call) {
  CUDA_CHECK(cudaSetDevice(device_.index));
  Stream& caller = current_stream(device_);
  ready_.record(caller);
  ready_.wait(stream_);
  std::shared_ptr<NcclTimer> timer = caller.capturing() ? nullptr : timer_;
  const size_t pair =
      timer ? timer->start(as_stream(stream_.native()), static_cast<TimedKind>(kind)) : 0;
  call(as_stream(stream_.native()));
  if (timer) timer->finish(pair, as_stream(stream_.native()));
  auto completion = std::make_shared<NcclCompletion>(device_, std::vector<Tensor>{a, b}, timer);
  CUDA_CHECK(cudaEventRecord(completion->event(), as_stream(stream_.native())));
  return Work(completion);
}

Work NcclCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_all_gather_args(*this, in, out);
  return launch(in, out, kAllGather, [&](cudaStream_t s) {
    NCCL_CHECK(ncclAllGather(in.raw(), out.raw(), static_cast<size_t>(in.numel()),
                             nccl_type(in.dtype()), as_comm(comm_), s));
  });
}

Work NcclCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  check_reduce_scatter_args(*this, in, out);
  return launch(in, out, kReduceScatter, [&](cudaStream_t s) {
    NCCL_CHECK(ncclReduceScatter(in.raw(), out.raw(), static_cast<size_t>(out.numel()),
                                 nccl_type(in.dtype()), nccl_op(op), as_comm(comm_), s));
  });
}

Work NcclCommunicator::all_reduce(Tensor& inout, ReduceOp op) {
  check_tensor_args(*this, "all_reduce", inout);
  return launch(inout, Tensor(), kAllReduce, [&](cudaStream_t s) {
    NCCL_CHECK(ncclAllReduce(inout.raw(), inout.raw(), static_cast<size_t>(inout.numel()),
                             nccl_type(inout.dtype()), nccl_op(op), as_comm(comm_), s));
  });
}

Work NcclCommunicator::broadcast(Tensor& inout, int root) {
  check_tensor_args(*this, "broadcast", inout);
  check_broadcast_root(*this, root);
  return launch(inout, Tensor(), kBroadcast, [&](cudaStream_t s) {
    NCCL_CHECK(ncclBroadcast(inout.raw(), inout.raw(), static_cast<size_t>(inout.numel()),
                             nccl_type(inout.dtype()), root, as_comm(comm_), s));
  });
}

void NcclCommunicator::barrier() {
  // NCCL has no barrier: a one-element all-reduce that the host waits for does the same.
  if (!barrier_buf_.defined()) barrier_buf_ = Tensor::zeros({1}, DType::kF32, device_, &stream_);
  all_reduce(barrier_buf_).synchronize();
}

void NcclCommunicator::set_timing(bool on) {
  if (on && !timer_) timer_ = std::make_shared<NcclTimer>(device_);
  if (!on) timer_.reset();
}

CommTiming NcclCommunicator::take_timing() { return timer_ ? timer_->take() : CommTiming(); }

std::unique_ptr<Communicator> make_nccl_communicator(StoreClient& store, const std::string& name,
                                                     int rank, int size, Device device) {
  return std::make_unique<NcclCommunicator>(store, name, rank, size, device);
}

Grid make_nccl_grid(StoreClient& store, int world_rank, int world_size, int gtp, Device device,
                    const std::string& prefix, int tp) {
  return make_grid(
      store, world_rank, world_size, gtp, tp,
      [device](StoreClient& s, const std::string& name, int rank, int size) {
        return make_nccl_communicator(s, name, rank, size, device);
      },
      prefix);
}

namespace {

class NcclSymmetricBackend : public memory::SymmetricBackend {
 public:
  explicit NcclSymmetricBackend(NcclCommunicator& comm) : comm_(comm) {}
  void* allocate(size_t bytes) override {
    CUDA_CHECK(cudaSetDevice(comm_.device().index));
    void* p = nullptr;
    if (ncclMemAlloc(&p, bytes) != ncclSuccess) return nullptr;
    return p;
  }
  memory::WindowHandle register_window(void* ptr, size_t bytes) override {
    ncclWindow_t win = nullptr;
    NCCL_CHECK(ncclCommWindowRegister(static_cast<ncclComm_t>(comm_.nccl_comm()), ptr, bytes, &win,
                                      NCCL_WIN_COLL_SYMMETRIC));
    return win;
  }
  void deregister_window(memory::WindowHandle window) noexcept override {
    if (window != nullptr) {
      ncclCommWindowDeregister(static_cast<ncclComm_t>(comm_.nccl_comm()),
                               static_cast<ncclWindow_t>(window));
    }
  }
  void free(void* ptr) noexcept override { ncclMemFree(ptr); }
  std::string name() const override { return "nccl-symmetric:" + comm_.name(); }

 private:
  NcclCommunicator& comm_;
};

}  // namespace

std::unique_ptr<memory::SymmetricBackend> make_nccl_symmetric_backend(NcclCommunicator& comm) {
  return std::make_unique<NcclSymmetricBackend>(comm);
}

}  // namespace gtron::parallel
