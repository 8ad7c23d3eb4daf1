// linear on CUDA: three cuBLASLt GEMMs (model/cuda/gemm.h) plus the bias pieces.
//
//   forward  y  = x · wᵀ (+ b)   GEMM (M, N, K) = (N, Cout, Cin), B transposed; bias epilogue
//                                 (an f32 bias on bf16 y too)
//   backward dx += dy · w        GEMM (N, Cin, Cout), beta = 1, C in act
//            dw += dyᵀ · x       GEMM (Cout, Cin, N), A transposed, beta = 1, C in f32 or act
//                                 (beta = 0 on a gradient's first write: Note [first gradient
//                                 write] in parallel/ddp.h)
//            db += Σ_rows dy     one pass over dy, 16-byte loads, fixed-order partials and a
//                                 tree finish (Note [one-pass column sums] in
//                                 model/cuda/column_sum.cuh). cuBLASLt's BGRADB epilogue on the
//                                 dw GEMM ran as a separate kernel that moved the same bytes
//                                 slower (1.12 ms a step for GPT-2 124M, against ~0.65 ms of
//                                 bandwidth), so it is not used.
#include <algorithm>

#include "model/cuda/column_sum.cuh"
#include "model/cuda/gemm.h"
#include "model/cuda/kernel_util.cuh"
#include "model/ops/linear.h"

namespace gtron::cuda {

namespace {

// y[r, c] += bias[c] for an fp32 bias on bf16 activations, where cuBLASLt has no epilogue for it.
// One block per row (grid-stride): no per-element 64-bit modulo to find the column.
template <typename T>
__global__ void add_bias_kernel(T* y, const float* __restrict__ bias, int64_t N, int64_t C) {
  const int Ci = static_cast<int>(C);
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    T* row = y + n * C;
    for (int c = threadIdx.x; c < Ci; c += blockDim.x)
      row[c] = from_float<T>(to_float(row[c]) + bias[c]);
  }
}

}  // namespace

void linear_forward(const void* x, const void* w, const void* bias, DType bias_dtype, void* y,
                    int64_t N, int64_t Cin, int64_t Cout, DType act, void* stream,
                    const void* residual) {
  GTRON_CHECK(act == DType::kF32 || act == DType::kBF16, "linear: CUDA activations are f32 or ",
              "bf16; got ", dtype_name(act));
  GTRON_CHECK(bias == nullptr || bias_dtype == act || bias_dtype == DType::kF32, "linear: bias ",
              dtype_name(bias_dtype), " with ", dtype_name(act), " activations");
  GemmArgs g;
  g.a = x;
  g.b = w;
  g.trans_b = true;  // w is stored [Cout, Cin]
  g.c = y;
  g.m = N;
  g.n = Cout;
  g.k = Cin;
  g.ab = act;
  g.c_type = act;
  g.bias = bias;
  g.bias_type = bias_dtype;
  if (residual != nullptr) {
    GTRON_CHECK(residual != y, "linear: the residual must not be the output");
    g.c = const_cast<void*>(residual);  // read only
    g.d = y;
    g.beta = 1.0f;
  }
  // The bias rides in the epilogue (an f32 bias on bf16 outputs is added before the one
  // rounding); only where cuBLASLt offers no such algorithm does a separate pass add it.
  if (bias == nullptr || bias_dtype == act) {
    gemm(g, stream);
    return;
  }
  if (try_gemm(g, stream)) return;
  g.bias = nullptr;
  gemm(g, stream);
  if (N * Cout > 0) {
    constexpr int kThreads = 256;
    add_bias_kernel<bf16><<<static_cast<unsigned>(std::min<int64_t>(N, int64_t{1} << 30)), kThreads,
                            0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<bf16*>(y), static_cast<const float*>(bias), N, Cout);
    CUDA_CHECK_LAUNCH();
  }
}

int64_t linear_backward_scratch_floats(int64_t N, int64_t Cout) {
  return dense_column_scratch_floats(N, Cout);
}

void linear_bias_grad_from_partials(const float* partial, int64_t chunks, int64_t Cout, float* db,
                                    void* stream) {
  if (Cout == 0 || db == nullptr) return;
  GTRON_CHECK(partial != nullptr && chunks >= 1, "linear: bias partials of ", chunks, " chunks");
  column_tree_finish<1>(partial, chunks, Cout, db, nullptr, static_cast<cudaStream_t>(stream));
}

void linear_backward(const void* x, const void* w, const void* dy, void* dx, void* dw,
                     DType dw_dtype, float* db, float* scratch, int64_t N, int64_t Cin,
                     int64_t Cout, DType act, void* stream, bool dx_overwrite, bool dw_overwrite) {
  GTRON_CHECK(act == DType::kF32 || act == DType::kBF16, "linear: CUDA activations are f32 or ",
              "bf16; got ", dtype_name(act));
  if (dx != nullptr) {
    GemmArgs g;
    g.a = dy;
    g.b = w;
    g.c = dx;
    g.m = N;
    g.n = Cin;
    g.k = Cout;
    g.ab = act;
    g.c_type = act;
    g.beta = dx_overwrite ? 0.0f : 1.0f;
    gemm(g, stream);
  }
  if (dw != nullptr && dw_overwrite && N == 0) {  // no rows: the written gradient is zero
    CUDA_CHECK(cudaMemsetAsync(dw, 0, static_cast<size_t>(Cout * Cin) * dtype_size(dw_dtype),
                               static_cast<cudaStream_t>(stream)));
  } else if (dw != nullptr) {
    GemmArgs g;
    g.a = dy;
    g.trans_a = true;  // dy is stored [N, Cout] = [K, M]
    g.b = x;           // x is stored [N, Cin] = [K, N]
    g.c = dw;
    g.m = Cout;
    g.n = Cin;
    g.k = N;
    g.ab = act;
    g.c_type = dw_dtype;  // gemm() checks it is f32 or act
    g.beta = dw_overwrite ? 0.0f : 1.0f;
    gemm(g, stream);
  }
  if (db != nullptr) {
    dispatch_act("linear", act, [&](auto tag) {
      using T = decltype(tag);
      dense_column_sums<T>(static_cast<const T*>(dy), N, Cout, scratch, db,
                           static_cast<cudaStream_t>(stream));
    });
  }
}

}  // namespace gtron::cuda
