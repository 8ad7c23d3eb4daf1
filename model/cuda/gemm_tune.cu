// Tune mode: timing cuBLASLt's candidates per GEMM problem (policy in gemm_tune.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "model/cuda/cublas_check.h"
#include "model/cuda/device_buffer.h"
#include "model/cuda/gemm_tune.h"
#include "model/dtype.h"
#include "model/env.h"

namespace gtron::cuda {

namespace {

// -1: not decided yet (read GTRON_GEMM_TUNE at the first call), else 0 or 1.
std::atomic<int> g_tune_mode{-1};

class Events {
 public:
  explicit Events(int n) : events_(n) {
    for (cudaEvent_t& e : events_) CUDA_CHECK(cudaEventCreate(&e));
  }
  ~Events() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  cudaEvent_t operator[](int i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

// Elements D spans: the out layout is [N×M] column-major (ld N), `batch` of them stride_c apart.
size_t out_bytes(const GemmArgs& g) {
  const int64_t elems = (g.batch - 1) * g.stride_c + g.m * g.n;
  return static_cast<size_t>(elems) * dtype_size(g.c_type);
}

// GTRON_GEMM_TUNE_SUSTAIN_MS (default 0): milliseconds each candidate runs back to back before
// its timed calls (Note [GEMM choice under the power cap]).
double sustain_ms() {
  const char* env = std::getenv("GTRON_GEMM_TUNE_SUSTAIN_MS");
  if (env == nullptr || *env == '\0') return 0.0;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  if (*end != '\0' || !(v >= 0.0) || v > 10000.0) {
    throw UserError(
        str_cat("GTRON_GEMM_TUNE_SUSTAIN_MS is '", env, "'; expected milliseconds in [0, 10000]"));
  }
  return v;
}

// Note [GEMM choice under the power cap]
// Timed in short bursts, a GEMM runs at the top clock; in a training step of a 1B model the H200
// sits at its 700 W cap and the clock drops to ~1500 MHz (nvidia-smi, throttle reason SW power
// cap), so the candidate that wins a burst is not always the one that does the most work per
// joule. With GTRON_GEMM_TUNE_SUSTAIN_MS=M each candidate first runs back to back for about M ms,
// long enough for the cap to engage, and only then are its calls timed: the ranking is at the
// clock the step will see.

// Median microseconds of kTuneTimedCalls calls of candidate `algo` writing (and, with beta != 0,
// reading) C at `d`; infinity when cuBLASLt refuses to run it.
double time_candidate(const TuneCall& call, const GemmArgs& g, void* d,
                      const cublasLtMatmulAlgo_t& algo, const Events& ev) {
  auto launch = [&] {
    return cublasLtMatmul(call.handle, call.desc, &g.alpha, g.b, call.op1, g.a, call.op2, &g.beta,
                          d, call.out, d, call.out, &algo, call.workspace, call.workspace_bytes,
                          call.stream);
  };
  for (int i = 0; i < 2; ++i) {
    if (launch() != CUBLAS_STATUS_SUCCESS) return std::numeric_limits<double>::infinity();
  }
  if (const double sustain = sustain_ms(); sustain > 0.0) {
    // One timed call gives the length of a call; then enough calls to fill `sustain` ms.
    CUDA_CHECK(cudaEventRecord(ev[0], call.stream));
    launch();
    CUDA_CHECK(cudaEventRecord(ev[1], call.stream));
    CUDA_CHECK(cudaEventSynchronize(ev[1]));
    float one = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&one, ev[0], ev[1]));
    const int64_t n =
        std::min<int64_t>(100000, static_cast<int64_t>(sustain / std::max(one, 1e-3f)));
    for (int64_t i = 0; i < n; ++i) launch();
  }
  CUDA_CHECK(cudaEventRecord(ev[0], call.stream));
  for (int i = 0; i < kTuneTimedCalls; ++i) {
    launch();
    CUDA_CHECK(cudaEventRecord(ev[i + 1], call.stream));
  }
  CUDA_CHECK(cudaEventSynchronize(ev[kTuneTimedCalls]));
  std::vector<float> ms(kTuneTimedCalls);
  for (int i = 0; i < kTuneTimedCalls; ++i) {
    CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
  }
  std::sort(ms.begin(), ms.end());
  const int h = kTuneTimedCalls / 2;
  return 1e3 * 0.5 * (static_cast<double>(ms[h - 1]) + ms[h]);
}

// The JSON string of `s` (only quotes and backslashes can occur in a table entry).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string key_array(const GemmKey& key) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < kGemmKeyFields; ++i) os << (i ? ", " : "") << key[i];
  os << "]";
  return os.str();
}

void print_line(const GemmKey& key, const std::string& device, const std::vector<double>& us,
                int best, int chosen, bool result0_is_default) {
  auto num = [](double x) { return std::isfinite(x) ? x : -1.0; };  // -1: it did not run
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  os << "gemm-tune {" << gemm_key_json(key) << ", \"candidates\": " << us.size()
     << ", \"us0\": " << num(us[0]) << ", \"best_us\": " << num(us[best]) << ", \"best\": " << best
     << ", \"chosen\": " << chosen << ", \"chosen_us\": " << num(us[chosen])
     << ", \"result0_is_default\": " << (result0_is_default ? "true" : "false") << ", \"us\": [";
  for (size_t i = 0; i < us.size(); ++i) os << (i ? ", " : "") << num(us[i]);
  const TunedGemm entry{device, cublasLtGetVersion(), key, chosen, kGemmTuneCandidates};
  os << "], \"key\": " << key_array(key) << ", \"entry\": " << json_string(tuned_gemm_entry(entry))
     << "}\n";
  std::fputs(os.str().c_str(), stderr);
}

struct CallCounts {
  std::mutex mu;
  std::map<GemmKey, int64_t> calls;
};

CallCounts& call_counts() {
  static CallCounts c;
  return c;
}

void print_call_counts() {
  CallCounts& c = call_counts();
  std::lock_guard<std::mutex> lock(c.mu);
  for (const auto& [key, n] : c.calls) {
    std::fprintf(stderr, "gemm-tune-calls {\"key\": %s, \"calls\": %lld}\n", key_array(key).c_str(),
                 static_cast<long long>(n));
  }
}

}  // namespace

bool gemm_tune_enabled() {
  int mode = g_tune_mode.load();
  if (mode >= 0) return mode == 1;
  mode = env_flag("GTRON_GEMM_TUNE", false) ? 1 : 0;
  g_tune_mode.store(mode);
  return mode == 1;
}

void set_gemm_tune_for_testing(bool on) { g_tune_mode.store(on ? 1 : 0); }

int tune_gemm(const TuneCall& call, const GemmArgs& g, const GemmKey& key,
              const std::string& device, const cublasLtMatmulHeuristicResult_t* results, int count,
              bool result0_is_default) {
  GTRON_CHECK(count >= 1, "tune_gemm: ", count, " candidates");
  DeviceBuffer d(out_bytes(g));
  const bool writes_aux = g.epilogue == Epilogue::kGeluAux;
  DeviceBuffer aux(writes_aux ? static_cast<size_t>(g.m * g.aux_ld) * dtype_size(g.c_type) : 0);
  auto set_aux = [&](void* p) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p, sizeof(p)));
  };
  if (writes_aux) set_aux(aux.get());
  // In place on a copy of C (beta = 0: C is not read, nothing to copy); with beta != 0 each timed
  // call accumulates into the copy, which only the timing sees.
  if (g.beta != 0.0f) {
    CUDA_CHECK(cudaMemcpyAsync(d.get(), g.c, out_bytes(g), cudaMemcpyDeviceToDevice, call.stream));
  }
  Events ev(kTuneTimedCalls + 1);
  std::vector<double> us(count, std::numeric_limits<double>::infinity());
  for (int i = 0; i < count; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) {
      us[i] = time_candidate(call, g, d.get(), results[i].algo, ev);
    }
  }
  if (writes_aux) set_aux(g.aux);
  CUDA_CHECK(cudaStreamSynchronize(call.stream));  // the scratch is freed on return
  const int best = static_cast<int>(std::min_element(us.begin(), us.end()) - us.begin());
  const int chosen = us[best] <= 0.97 * us[0] ? best : 0;
  print_line(key, device, us, best, chosen, result0_is_default);
  return chosen;
}

void count_tuned_call(const GemmKey& key) {
  CallCounts& c = call_counts();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.calls.empty()) std::atexit(print_call_counts);
  ++c.calls[key];
}

}  // namespace gtron::cuda
