#include "parallel/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "model/check.h"
#include "parallel/gloo_store.h"

namespace gtron::parallel {

// A CPU event armed at submission and completed by the worker, plus the failure, if any.
class GlooCommunicator::GlooCompletion final : public Completion {
 public:
  void arm() {
    outstanding_.fetch_add(1);
    event_.arm();
  }
  void finish(const std::string& error) {
    if (!error.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = error;
    }
    outstanding_.fetch_sub(1);
    event_.complete();
  }

  void wait(Stream& stream) override {
    GTRON_CHECK(stream.device().is_cpu(), "a Gloo work waited on ", stream.device().str());
    event_.wait(stream);
    if (!stream.capturing()) throw_if_failed();
  }
  void synchronize() override {
    event_.synchronize();
    throw_if_failed();
  }
  bool done() override { return outstanding_.load() == 0; }

 private:
  void throw_if_failed() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) throw CommError(error_);
  }

  Event event_{Device::cpu()};
  std::atomic<int64_t> outstanding_{0};
  std::mutex mu_;
  std::string error_;
};

namespace {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn reduce_fn(ReduceOp op) {
  return op == ReduceOp::kSum ? static_cast<ReduceFn>(&gloo::sum<T>)
                              : static_cast<ReduceFn>(&gloo::max<T>);
}

void check_reducible(const char* what, const Tensor& t) {
  GTRON_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kF64, "Gloo ", what,
              " reduces f32 or f64 tensors; got ", dtype_name(t.dtype()));
}

template <typename T>
void allreduce_typed(const std::shared_ptr<gloo::Context>& ctx, T* data, size_t n, ReduceOp op,
                     uint32_t tag, std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput<T>(data, n);
  opts.setReduceFunction(reduce_fn<T>(op));
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

void allreduce_bytes(const std::shared_ptr<gloo::Context>& ctx, void* data, DType dtype, size_t n,
                     ReduceOp op, uint32_t tag, std::chrono::milliseconds timeout) {
  if (dtype == DType::kF32) {
    allreduce_typed(ctx, static_cast<float*>(data), n, op, tag, timeout);
  } else {
    allreduce_typed(ctx, static_cast<double*>(data), n, op, tag, timeout);
  }
}

}  // namespace

GlooCommunicator::GlooCommunicator(StoreClient& store, const std::string& name, int rank, int size,
                                   const GlooOptions& options)
    : name_(name), rank_(rank), size_(size), timeout_(options.timeout) {
  GTRON_CHECK(size >= 1 && rank >= 0 && rank < size, "communicator '", name, "': rank ", rank,
              " of ", size);
  if (size > 1) {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname.empty() ? store.local_address() : options.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout_);
    GlooStore gloo_store(store, "gloo/" + name);
    try {
      context->connectFullMesh(gloo_store, device);
    } catch (const UserError&) {
      throw;  // the store's own clear message (e.g. a peer's address never arrived)
    } catch (const std::exception& e) {
      throw CommError(str_cat("communicator '", name, "' (rank ", rank, " of ", size,
                              ") could not connect to its peers: ", e.what(),
                              ". Hint: another rank may have failed; check every rank's log"));
    }
    context_ = std::move(context);
  }
  worker_ = std::thread([this] { worker_loop(); });
}

GlooCommunicator::~GlooCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void GlooCommunicator::worker_loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string error = broken_;
    if (error.empty()) {
      try {
        task.run(next_tag_++);
      } catch (const std::exception& e) {
        error = str_cat("Gloo ", task.what, " on communicator '", name_, "' (rank ", rank_, " of ",
                        size_, ") failed: ", e.what(),
                        ". Hint: another rank probably exited or stalled; check every rank's log");
        broken_ = error;
      }
    }
    auto completion = std::move(task.completion);
    task = Task();  // release the tensors before signalling: a waiter may reuse their memory
    completion->finish(error);
  }
}

Work GlooCommunicator::submit(const std::string& what, std::function<void(uint32_t tag)> run) {
  auto completion = std::make_shared<GlooCompletion>();
  auto enqueue = [this, what, run = std::move(run), completion] {
    completion->arm();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(Task{what, run, completion});
    }
    cv_.notify_one();
  };
  current_stream(Device::cpu()).run(std::move(enqueue));
  return Work(completion);
}

Work GlooCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_all_gather_args(*this, in, out);
  if (in.numel() == 0) return Work();
  return submit("all_gather", [this, in, out](uint32_t tag) {
    if (!context_) {
      std::memcpy(out.raw(), in.raw(), in.nbytes());
      return;
    }
    gloo::AllgatherOptions opts(context_);
    opts.setInput<char>(static_cast<char*>(in.raw()), in.nbytes());
    opts.setOutput<char>(static_cast<char*>(out.raw()), out.nbytes());
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::allgather(opts);
  });
}

Work GlooCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  check_reduce_scatter_args(*this, in, out);
  check_reducible("reduce_scatter", in);
  if (out.numel() == 0) return Work();
  return submit("reduce_scatter", [this, in, out, op](uint32_t tag) {
    if (!context_) {
      std::memcpy(out.raw(), in.raw(), in.nbytes());
      return;
    }
    std::vector<char> scratch(in.nbytes());
    std::memcpy(scratch.data(), in.raw(), in.nbytes());
    allreduce_bytes(context_, scratch.data(), in.dtype(), static_cast<size_t>(in.numel()), op, tag,
                    timeout_);
    std::memcpy(out.raw(), scratch.data() + rank_ * out.nbytes(), out.nbytes());
  });
}

Work GlooCommunicator::all_reduce(Tensor& inout, ReduceOp op) {
  check_tensor_args(*this, "all_reduce", inout);
  check_reducible("all_reduce", inout);
  if (inout.numel() == 0 || size_ == 1) return submit("all_reduce", [](uint32_t) {});
  return submit("all_reduce", [this, inout, op](uint32_t tag) {
    allreduce_bytes(context_, inout.raw(), inout.dtype(), static_cast<size_t>(inout.numel()), op,
                    tag, timeout_);
  });
}

Work GlooCommunicator::broadcast(Tensor& inout, int root) {
  check_tensor_args(*this, "broadcast", inout);
  check_broadcast_root(*this, root);
  if (inout.numel() == 0 || size_ == 1) return submit("broadcast", [](uint32_t) {});
  return submit("broadcast", [this, inout, root](uint32_t tag) {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput<char>(static_cast<char*>(inout.raw()), inout.nbytes());
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  });
}

Work GlooCommunicator::all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts,
                                  Tensor& out, const std::vector<int64_t>& recv_counts) {
  check_all_to_all_args(*this, in, send_counts, out, recv_counts);
  if (size_ == 1) {
    if (in.numel() == 0) return Work();
    return submit("all_to_all",
                  [in, out](uint32_t) { std::memcpy(out.raw(), in.raw(), in.nbytes()); });
  }
  // Counts in bytes: alltoallv then moves any dtype. An empty side points at a byte of its own
  // (an undefined or empty tensor has no address to give).
  const int64_t elem = static_cast<int64_t>(dtype_size(in.dtype()));
  std::vector<int64_t> send_bytes, recv_bytes;
  for (int64_t c : send_counts) send_bytes.push_back(c * elem);
  for (int64_t c : recv_counts) recv_bytes.push_back(c * elem);
  return submit("all_to_all", [this, in, out, send_bytes, recv_bytes](uint32_t tag) {
    char spare_in = 0, spare_out = 0;
    gloo::AlltoallvOptions opts(context_);
    opts.setInput<char>(in.numel() > 0 ? static_cast<char*>(in.raw()) : &spare_in, send_bytes);
    opts.setOutput<char>(out.numel() > 0 ? static_cast<char*>(out.raw()) : &spare_out, recv_bytes);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::alltoallv(opts);
  });
}

void GlooCommunicator::barrier() {
  GTRON_CHECK(!current_stream(Device::cpu()).capturing(),
              "barrier() blocks the host: not allowed while capturing");
  Work work = submit("barrier", [this](uint32_t tag) {
    if (!context_) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  });
  work.synchronize();
}

std::unique_ptr<Communicator> make_gloo_communicator(StoreClient& store, const std::string& name,
                                                     int rank, int size,
                                                     const GlooOptions& options) {
  return std::make_unique<GlooCommunicator>(store, name, rank, size, options);
}

Grid make_gloo_grid(StoreClient& store, int world_rank, int world_size, int gtp, int tp,
                    const GlooOptions& options, const std::string& prefix) {
  return make_grid(
      store, world_rank, world_size, gtp, tp,
      [&options](StoreClient& s, const std::string& name, int rank, int size) {
        return make_gloo_communicator(s, name, rank, size, options);
      },
      prefix);
}

}  // namespace gtron::parallel
