// The counters and the finisher count of the one-launch column sums (model/cuda/column_finish.h).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "model/cuda/check.h"
#include "model/cuda/column_finish.h"

namespace gtron::cuda {

namespace {

constexpr int64_t kMinCounters = 4096;       // 16 KiB a stream: 2048 groups before it grows
constexpr int64_t kColumnsPerFinisher = 32;  // one pass of finish_slice

std::atomic<int>& fused_state() {  // -1: not read yet; 0: two launches; 1: one launch
  static std::atomic<int> state{-1};
  return state;
}

// Zeroes `bytes` at `p` before returning, on a private stream: the caller's stream may be
// capturing a graph (relaxed mode), and a memset queued there would only run at replay.
void zero_now(void* p, size_t bytes) {
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  CUDA_CHECK(cudaStreamDestroy(s));
}

struct Counters {
  unsigned* ptr = nullptr;
  int64_t count = 0;
};

}  // namespace

bool column_finish_fused() {
  int s = fused_state().load(std::memory_order_relaxed);
  if (s < 0) {
    const char* e = std::getenv("GTRON_COLUMN_FINISH");
    s = (e != nullptr && std::strcmp(e, "0") == 0) ? 0 : 1;
    int expected = -1;
    fused_state().compare_exchange_strong(expected, s);
    s = fused_state().load(std::memory_order_relaxed);
  }
  return s == 1;
}

void set_column_finish_fused(bool fused) { fused_state().store(fused ? 1 : 0); }

unsigned* column_finish_counters(void* stream, int64_t groups) {
  static std::mutex mu;
  static std::map<std::pair<int, void*>, Counters> counters;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const int64_t need = 2 * std::max<int64_t>(groups, 1);
  std::lock_guard<std::mutex> lock(mu);
  Counters& c = counters[{device, stream}];
  if (c.count < need) {
    // A smaller buffer this stream used before stays allocated: graphs captured with it still
    // replay against it.
    const int64_t n = std::max({need, 2 * c.count, kMinCounters});
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(unsigned)));
    zero_now(p, static_cast<size_t>(n) * sizeof(unsigned));
    c.ptr = static_cast<unsigned*>(p);
    c.count = n;
  }
  return c.ptr;
}

int column_finishers(int64_t groups, int64_t group_cols, int64_t group_blocks) {
  static std::mutex mu;
  static std::map<int, int> sms_of;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  int sms = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = sms_of.find(device);
    if (it == sms_of.end()) {
      CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      it = sms_of.emplace(device, sms).first;
    }
    sms = it->second;
  }
  const int64_t budget = std::max<int64_t>(1, sms / 2);
  const int64_t want = (group_cols + kColumnsPerFinisher - 1) / kColumnsPerFinisher;
  const int64_t cap = std::max<int64_t>(1, budget / std::max<int64_t>(groups, 1));
  return static_cast<int>(std::max<int64_t>(1, std::min({want, cap, group_blocks})));
}

}  // namespace gtron::cuda
