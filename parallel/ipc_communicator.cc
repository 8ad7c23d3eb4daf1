#include "parallel/ipc_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "model/cuda/check.h"

namespace gtron::parallel {
namespace {

ipc::Dtype ipc_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ipc::Dtype::kF32;
    case DType::kBF16:
      return ipc::Dtype::kBF16;
    case DType::kF64:
      return ipc::Dtype::kF64;
    case DType::kI32:
      return ipc::Dtype::kI32;
  }
  GTRON_CHECK(false, "no IPC reduction for ", dtype_name(t));
  return ipc::Dtype::kF32;
}

ipc::Op ipc_op(ReduceOp op) { return op == ReduceOp::kSum ? ipc::Op::kSum : ipc::Op::kMax; }

char* bytes_of(const Tensor& t) { return static_cast<char*>(const_cast<void*>(t.raw())); }

// The teardown barrier waits at most this long (a peer that failed must not hold this rank's exit).
constexpr double kTeardownTimeoutS = 10;

int64_t to_ns(double s) { return static_cast<int64_t>(s * 1e9); }

}  // namespace

// The host-mapped error word and what a failure message says; shared with the Works, which may
// outlive a call (not the communicator).
struct IpcErrorState {
  IpcErrorState(std::string name, int rank, int size, double timeout_s)
      : name(std::move(name)), rank(rank), size(size), timeout_s(timeout_s) {
    CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&word), sizeof(ipc::ErrorWord),
                             cudaHostAllocMapped));
    word->code = 0;
    word->peer = -1;
  }
  ~IpcErrorState() { cudaFreeHost(word); }
  bool broken() const { return static_cast<volatile ipc::ErrorWord*>(word)->code != 0; }
  void check() const {
    if (!broken()) return;
    const int peer = static_cast<volatile ipc::ErrorWord*>(word)->peer;
    throw CommError(str_cat("communicator '", name, "' (ipc, rank ", rank, " of ", size, "): rank ",
                            peer, " did not reach a collective within ", timeout_s,
                            " s (parallel.ipc_timeout_s): it died, hangs, or issued other "
                            "collectives; this communicator is broken"));
  }

  ipc::ErrorWord* word = nullptr;
  std::string name;
  int rank, size;
  double timeout_s;
};

struct IpcCommunicator::Window {
  char* ptr = nullptr;
  size_t bytes = 0;
  ipc::Peers peers;  // every rank's buffer here, by rank (own included)
};

namespace {

// Opens rank `peer`'s IPC handle; a failure is a UserError (ranks on GPUs without peer access).
char* open_handle(const std::string& bytes, const std::string& name, int rank, int peer) {
  cudaIpcMemHandle_t handle;
  GTRON_CHECK(bytes.size() >= sizeof handle, "IPC handle of ", bytes.size(), " bytes");
  std::copy(bytes.begin(), bytes.begin() + sizeof handle, reinterpret_cast<char*>(&handle));
  void* p = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw UserError(str_cat("communicator '", name, "' (ipc): rank ", rank, " cannot open rank ",
                            peer, "'s memory through CUDA IPC: ", cudaGetErrorString(err),
                            ". Hint: the ranks of parallel.backend = \"ipc\" must run on one "
                            "machine, on GPUs with peer access to each other"));
  }
  return static_cast<char*>(p);
}

// This process's IPC handle of `ptr` (a whole cudaMalloc allocation), as bytes for the store.
std::string handle_bytes(void* ptr) {
  cudaIpcMemHandle_t handle;
  CUDA_CHECK(cudaIpcGetMemHandle(&handle, ptr));
  return std::string(reinterpret_cast<const char*>(&handle), sizeof handle);
}

}  // namespace

IpcCommunicator::IpcCommunicator(StoreClient& store, const std::string& name, int rank, int size,
                                 Device device, const IpcOptions& options)
    : CudaCommunicator(device),
      store_(store),
      name_(name),
      rank_(rank),
      size_(size),
      options_(options) {
  GTRON_CHECK(size >= 1 && rank >= 0 && rank < size, "communicator '", name, "': rank ", rank,
              " of ", size);
  if (size > ipc::kMaxRanks) {
    throw UserError(str_cat("communicator '", name, "': ", size,
                            " ranks over CUDA IPC (parallel.backend = \"ipc\"); at most ",
                            ipc::kMaxRanks, ". Hint: fewer processes per node"));
  }
  GTRON_CHECK(options.slot_bytes >= 1024 && options.slot_bytes % 256 == 0, "IPC slot of ",
              options.slot_bytes, " bytes");
  errors_ = std::make_shared<IpcErrorState>(name, rank, size, options.timeout_s);
  CUDA_CHECK(cudaSetDevice(device.index));
  const size_t arena_bytes = ipc::kIpcFlagBytes + 2 * options.slot_bytes;
  CUDA_CHECK(cudaMalloc(&arena_, arena_bytes));
  CUDA_CHECK(cudaMemset(arena_, 0, ipc::kIpcFlagBytes));
  CUDA_CHECK(cudaDeviceSynchronize());  // zeroed flags before any peer can read them
  const std::string prefix = name + "/ipc/";
  store.set(prefix + std::to_string(rank), handle_bytes(arena_));
  for (int r = 0; r < size; ++r) {
    peers_.base[r] = r == rank ? static_cast<char*>(arena_)
                               : open_handle(store.get(prefix + std::to_string(r)), name, rank, r);
  }
}

IpcCommunicator::~IpcCommunicator() {
  cudaSetDevice(device().index);
  if (!errors_->broken()) {
    ipc::barrier(peers_, rank_, size_, to_ns(std::min(kTeardownTimeoutS, options_.timeout_s)),
                 errors_->word, stream().native());
  }
  stream().synchronize();
  for (const auto& w : windows_) deregister_window(w.get());
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && peers_.base[r] != nullptr) cudaIpcCloseMemHandle(peers_.base[r]);
  }
  cudaFree(arena_);
}

memory::WindowHandle IpcCommunicator::register_window(void* ptr, size_t bytes) {
  CUDA_CHECK(cudaSetDevice(device().index));
  const std::string prefix = str_cat(name_, "/win/", windows_registered_++, "/");
  std::string mine = handle_bytes(ptr);
  mine.append(reinterpret_cast<const char*>(&bytes), sizeof bytes);
  store_.set(prefix + std::to_string(rank_), mine);
  auto w = std::make_unique<Window>();
  w->ptr = static_cast<char*>(ptr);
  w->bytes = bytes;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) {
      w->peers.base[r] = w->ptr;
      continue;
    }
    const std::string theirs = store_.get(prefix + std::to_string(r));
    size_t their_bytes = 0;
    GTRON_CHECK(theirs.size() == mine.size(), "window record of ", theirs.size(), " bytes");
    std::copy(theirs.end() - sizeof their_bytes, theirs.end(),
              reinterpret_cast<char*>(&their_bytes));
    if (their_bytes != bytes) {
      throw UserError(str_cat("communicator '", name_, "' (ipc): window ", windows_registered_ - 1,
                              " is ", bytes, " bytes on rank ", rank_, " but ", their_bytes,
                              " on rank ", r,
                              ": the ranks must register the same buffers in the same order"));
    }
    w->peers.base[r] = open_handle(theirs, name_, rank_, r);
  }
  windows_.push_back(std::move(w));
  return windows_.back().get();
}

void IpcCommunicator::deregister_window(memory::WindowHandle window) noexcept {
  auto* w = static_cast<Window*>(window);
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && w->peers.base[r] != nullptr) cudaIpcCloseMemHandle(w->peers.base[r]);
    w->peers.base[r] = nullptr;
  }
}

const IpcCommunicator::Window* IpcCommunicator::window_of(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  for (const auto& w : windows_) {
    if (w->peers.base[rank_] != nullptr && c >= w->ptr && c + bytes <= w->ptr + w->bytes) {
      return w.get();
    }
  }
  return nullptr;
}

void IpcCommunicator::barrier_on(void* stream) {
  ipc::barrier(peers_, rank_, size_, to_ns(options_.timeout_s), errors_->word, stream);
}

Work IpcCommunicator::run(const Tensor& a, const Tensor& b, CollectiveKind kind,
                          const std::function<void(void* stream)>& chunks) {
  errors_->check();
  std::shared_ptr<const IpcErrorState> errors = errors_;
  return launch(a, b, kind, chunks, [errors] { errors->check(); });
}

Work IpcCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_all_gather_args(*this, in, out);
  const size_t es = dtype_size(in.dtype()), n = static_cast<size_t>(in.numel());
  const size_t step = options_.slot_bytes / es;
  return run(in, out, CollectiveKind::kAllGather, [&](void* s) {
    for (size_t o = 0; o < n; o += step) {
      const size_t bytes = std::min(step, n - o) * es;
      ipc::stage(peers_, rank_, options_.slot_bytes, bytes_of(in) + o * es, bytes, bytes, 1, s);
      barrier_on(s);
      ipc::gather(peers_, rank_, 0, size_, options_.slot_bytes, bytes_of(out) + o * es, n * es,
                  bytes, s);
    }
  });
}

Work IpcCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  check_reduce_scatter_args(*this, in, out);
  const size_t es = dtype_size(in.dtype()), n = static_cast<size_t>(out.numel());
  const size_t step = options_.slot_bytes / (es * static_cast<size_t>(size_));
  GTRON_CHECK(step > 0, "IPC slot too small for ", size_, " ranks");
  if (const Window* w = window_of(in.raw(), n * es * static_cast<size_t>(size_))) {
    const int64_t offset =
        (bytes_of(in) - w->ptr) / static_cast<int64_t>(es) + static_cast<int64_t>(rank_ * n);
    return run(in, out, CollectiveKind::kReduceScatter, [&](void* s) {
      barrier_on(s);
      ipc::reduce(w->peers, rank_, size_, 0, offset, bytes_of(out), static_cast<int64_t>(n),
                  ipc_type(in.dtype()), ipc_op(op), s);
      barrier_on(s);
    });
  }
  return run(in, out, CollectiveKind::kReduceScatter, [&](void* s) {
    for (size_t o = 0; o < n; o += step) {
      const size_t c = std::min(step, n - o);
      ipc::stage(peers_, rank_, options_.slot_bytes, bytes_of(in) + o * es, n * es, c * es, size_,
                 s);
      barrier_on(s);
      ipc::reduce(peers_, rank_, size_, options_.slot_bytes, static_cast<int64_t>(rank_ * c),
                  bytes_of(out) + o * es, static_cast<int64_t>(c), ipc_type(in.dtype()), ipc_op(op),
                  s);
    }
  });
}

Work IpcCommunicator::all_reduce(Tensor& inout, ReduceOp op) {
  check_tensor_args(*this, "all_reduce", inout);
  const size_t es = dtype_size(inout.dtype()), n = static_cast<size_t>(inout.numel());
  const size_t step = options_.slot_bytes / es;
  return run(inout, Tensor(), CollectiveKind::kAllReduce, [&](void* s) {
    for (size_t o = 0; o < n; o += step) {
      const size_t c = std::min(step, n - o);
      ipc::stage(peers_, rank_, options_.slot_bytes, bytes_of(inout) + o * es, c * es, c * es, 1,
                 s);
      barrier_on(s);
      ipc::reduce(peers_, rank_, size_, options_.slot_bytes, 0, bytes_of(inout) + o * es,
                  static_cast<int64_t>(c), ipc_type(inout.dtype()), ipc_op(op), s);
    }
  });
}

Work IpcCommunicator::broadcast(Tensor& inout, int root) {
  check_tensor_args(*this, "broadcast", inout);
  check_broadcast_root(*this, root);
  const size_t es = dtype_size(inout.dtype()), n = static_cast<size_t>(inout.numel());
  const size_t step = options_.slot_bytes / es;
  return run(inout, Tensor(), CollectiveKind::kBroadcast, [&](void* s) {
    for (size_t o = 0; o < n; o += step) {
      const size_t bytes = std::min(step, n - o) * es;
      if (rank_ == root) {
        ipc::stage(peers_, rank_, options_.slot_bytes, bytes_of(inout) + o * es, bytes, bytes, 1,
                   s);
      }
      barrier_on(s);
      if (rank_ != root) {
        ipc::gather(peers_, rank_, root, 1, options_.slot_bytes, bytes_of(inout) + o * es, bytes,
                    bytes, s);
      }
    }
  });
}

Work IpcCommunicator::all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts,
                                 Tensor& out, const std::vector<int64_t>& recv_counts) {
  check_all_to_all_args(*this, in, send_counts, out, recv_counts);
  const int64_t es = static_cast<int64_t>(dtype_size(in.dtype()));
  ipc::AllToAllPlan plan;
  int64_t sent = 0, received = 0;
  for (size_t q = 0; q < send_counts.size(); ++q) {
    plan.send_off[q] = sent * es;
    plan.send_bytes[q] = send_counts[q] * es;
    plan.recv_off[q] = received * es;
    plan.recv_bytes[q] = recv_counts[q] * es;
    sent += send_counts[q];
    received += recv_counts[q];
  }
  const char* src = in.numel() > 0 ? bytes_of(in) : nullptr;
  char* dst = out.numel() > 0 ? bytes_of(out) : nullptr;
  return run(in, out, CollectiveKind::kAllToAll, [&](void* s) {
    ipc::all_to_all(peers_, rank_, size_, options_.slot_bytes, src, dst, plan,
                    to_ns(options_.timeout_s), errors_->word, s);
  });
}

void IpcCommunicator::barrier() {
  run(Tensor(), Tensor(), CollectiveKind::kAllReduce, [&](void* s) {
    barrier_on(s);
  }).synchronize();
}

std::unique_ptr<Communicator> make_ipc_communicator(StoreClient& store, const std::string& name,
                                                    int rank, int size, Device device,
                                                    const IpcOptions& options) {
  return std::make_unique<IpcCommunicator>(store, name, rank, size, device, options);
}

namespace {

class IpcSymmetricBackend : public memory::SymmetricBackend {
 public:
  explicit IpcSymmetricBackend(IpcCommunicator& comm) : comm_(comm) {}
  void* allocate(size_t bytes) override {
    CUDA_CHECK(cudaSetDevice(comm_.device().index));
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  memory::WindowHandle register_window(void* ptr, size_t bytes) override {
    return comm_.register_window(ptr, bytes);
  }
  void deregister_window(memory::WindowHandle window) noexcept override {
    comm_.deregister_window(window);
  }
  void free(void* ptr) noexcept override { cudaFree(ptr); }
  std::string name() const override { return "ipc-symmetric:" + comm_.name(); }

 private:
  IpcCommunicator& comm_;
};

}  // namespace

std::unique_ptr<memory::SymmetricBackend> make_ipc_symmetric_backend(IpcCommunicator& comm) {
  return std::make_unique<IpcSymmetricBackend>(comm);
}

}  // namespace gtron::parallel
