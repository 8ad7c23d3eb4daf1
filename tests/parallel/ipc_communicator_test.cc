// The CUDA-IPC communicator with 2, 3 and 4 ranks, each a process on GPU 0 (tagged "gpu").
// The test process never touches CUDA: it hosts the store and forks the ranks, which check their
// own results and report through their exit status.
//
// Checked: every collective, dtype and reduction against a host computation in the same rank
// order (bit for bit), with slots small enough that every size but the smallest is cut into
// chunks; collectives captured into a CUDA graph and replayed on fresh inputs; a peer that never
// arrives ends the wait in a CommError naming the communicator and the peer, within the bound;
// all_to_all with uneven and zero counts, one pair large enough that every rank (even one that
// exchanges little) must run several rounds, followed by an all_gather on the same slots.
#include "parallel/ipc_communicator.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "memory/symmetric_pool.h"
#include "model/dtype.h"
#include "model/stream.h"
#include "model/tensor.h"

namespace gtron::parallel {
namespace {

constexpr size_t kSlotBytes = 4096;

// Runs body(rank, store) in `n` forked processes; returns their exit statuses.
std::vector<int> run_processes(int n, const std::function<int(int, StoreClient&)>& body) {
  StoreServer server;
  const int port = server.port();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int rc = 3;
      try {
        StoreClient store("127.0.0.1", port);
        rc = body(r, store);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

// Rank r's input element i, already representable in `dtype` (read back through a tensor).
std::vector<double> input(int r, int64_t n, DType dtype, int salt) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    v[i] = dtype == DType::kI32
               ? static_cast<double>((r * 131 + i * 17 + salt * 7) % 1000 - 500)
               : std::sin(0.37 * static_cast<double>(i) + 7.3 * r + salt) * (r + 1) * 3.0;
  }
  return Tensor::from_vector(v, {n}, dtype).to_vector();
}

// The reduction over ranks 0..P−1 in order, as the kernels compute it for `dtype`.
double reduce_in_order(const std::vector<double>& per_rank, DType dtype, bool max) {
  double d = per_rank[0];
  float f = static_cast<float>(per_rank[0]);
  for (size_t r = 1; r < per_rank.size(); ++r) {
    d = max ? std::max(d, per_rank[r]) : d + per_rank[r];
    f = max ? std::max(f, static_cast<float>(per_rank[r])) : f + static_cast<float>(per_rank[r]);
  }
  switch (dtype) {
    case DType::kF32:
      return f;
    case DType::kBF16:
      return bf16_to_float(float_to_bf16(f));
    default:
      return d;
  }
}

// Counts mismatches and prints the first few.
struct Checker {
  int rank;
  int bad = 0;
  void expect(const std::vector<double>& got, const std::vector<double>& want, const char* what,
              DType dtype, int64_t n) {
    for (size_t i = 0; i < want.size(); ++i) {
      if (got.size() == want.size() && got[i] == want[i]) continue;
      if (bad++ < 5) {
        std::fprintf(stderr, "rank %d: %s %s n=%ld: element %zu got %.9g want %.9g\n", rank, what,
                     dtype_name(dtype), static_cast<long>(n), i, i < got.size() ? got[i] : NAN,
                     want[i]);
      }
      return;
    }
  }
};

Tensor on_gpu(const std::vector<double>& v, DType dtype, Stream& s) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, dtype).to(Device::cuda(0), &s);
}
std::vector<double> on_host(const Tensor& t, Stream& s) {
  return t.to(Device::cpu(), &s).to_vector();
}

// Every collective at every dtype and a few sizes (one element; one slot; several chunks).
int every_collective(int rank, int size, StoreClient& store) {
  IpcCommunicator comm(store, "ipc_all", rank, size, Device::cuda(0), {20.0, kSlotBytes});
  Stream s(Device::cuda(0));
  StreamGuard guard(s);
  Checker check{rank};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF64, DType::kI32}) {
    for (int64_t n : {int64_t{1}, int64_t{257}, int64_t{3001}}) {
      // all_gather: rank r's n elements at [r n, (r + 1) n).
      Tensor out = Tensor::zeros({size * n}, dt, Device::cuda(0), &s);
      comm.all_gather(on_gpu(input(rank, n, dt, 1), dt, s), out).wait(s);
      std::vector<double> want;
      for (int r = 0; r < size; ++r) {
        const std::vector<double> v = input(r, n, dt, 1);
        want.insert(want.end(), v.begin(), v.end());
      }
      check.expect(on_host(out, s), want, "all_gather", dt, n);
      for (bool max : {false, true}) {
        const ReduceOp op = max ? ReduceOp::kMax : ReduceOp::kSum;
        // reduce_scatter: chunk `rank` of the ranks' [size n] inputs, reduced.
        Tensor rs = Tensor::zeros({n}, dt, Device::cuda(0), &s);
        comm.reduce_scatter(on_gpu(input(rank, size * n, dt, 2), dt, s), rs, op).wait(s);
        std::vector<double> rs_want(static_cast<size_t>(n)), ar_want(static_cast<size_t>(n));
        std::vector<std::vector<double>> rs_in, ar_in;
        for (int r = 0; r < size; ++r) {
          rs_in.push_back(input(r, size * n, dt, 2));
          ar_in.push_back(input(r, n, dt, 3));
        }
        for (int64_t i = 0; i < n; ++i) {
          std::vector<double> a, b;
          for (int r = 0; r < size; ++r) {
            a.push_back(rs_in[r][rank * n + i]);
            b.push_back(ar_in[r][i]);
          }
          rs_want[i] = reduce_in_order(a, dt, max);
          ar_want[i] = reduce_in_order(b, dt, max);
        }
        check.expect(on_host(rs, s), rs_want, max ? "reduce_scatter max" : "reduce_scatter", dt, n);
        Tensor ar = on_gpu(input(rank, n, dt, 3), dt, s);
        comm.all_reduce(ar, op).wait(s);
        check.expect(on_host(ar, s), ar_want, max ? "all_reduce max" : "all_reduce", dt, n);
      }
      Tensor bc = on_gpu(input(rank, n, dt, 4), dt, s);
      comm.broadcast(bc, size - 1).wait(s);
      check.expect(on_host(bc, s), input(size - 1, n, dt, 4), "broadcast", dt, n);
    }
  }
  comm.barrier();
  return check.bad == 0 ? 0 : 1;
}

// Elements rank p sends rank q in exchange `salt` of all_to_all_v: uneven, some zero; with `big`,
// rank 0's block for the last rank spans several rounds of a kSlotBytes slot.
int64_t a2a_count(int p, int q, int size, int salt, bool big) {
  if (big && p == 0 && q == size - 1) return 2500;
  if ((p + 2 * q + salt) % 4 == 0) return 0;
  return (p * 37 + q * 101 + salt * 13) % 300;
}

// all_to_all at 3 count patterns (one all zero) and f32, bf16, checked element for element, then
// an all_gather: the slots and counters are in step after a call of several rounds.
int all_to_all_v(int rank, int size, StoreClient& store) {
  IpcCommunicator comm(store, "ipc_a2a", rank, size, Device::cuda(0), {20.0, kSlotBytes});
  Stream s(Device::cuda(0));
  StreamGuard guard(s);
  Checker check{rank};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int pattern = 0; pattern < 3; ++pattern) {
      const bool zero = pattern == 2, big = pattern == 1;
      auto count = [&](int p, int q) { return zero ? 0 : a2a_count(p, q, size, pattern, big); };
      std::vector<int64_t> send, recv;
      int64_t n_send = 0, n_recv = 0;
      for (int q = 0; q < size; ++q) {
        send.push_back(count(rank, q));
        recv.push_back(count(q, rank));
        n_send += send.back();
        n_recv += recv.back();
      }
      Tensor out = Tensor::zeros({n_recv}, dt, Device::cuda(0), &s);
      comm.all_to_all(on_gpu(input(rank, n_send, dt, 40 + pattern), dt, s), send, out, recv)
          .wait(s);
      std::vector<double> want;
      for (int q = 0; q < size; ++q) {  // rank q's block for this rank
        int64_t at = 0;
        for (int r = 0; r < rank; ++r) at += count(q, r);
        int64_t total = 0;
        for (int r = 0; r < size; ++r) total += count(q, r);
        const std::vector<double> v = input(q, total, dt, 40 + pattern);
        want.insert(want.end(), v.begin() + at, v.begin() + at + count(q, rank));
      }
      check.expect(n_recv > 0 ? on_host(out, s) : std::vector<double>(), want, "all_to_all", dt,
                   n_recv);
      const int64_t n = 700;  // an all_gather after it, on the same slots
      Tensor gathered = Tensor::zeros({size * n}, dt, Device::cuda(0), &s);
      comm.all_gather(on_gpu(input(rank, n, dt, 50), dt, s), gathered).wait(s);
      std::vector<double> all;
      for (int r = 0; r < size; ++r) {
        const std::vector<double> v = input(r, n, dt, 50);
        all.insert(all.end(), v.begin(), v.end());
      }
      check.expect(on_host(gathered, s), all, "all_gather after all_to_all", dt, n);
    }
  }
  comm.barrier();
  return check.bad == 0 ? 0 : 1;
}

// An all_reduce and a reduce_scatter captured once, replayed on three fresh inputs.
int captured_and_replayed(int rank, int size, StoreClient& store) {
  IpcCommunicator comm(store, "ipc_graph", rank, size, Device::cuda(0), {20.0, kSlotBytes});
  Stream s(Device::cuda(0));
  StreamGuard guard(s);
  const int64_t n = 2000;  // several chunks per collective
  Tensor ar = Tensor::zeros({n}, DType::kF32, Device::cuda(0), &s);
  Tensor rs_in = Tensor::zeros({size * n}, DType::kBF16, Device::cuda(0), &s);
  Tensor rs_out = Tensor::zeros({n}, DType::kBF16, Device::cuda(0), &s);
  comm.barrier();  // the warm-up: a collective before capture, as training has
  auto cs = static_cast<cudaStream_t>(s.native());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  s.synchronize();
  if (cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return 2;
  s.begin_capture();
  comm.all_reduce(ar).wait(s);
  comm.reduce_scatter(rs_in, rs_out).wait(s);
  s.end_capture();
  if (cudaStreamEndCapture(cs, &graph) != cudaSuccess) return 2;
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return 2;
  Checker check{rank};
  for (int replay = 0; replay < 3; ++replay) {
    ar.copy_from(on_gpu(input(rank, n, DType::kF32, 10 + replay), DType::kF32, s));
    rs_in.copy_from(on_gpu(input(rank, size * n, DType::kBF16, 20 + replay), DType::kBF16, s));
    if (cudaGraphLaunch(exec, cs) != cudaSuccess) return 2;
    std::vector<double> ar_want(n), rs_want(n);
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> a, b;
      for (int r = 0; r < size; ++r) {
        a.push_back(input(r, n, DType::kF32, 10 + replay)[i]);
        b.push_back(input(r, size * n, DType::kBF16, 20 + replay)[rank * n + i]);
      }
      ar_want[i] = reduce_in_order(a, DType::kF32, false);
      rs_want[i] = reduce_in_order(b, DType::kBF16, false);
    }
    check.expect(on_host(ar, s), ar_want, "replayed all_reduce", DType::kF32, n);
    check.expect(on_host(rs_out, s), rs_want, "replayed reduce_scatter", DType::kBF16, n);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  comm.barrier();
  return check.bad == 0 ? 0 : 1;
}

// The GTP send pool on IPC windows: reduce_scatter from a pool buffer reads the peers' buffers in
// place (Note [IPC windows]) and gives the staged path's bits; two buffers of one key, reused.
int from_windows(int rank, int size, StoreClient& store) {
  IpcCommunicator comm(store, "ipc_win", rank, size, Device::cuda(0), {20.0, kSlotBytes});
  Stream s(Device::cuda(0));
  StreamGuard guard(s);
  Checker check{rank};
  {
    memory::SymmetricPool pool(make_ipc_symmetric_backend(comm));
    const int64_t n = 5000;  // larger than a slot: the staged path would chunk it
    const memory::PoolKey key{size * n, {0, 4}, 0};
    std::vector<void*> held;
    for (int round = 0; round < 4; ++round) {
      void* buf = pool.acquire(key);
      held.push_back(buf);
      Tensor in = Tensor::from_blob(buf, {size * n}, DType::kF32, Device::cuda(0));
      in.copy_from(on_gpu(input(rank, size * n, DType::kF32, 30 + round), DType::kF32, s));
      Tensor out = Tensor::zeros({n}, DType::kF32, Device::cuda(0), &s);
      comm.reduce_scatter(in, out).wait(s);
      std::vector<double> want(n);
      for (int64_t i = 0; i < n; ++i) {
        std::vector<double> a;
        for (int r = 0; r < size; ++r)
          a.push_back(input(r, size * n, DType::kF32, 30 + round)[rank * n + i]);
        want[i] = reduce_in_order(a, DType::kF32, false);
      }
      check.expect(on_host(out, s), want, "reduce_scatter from a window", DType::kF32, n);
      if (round % 2 == 1) {  // two buffers live at once, then both back to the pool
        for (void* b : held) pool.release(key, b);
        held.clear();
      }
    }
    if (pool.stats().bytes_held != 2 * key.bytes()) ++check.bad;
    s.synchronize();
  }
  // Ranks that register different sizes get a UserError naming both.
  void* p = nullptr;
  cudaMalloc(&p, rank == 0 ? 1024 : 2048);
  try {
    comm.register_window(p, rank == 0 ? 1024 : 2048);
    ++check.bad;
  } catch (const UserError& e) {
    if (std::string(e.what()).find("same buffers in the same order") == std::string::npos) {
      ++check.bad;
    }
  }
  comm.barrier();
  return check.bad == 0 ? 0 : 1;
}

TEST(IpcCommunicatorTest, EveryCollectiveBitForBit) {
  for (int size : {2, 3, 4}) {
    const std::vector<int> codes = run_processes(
        size, [size](int rank, StoreClient& store) { return every_collective(rank, size, store); });
    for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " of " << size;
  }
}

TEST(IpcCommunicatorTest, AllToAllUnevenAndZeroCounts) {
  for (int size : {2, 3, 4}) {
    const std::vector<int> codes = run_processes(
        size, [size](int rank, StoreClient& store) { return all_to_all_v(rank, size, store); });
    for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " of " << size;
  }
}

TEST(IpcCommunicatorTest, CapturedCollectivesReplayOnFreshInputs) {
  const int size = 3;
  const std::vector<int> codes = run_processes(
      size, [](int rank, StoreClient& store) { return captured_and_replayed(rank, size, store); });
  for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(IpcCommunicatorTest, SendPoolOnWindows) {
  for (int size : {2, 4}) {
    const std::vector<int> codes = run_processes(
        size, [size](int rank, StoreClient& store) { return from_windows(rank, size, store); });
    for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " of " << size;
  }
}

// Rank 1 never issues the all_reduce: rank 0's wait ends after ~1 s in a CommError that names the
// communicator and rank 1 (exit 0 from rank 0 means it saw exactly that).
TEST(IpcCommunicatorTest, AbsentPeerEndsInCommErrorNamingIt) {
  const std::vector<int> codes = run_processes(2, [](int rank, StoreClient& store) {
    IpcCommunicator comm(store, "ipc_absent", rank, 2, Device::cuda(0), {1.0, kSlotBytes});
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(6));
      _exit(0);  // no teardown: its barrier would count as an arrival
    }
    Stream s(Device::cuda(0));
    StreamGuard guard(s);
    Tensor t = Tensor::zeros({16}, DType::kF32, Device::cuda(0), &s);
    const auto start = std::chrono::steady_clock::now();
    try {
      comm.all_reduce(t).synchronize();
    } catch (const CommError& e) {
      const double s_waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::string what = e.what();
      std::printf("CommError after %.2f s: %s\n", s_waited, what.c_str());
      const bool named = what.find("ipc_absent") != std::string::npos &&
                         what.find("rank 1 did not reach") != std::string::npos;
      try {  // broken from then on
        comm.all_reduce(t);
        return 5;
      } catch (const CommError&) {
      }
      _exit(named && s_waited < 5 ? 0 : 4);  // no teardown either (the peer is gone)
    }
    return 6;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

}  // namespace
}  // namespace gtron::parallel
