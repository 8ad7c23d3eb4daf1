// cuBLASLt-backed row-major GEMM (contract in gemm.h).
//
// Note [row-major through column-major cuBLAS]
// cuBLAS reads matrices column-major. The bytes of a row-major [R, C] matrix, read column-major,
// are its transpose: a [C, R] matrix with leading dimension C. So instead of C = op(A)·op(B) we
// ask cuBLAS for the transposed identity  Cᵀ = op(B)ᵀ · op(A)ᵀ, whose result written column-major
// is exactly the row-major C:
// - cuBLAS operand 1 is our B. Untransposed, B[K, N] row-major reads as Bᵀ [N×K] = op(B)ᵀ, so it
//   goes in as OP_N with rows N, cols K. Stored [N, K] (trans_b), it reads as [K×N] and needs
//   OP_T to become op(B)ᵀ.
// - cuBLAS operand 2 is our A, by the same argument: [K×M] with OP_N, or [M×K] with OP_T when
//   trans_a.
// - The result is [N×M] column-major with leading dimension N, i.e. row-major C[M, N]; cuBLAS's
//   (m, n, k) is our (N, M, K). The bias epilogue adds a vector along cuBLAS's rows, which are
//   our columns: bias[N] on every row, as nn.Linear wants.
//
// Algorithm choice: Note [pinned GEMM algorithms] in gemm_table.h.
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/check.h"
#include "model/cuda/cublas_check.h"
#include "model/cuda/device_buffer.h"
#include "model/cuda/gemm.h"
#include "model/cuda/gemm_table.h"
#include "model/cuda/gemm_tune.h"
#include "model/env.h"

namespace gtron::cuda {

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLAS's recommendation for Hopper
// Note [private capture workspaces] in gemm.h.
constexpr size_t kPrivateWorkspaceMax = size_t{1} << 20;
constexpr size_t kPrivateWorkspaceBudget = size_t{256} << 20;
constexpr size_t kPrivateChunkBytes = size_t{4} << 20;

// A cached choice: the algorithm, its index among the heuristic results, its workspace need.
struct Chosen {
  cublasLtMatmulAlgo_t algo = {};
  int index = 0;
  size_t workspace = 0;
};

// The per-device cuBLASLt state: handle, device name, per-stream workspaces, algorithm cache.
class GemmContext {
 public:
  explicit GemmContext(int device) {
    CUBLAS_CHECK(cublasLtCreate(&handle_));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    device_name_ = prop.name;
  }
  ~GemmContext() { cublasLtDestroy(handle_); }
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  cublasLtHandle_t handle() const { return handle_; }
  const std::string& device_name() const { return device_name_; }

  // A workspace private to `stream`: two streams running GEMMs at once never share one.
  void* workspace(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& ws = workspaces_[stream];
    if (!ws) ws = std::make_unique<DeviceBuffer>(kWorkspaceBytes);
    return ws->get();
  }

  // Note [private capture workspaces]: `bytes` (256-aligned) of workspace for one GEMM call of
  // capture `id`, never handed out again; null once the budget is spent.
  void* private_workspace(unsigned long long id, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    bytes = (bytes + 255) / 256 * 256;
    if (private_used_ + bytes > kPrivateWorkspaceBudget) return nullptr;
    if (chunks_.empty() || chunk_used_ + bytes > kPrivateChunkBytes) {
      chunks_.push_back(std::make_unique<DeviceBuffer>(kPrivateChunkBytes));
      chunk_used_ = 0;
    }
    void* p = static_cast<unsigned char*>(chunks_.back()->get()) + chunk_used_;
    chunk_used_ += bytes;
    private_used_ += bytes;
    by_capture_[id].push_back(WorkspaceRange{p, bytes});
    return p;
  }

  std::vector<WorkspaceRange> take_capture(unsigned long long id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_capture_.find(id);
    if (it == by_capture_.end()) return {};
    std::vector<WorkspaceRange> ranges = std::move(it->second);
    by_capture_.erase(it);
    return ranges;
  }

  // 1: cached choice in *chosen; 0: not asked yet; -1: known to have none.
  int find(const GemmKey& key, Chosen* chosen) {
    std::lock_guard<std::mutex> lock(mu_);
    if (unsupported_.count(key) != 0) return -1;
    auto it = algos_.find(key);
    if (it == algos_.end()) return 0;
    *chosen = it->second;
    return 1;
  }

  // The first choice for a key stays (two threads may race to make it).
  Chosen remember(const GemmKey& key, const Chosen& chosen) {
    std::lock_guard<std::mutex> lock(mu_);
    return algos_.emplace(key, chosen).first->second;
  }

  void remember_unsupported(const GemmKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    unsupported_.insert(key);
  }

  void forget_all() {
    std::lock_guard<std::mutex> lock(mu_);
    algos_.clear();
    unsupported_.clear();
  }

 private:
  cublasLtHandle_t handle_ = nullptr;
  std::string device_name_;
  std::mutex mu_;
  std::map<cudaStream_t, std::unique_ptr<DeviceBuffer>> workspaces_;
  std::vector<std::unique_ptr<DeviceBuffer>> chunks_;  // private capture workspaces
  size_t chunk_used_ = 0, private_used_ = 0;
  std::map<unsigned long long, std::vector<WorkspaceRange>> by_capture_;
  std::map<GemmKey, Chosen> algos_;
  std::set<GemmKey> unsupported_;
};

struct Contexts {
  std::mutex mu;
  std::map<int, std::unique_ptr<GemmContext>> by_device;
};

Contexts& contexts() {
  static Contexts c;
  return c;
}

GemmContext& context_for(int device) {
  Contexts& c = contexts();
  std::lock_guard<std::mutex> lock(c.mu);
  auto& ctx = c.by_device[device];
  if (!ctx) ctx = std::make_unique<GemmContext>(device);
  return *ctx;
}

GemmContext& current_context() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return context_for(device);
}

// RAII holders for the per-call descriptors.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  MatmulDesc() { CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F)); }
  ~MatmulDesc() { cublasLtMatmulDescDestroy(d); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  template <typename V>
  void set(cublasLtMatmulDescAttributes_t attr, const V& v) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
  }
};

// A column-major rows × cols matrix with leading dimension `rows`, batched by `stride` elements.
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t batch, int64_t stride) {
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows),
                                            static_cast<uint64_t>(cols), rows));
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, 4));
      CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                    &stride, sizeof(stride)));
    }
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(l); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p)); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(p); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  void set(cublasLtMatmulPreferenceAttributes_t attr, uint32_t v) {
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
  }
  void set64(cublasLtMatmulPreferenceAttributes_t attr, uint64_t v) {
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
  }
};

cudaDataType_t cuda_type(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

void check_args(const GemmArgs& g) {
  GTRON_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1, "gemm: m = ", g.m, ", n = ", g.n,
              ", k = ", g.k, ", batch = ", g.batch);
  if (g.fp8) {
    GTRON_CHECK(!g.trans_a && g.trans_b && g.batch == 1 && g.epilogue == Epilogue::kNone &&
                    g.scale_a != nullptr && g.scale_b != nullptr,
                "gemm: fp8 takes A [M, K] and B stored [N, K] (trans_b) with both scales, and no "
                "batch or epilogue");
    GTRON_CHECK(g.c_type == DType::kF32 || g.c_type == DType::kBF16, "gemm: fp8 C type ",
                dtype_name(g.c_type), ", expected f32 or bf16");
    GTRON_CHECK(g.bias == nullptr || g.bias_type == g.c_type || g.bias_type == DType::kF32,
                "gemm: bias type ", dtype_name(g.bias_type), " with C ", dtype_name(g.c_type),
                "; the bias is in C's type or f32");
    return;
  }
  GTRON_CHECK(g.ab == DType::kF32 || g.ab == DType::kBF16, "gemm: A/B type ", dtype_name(g.ab),
              ", expected f32 or bf16");
  GTRON_CHECK(g.c_type == DType::kF32 || (g.ab == DType::kBF16 && g.c_type == DType::kBF16),
              "gemm: C type ", dtype_name(g.c_type), " with A/B ", dtype_name(g.ab),
              "; f32 takes f32 C, bf16 takes bf16 or f32 C");
  GTRON_CHECK(g.bias == nullptr || g.bias_type == g.c_type || g.bias_type == DType::kF32,
              "gemm: bias type ", dtype_name(g.bias_type), " with C ", dtype_name(g.c_type),
              "; the bias is in C's type or f32");
}

// Whether `s` is capturing a graph now, and the capture's id.
bool capturing(cudaStream_t s, unsigned long long* id) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamGetCaptureInfo(s, &st, id) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return st == cudaStreamCaptureStatusActive;
}

// Whether tune mode may time candidates on `s` now: never while it captures a graph.
bool can_tune(cudaStream_t s) {
  if (!gemm_tune_enabled()) return false;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capture) != cudaSuccess) {
    cudaGetLastError();  // e.g. the legacy stream during another stream's global capture
    return false;
  }
  return capture == cudaStreamCaptureStatusNone;
}

// Up to `requested` heuristic results for the problem, for exactly the key's alignments (so a
// choice never meets a less aligned operand than it was picked for). Empty when cuBLASLt has none.
std::vector<cublasLtMatmulHeuristicResult_t> heuristics(GemmContext& ctx, const GemmArgs& g,
                                                        const GemmKey& key, const MatmulDesc& desc,
                                                        const Layout& op1, const Layout& op2,
                                                        const Layout& out, int requested) {
  Preference pref;
  pref.set64(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kWorkspaceBytes);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(key[kKeyAlignB]));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(key[kKeyAlignA]));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(key[kKeyAlignC]));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(key[kKeyAlignC]));
  std::vector<cublasLtMatmulHeuristicResult_t> results(requested);
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      ctx.handle(), desc.d, op1.l, op2.l, out.l, out.l, pref.p, requested, results.data(), &found);
  // An f32 bias on a bf16 output is refused with INVALID_VALUE by some cuBLASLt versions (13.0).
  const bool optional =
      (g.bias != nullptr && g.bias_type != g.c_type) || g.epilogue != Epilogue::kNone || g.fp8;
  if (st != CUBLAS_STATUS_NOT_SUPPORTED && !(optional && st == CUBLAS_STATUS_INVALID_VALUE)) {
    CUBLAS_CHECK(st);
  }
  results.resize(st == CUBLAS_STATUS_SUCCESS ? found : 0);
  return results;
}

// The algorithm for `key`: cached, else chosen once (Note [pinned GEMM algorithms] in
// gemm_table.h): in tune mode the timed choice among kGemmTuneCandidates results; else the pinned
// entry's result when the table has one and cuBLASLt returned that many; else result 0.
// False when cuBLASLt has none.
bool choose_algo(Chosen* chosen, GemmContext& ctx, const GemmArgs& g, const GemmKey& key,
                 const MatmulDesc& desc, const Layout& op1, const Layout& op2, const Layout& out,
                 cudaStream_t s) {
  const int known = ctx.find(key, chosen);
  if (known != 0) return known > 0;
  const bool tune = can_tune(s);
  // GTRON_GEMM_TABLE=0 ignores the committed table (an A/B switch for benchmarks).
  static const bool use_table = env_flag("GTRON_GEMM_TABLE", true);
  const std::optional<PinnedChoice> pinned =
      tune || !use_table ? std::nullopt
                         : find_tuned_gemm(ctx.device_name(), cublasLtGetVersion(), key);
  const int requested = tune ? kGemmTuneCandidates : pinned ? pinned->requested : 1;
  const std::vector<cublasLtMatmulHeuristicResult_t> results =
      heuristics(ctx, g, key, desc, op1, op2, out, requested);
  if (results.empty()) {
    ctx.remember_unsupported(key);
    return false;
  }
  const int found = static_cast<int>(results.size());
  int index = 0;
  if (tune) {
    const TuneCall call{ctx.handle(), desc.d,           op1.l,           op2.l,
                        out.l,        ctx.workspace(s), kWorkspaceBytes, s};
    // Whether result 0 of many is the algorithm a plain run (one result requested) takes.
    const auto single = heuristics(ctx, g, key, desc, op1, op2, out, 1);
    const bool same = !single.empty() && std::memcmp(&single[0].algo, &results[0].algo,
                                                     sizeof(cublasLtMatmulAlgo_t)) == 0;
    index = tune_gemm(call, g, key, ctx.device_name(), results.data(), found, same);
  } else if (pinned && pinned->index < found) {
    index = pinned->index;
  }
  *chosen = ctx.remember(key, Chosen{results[index].algo, index, results[index].workspaceSize});
  return true;
}

}  // namespace

void gemm(const GemmArgs& g, void* stream) {
  GTRON_CHECK(try_gemm(g, stream), "gemm: cuBLASLt has no algorithm for m = ", g.m, ", n = ", g.n,
              ", k = ", g.k, ", batch = ", g.batch, ", A/B ", g.fp8 ? "e4m3" : dtype_name(g.ab),
              g.fp8 && g.b_scales == Fp8Scales::kBlocks ? " (B in 128x128 blocks)" : "", ", C ",
              dtype_name(g.c_type), ", trans ", g.trans_a, "/", g.trans_b, g.bias ? ", bias " : "",
              g.bias ? dtype_name(g.bias_type) : "");
}

bool try_gemm(const GemmArgs& g, void* stream) {
  check_args(g);
  if (g.m == 0 || g.n == 0) return true;
  if (g.k == 0) {
    GTRON_CHECK(g.beta == 1.0f && g.bias == nullptr,
                "gemm: k = 0 leaves alpha·A·B empty; only beta = 1 without bias is supported");
    return true;
  }
  GemmContext& ctx = current_context();
  cudaStream_t s = static_cast<cudaStream_t>(stream);

  // Note [row-major through column-major cuBLAS]: operand 1 is B, operand 2 is A, result Cᵀ.
  const cudaDataType_t ab = g.fp8 ? CUDA_R_8F_E4M3 : cuda_type(g.ab);
  const cudaDataType_t ct = cuda_type(g.c_type);
  Layout op1(ab, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.batch, g.stride_b);
  Layout op2(ab, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.batch, g.stride_a);
  Layout out(ct, g.n, g.m, g.batch, g.stride_c);

  MatmulDesc desc;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA,
           static_cast<int32_t>(g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB,
           static_cast<int32_t>(g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
  if (g.fp8) {
    // cuBLAS's A is our B (Note [row-major through column-major cuBLAS]); our A takes 1x128 tiles.
    const auto mode_b = static_cast<int32_t>(g.b_scales == Fp8Scales::kBlocks
                                                 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F);
    const auto mode_a = static_cast<int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F);
    desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode_b);
    desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode_a);
    desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(g.scale_b));
    desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(g.scale_a));
  }
  if (g.epilogue != Epilogue::kNone) {
    GTRON_CHECK(g.c_type == DType::kBF16 && g.aux != nullptr && g.aux_ld >= g.n && g.batch == 1,
                "gemm: GELU epilogues take a bf16 C, an aux buffer of leading dimension >= n and "
                "no batch");
    GTRON_CHECK(g.epilogue == Epilogue::kGeluAux || g.bias == nullptr,
                "gemm: the DGELU epilogue takes no bias");
    const cublasLtEpilogue_t e =
        g.epilogue == Epilogue::kDGelu
            ? CUBLASLT_EPILOGUE_DGELU
            : (g.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX);
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(e));
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.aux_ld);
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, static_cast<int32_t>(ct));
    if (g.bias != nullptr) {
      desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
      desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_type(g.bias_type)));
    }
  } else if (g.bias != nullptr) {
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_BIAS));
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_type(g.bias_type)));
  }

  const GemmKey key = gemm_key(g);
  Chosen chosen;
  if (!choose_algo(&chosen, ctx, g, key, desc, op1, op2, out, s)) return false;
  if (gemm_tune_enabled()) count_tuned_call(key);
  void* d = g.d != nullptr ? g.d : g.c;
  void* ws = ctx.workspace(s);
  size_t ws_bytes = kWorkspaceBytes;
  unsigned long long capture = 0;
  if (chosen.workspace <= kPrivateWorkspaceMax &&
      capture_memsets_mode() == CaptureMemsets::kHoist && capturing(s, &capture)) {
    const size_t bytes = std::max<size_t>(chosen.workspace, 256);
    if (void* p = ctx.private_workspace(capture, bytes)) {
      ws = p;
      ws_bytes = bytes;
    }
  }
  CUBLAS_CHECK(cublasLtMatmul(ctx.handle(), desc.d, &g.alpha, g.b, op1.l, g.a, op2.l, &g.beta, g.c,
                              out.l, d, out.l, &chosen.algo, ws, ws_bytes, s));
  return true;
}

namespace {
// kHoist unless GTRON_CAPTURE_MEMSETS names another mode (a diagnostic: Note [small memsets as
// kernels]) or a test sets one.
CaptureMemsets initial_capture_memsets() {
  constexpr CaptureMemsets kModes[] = {CaptureMemsets::kHoist, CaptureMemsets::kKeep,
                                       CaptureMemsets::kKernels, CaptureMemsets::kAll};
  return kModes[env_choice("GTRON_CAPTURE_MEMSETS", {"hoist", "keep", "kernels", "all"}, 0)];
}
std::atomic<CaptureMemsets> g_capture_memsets{CaptureMemsets::kHoist};
// Reads the variable once, at the first use (a bad value throws there, as a user error, and again
// at the next use).
void init_capture_memsets() {
  static const bool done = [] {
    g_capture_memsets.store(initial_capture_memsets(), std::memory_order_relaxed);
    return true;
  }();
  (void)done;
}
}  // namespace

CaptureMemsets capture_memsets_mode() {
  init_capture_memsets();
  return g_capture_memsets.load(std::memory_order_relaxed);
}

void set_capture_memsets_for_testing(CaptureMemsets mode) {
  init_capture_memsets();
  g_capture_memsets.store(mode, std::memory_order_relaxed);
}

std::vector<WorkspaceRange> take_capture_workspaces(unsigned long long capture_id) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  GemmContext* ctx = nullptr;
  {
    Contexts& c = contexts();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.by_device.find(device);
    if (it != c.by_device.end()) ctx = it->second.get();
  }
  // A capture without GEMMs on a device that never ran one: no context to make.
  return ctx != nullptr ? ctx->take_capture(capture_id) : std::vector<WorkspaceRange>{};
}

int gemm_algo_index(const GemmArgs& g) {
  Chosen chosen;
  return current_context().find(gemm_key(g), &chosen) > 0 ? chosen.index : -1;
}

void pin_gemm_algo_for_testing(const GemmArgs& g, int index, int requested) {
  GemmContext& ctx = current_context();
  const GemmKey key = gemm_key(g);
  Chosen chosen;
  GTRON_CHECK(ctx.find(key, &chosen) == 0,
              "pin_gemm_algo_for_testing: the problem already has its algorithm; pin it first");
  add_tuned_gemm(TunedGemm{ctx.device_name(), cublasLtGetVersion(), key, index, requested});
}

void reset_gemm_algos_for_testing() {
  Contexts& c = contexts();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [device, ctx] : c.by_device) ctx->forget_all();
  clear_added_tuned_gemms();
}

}  // namespace gtron::cuda
