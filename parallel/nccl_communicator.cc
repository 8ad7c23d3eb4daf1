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

}  // namespace

NcclCommunicator::NcclCommunicator(StoreClient& store, const std::string& name, int rank, int size,
                                   Device device)
    : CudaCommunicator(device), name_(name), rank_(rank), size_(size) {
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
  cudaSetDevice(device().index);
  stream().synchronize();
  if (comm_ != nullptr) ncclCommDestroy(as_comm(comm_));
}

Work NcclCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_all_gather_args(*this, in, out);
  return launch(in, out, CollectiveKind::kAllGather, [&](void* s) {
    NCCL_CHECK(ncclAllGather(in.raw(), out.raw(), static_cast<size_t>(in.numel()),
                             nccl_type(in.dtype()), as_comm(comm_), as_stream(s)));
  });
}

Work NcclCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  check_reduce_scatter_args(*this, in, out);
  return launch(in, out, CollectiveKind::kReduceScatter, [&](void* s) {
    NCCL_CHECK(ncclReduceScatter(in.raw(), out.raw(), static_cast<size_t>(out.numel()),
                                 nccl_type(in.dtype()), nccl_op(op), as_comm(comm_), as_stream(s)));
  });
}

Work NcclCommunicator::all_reduce(Tensor& inout, ReduceOp op) {
  check_tensor_args(*this, "all_reduce", inout);
  return launch(inout, Tensor(), CollectiveKind::kAllReduce, [&](void* s) {
    NCCL_CHECK(ncclAllReduce(inout.raw(), inout.raw(), static_cast<size_t>(inout.numel()),
                             nccl_type(inout.dtype()), nccl_op(op), as_comm(comm_), as_stream(s)));
  });
}

Work NcclCommunicator::broadcast(Tensor& inout, int root) {
  check_tensor_args(*this, "broadcast", inout);
  check_broadcast_root(*this, root);
  return launch(inout, Tensor(), CollectiveKind::kBroadcast, [&](void* s) {
    NCCL_CHECK(ncclBroadcast(inout.raw(), inout.raw(), static_cast<size_t>(inout.numel()),
                             nccl_type(inout.dtype()), root, as_comm(comm_), as_stream(s)));
  });
}

Work NcclCommunicator::all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts,
                                  Tensor& out, const std::vector<int64_t>& recv_counts) {
  check_all_to_all_args(*this, in, send_counts, out, recv_counts);
  const size_t elem = dtype_size(in.dtype());
  return launch(in, out, CollectiveKind::kAllToAll, [&](void* s) {
    char* send = in.numel() > 0 ? static_cast<char*>(in.raw()) : nullptr;
    char* recv = out.numel() > 0 ? static_cast<char*>(out.raw()) : nullptr;
    int64_t send_at = 0, recv_at = 0;
    NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < size_; ++p) {
      const int64_t sc = send_counts[static_cast<size_t>(p)];
      const int64_t rc = recv_counts[static_cast<size_t>(p)];
      if (sc > 0) {
        NCCL_CHECK(ncclSend(send + send_at * elem, static_cast<size_t>(sc), nccl_type(in.dtype()),
                            p, as_comm(comm_), as_stream(s)));
      }
      if (rc > 0) {
        NCCL_CHECK(ncclRecv(recv + recv_at * elem, static_cast<size_t>(rc), nccl_type(in.dtype()),
                            p, as_comm(comm_), as_stream(s)));
      }
      send_at += sc;
      recv_at += rc;
    }
    NCCL_CHECK(ncclGroupEnd());
  });
}

void NcclCommunicator::barrier() {
  // NCCL has no barrier: a one-element all-reduce that the host waits for does the same.
  if (!barrier_buf_.defined()) barrier_buf_ = Tensor::zeros({1}, DType::kF32, device(), &stream());
  all_reduce(barrier_buf_).synchronize();
}

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
