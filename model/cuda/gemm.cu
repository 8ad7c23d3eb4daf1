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
#include <cublasLt.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "model/cuda/check.h"
#include "model/cuda/gemm.h"

#define CUBLAS_CHECK(expr)                                                               \
  do {                                                                                   \
    cublasStatus_t st_ = (expr);                                                         \
    GTRON_CHECK_CALL(st_ == CUBLAS_STATUS_SUCCESS, #expr, cublasLtGetStatusString(st_)); \
  } while (0)

namespace gtron::cuda {

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLAS's recommendation for Hopper

// (problem, pointer alignments) -> algorithm; see GemmContext::algo.
using GemmKey = std::array<int64_t, 20>;

// Device memory owned for the life of the context. Non-copyable; the destructor never throws
// (at process exit the runtime may already be unloading, so its error is ignored).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { CUDA_CHECK(cudaMalloc(&ptr_, bytes)); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// The per-device cuBLASLt state: handle, per-stream workspaces, algorithm cache.
class GemmContext {
 public:
  GemmContext() { CUBLAS_CHECK(cublasLtCreate(&handle_)); }
  ~GemmContext() { cublasLtDestroy(handle_); }
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  cublasLtHandle_t handle() const { return handle_; }

  // A workspace private to `stream`: two streams running GEMMs at once never share one.
  void* workspace(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& ws = workspaces_[stream];
    if (!ws) ws = std::make_unique<DeviceBuffer>(kWorkspaceBytes);
    return ws->get();
  }

  // 1: cached algorithm in *algo; 0: not asked yet; -1: known to have none.
  int find(const GemmKey& key, cublasLtMatmulAlgo_t* algo) {
    std::lock_guard<std::mutex> lock(mu_);
    if (unsupported_.count(key) != 0) return -1;
    auto it = algos_.find(key);
    if (it == algos_.end()) return 0;
    *algo = it->second;
    return 1;
  }

  void remember(const GemmKey& key, const cublasLtMatmulAlgo_t& algo) {
    std::lock_guard<std::mutex> lock(mu_);
    algos_.emplace(key, algo);
  }

  void remember_unsupported(const GemmKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    unsupported_.insert(key);
  }

 private:
  cublasLtHandle_t handle_ = nullptr;
  std::mutex mu_;
  std::map<cudaStream_t, std::unique_ptr<DeviceBuffer>> workspaces_;
  std::map<GemmKey, cublasLtMatmulAlgo_t> algos_;
  std::set<GemmKey> unsupported_;
};

GemmContext& context_for(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<GemmContext>> contexts;
  std::lock_guard<std::mutex> lock(mu);
  auto& ctx = contexts[device];
  if (!ctx) ctx = std::make_unique<GemmContext>();
  return *ctx;
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

// The largest power of two (<= 256) dividing the address and, for batches, the byte stride:
// every matrix of the batch is at least that aligned.
uint32_t alignment(const void* p, int64_t batch, int64_t stride_bytes) {
  uint64_t v = reinterpret_cast<uintptr_t>(p);
  if (batch > 1) v |= static_cast<uint64_t>(stride_bytes);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

void check_args(const GemmArgs& g) {
  GTRON_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1, "gemm: m = ", g.m, ", n = ", g.n,
              ", k = ", g.k, ", batch = ", g.batch);
  GTRON_CHECK(g.ab == DType::kF32 || g.ab == DType::kBF16, "gemm: A/B type ", dtype_name(g.ab),
              ", expected f32 or bf16");
  GTRON_CHECK(g.c_type == DType::kF32 || (g.ab == DType::kBF16 && g.c_type == DType::kBF16),
              "gemm: C type ", dtype_name(g.c_type), " with A/B ", dtype_name(g.ab),
              "; f32 takes f32 C, bf16 takes bf16 or f32 C");
  GTRON_CHECK(g.bias == nullptr || g.bias_type == g.c_type || g.bias_type == DType::kF32,
              "gemm: bias type ", dtype_name(g.bias_type), " with C ", dtype_name(g.c_type),
              "; the bias is in C's type or f32");
}

// The algorithm for `g`: cached per problem and pointer alignments, else cuBLASLt's first
// heuristic choice for exactly those alignments (so a cached choice never meets a less aligned
// operand than it was picked for). False when cuBLASLt has none.
bool choose_algo(cublasLtMatmulAlgo_t* chosen, GemmContext& ctx, const GemmArgs& g,
                 const MatmulDesc& desc, const Layout& op1, const Layout& op2, const Layout& out) {
  const int64_t ab_size = dtype_size(g.ab);
  const int64_t c_size = dtype_size(g.c_type);
  const uint32_t align1 = alignment(g.b, g.batch, g.stride_b * ab_size);
  const uint32_t align2 = alignment(g.a, g.batch, g.stride_a * ab_size);
  const uint32_t align_c = alignment(g.c, g.batch, g.stride_c * c_size);
  const uint32_t align_bias = g.bias ? alignment(g.bias, 1, 0) : 0;
  const GemmKey key = {g.m,
                       g.n,
                       g.k,
                       g.batch,
                       g.stride_a,
                       g.stride_b,
                       g.stride_c,
                       g.trans_a,
                       g.trans_b,
                       static_cast<int64_t>(g.ab),
                       static_cast<int64_t>(g.c_type),
                       align1,
                       align2,
                       align_c,
                       align_bias,
                       g.bias != nullptr,
                       g.bias != nullptr ? static_cast<int64_t>(g.bias_type) : -1,
                       g.beta == 0.0f,
                       static_cast<int64_t>(g.epilogue),
                       g.aux ? alignment(g.aux, 1, 0) + 1000 * g.aux_ld : 0};
  const int known = ctx.find(key, chosen);
  if (known != 0) return known > 0;
  Preference pref;
  pref.set64(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kWorkspaceBytes);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align1);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align2);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c);
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      ctx.handle(), desc.d, op1.l, op2.l, out.l, out.l, pref.p, 1, &result, &found);
  // An f32 bias on a bf16 output is refused with INVALID_VALUE by some cuBLASLt versions (13.0).
  const bool optional =
      (g.bias != nullptr && g.bias_type != g.c_type) || g.epilogue != Epilogue::kNone;
  if (st != CUBLAS_STATUS_NOT_SUPPORTED && !(optional && st == CUBLAS_STATUS_INVALID_VALUE)) {
    CUBLAS_CHECK(st);
  }
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    ctx.remember_unsupported(key);
    return false;
  }
  ctx.remember(key, result.algo);
  *chosen = result.algo;
  return true;
}

}  // namespace

void gemm(const GemmArgs& g, void* stream) {
  GTRON_CHECK(try_gemm(g, stream), "gemm: cuBLASLt has no algorithm for m = ", g.m, ", n = ", g.n,
              ", k = ", g.k, ", batch = ", g.batch, ", A/B ", dtype_name(g.ab), ", C ",
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
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  GemmContext& ctx = context_for(device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);

  // Note [row-major through column-major cuBLAS]: operand 1 is B, operand 2 is A, result Cᵀ.
  const cudaDataType_t ab = cuda_type(g.ab);
  const cudaDataType_t ct = cuda_type(g.c_type);
  Layout op1(ab, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.batch, g.stride_b);
  Layout op2(ab, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.batch, g.stride_a);
  Layout out(ct, g.n, g.m, g.batch, g.stride_c);

  MatmulDesc desc;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA,
           static_cast<int32_t>(g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB,
           static_cast<int32_t>(g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
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

  cublasLtMatmulAlgo_t algo;
  if (!choose_algo(&algo, ctx, g, desc, op1, op2, out)) return false;
  CUBLAS_CHECK(cublasLtMatmul(ctx.handle(), desc.d, &g.alpha, g.b, op1.l, g.a, op2.l, &g.beta, g.c,
                              out.l, g.c, out.l, &algo, ctx.workspace(s), kWorkspaceBytes, s));
  return true;
}

}  // namespace gtron::cuda
