// The fused MLP GEMMs (contract in model/ops/fused_mlp.h): cuBLASLt's GELU_AUX_BIAS and DGELU
// epilogues, with the GEMM + elementwise-kernel pair as the fallback where cuBLASLt offers none.
#include "model/cuda/gemm.h"
#include "model/cuda/kernel_util.cuh"
#include "model/ops/fused_mlp.h"
#include "model/ops/gelu.h"

namespace gtron::cuda {

void linear_gelu_forward(const void* x, const void* w, const void* bias, void* pre, void* g,
                         int64_t N, int64_t Cin, int64_t Cout, void* stream) {
  GemmArgs a;
  a.a = x;
  a.b = w;
  a.trans_b = true;  // w is [Cout, Cin]
  a.c = g;
  a.m = N;
  a.n = Cout;
  a.k = Cin;
  a.ab = DType::kBF16;
  a.c_type = DType::kBF16;
  a.bias = bias;
  a.bias_type = DType::kBF16;
  a.epilogue = Epilogue::kGeluAux;
  a.aux = pre;
  a.aux_ld = Cout;
  if (try_gemm(a, stream)) return;
  a.epilogue = Epilogue::kNone;
  a.aux = nullptr;
  a.c = pre;
  gemm(a, stream);
  gelu_forward(pre, g, N * Cout, DType::kBF16, stream);
}

bool dgelu_backward(const void* dy, const void* w, const void* pre, void* dpre, int64_t N,
                    int64_t Cin, int64_t Cout, void* stream) {
  GemmArgs a;
  a.a = dy;
  a.b = w;  // [Cout, Cin] = [K, N]
  a.c = dpre;
  a.m = N;
  a.n = Cin;
  a.k = Cout;
  a.ab = DType::kBF16;
  a.c_type = DType::kBF16;
  a.epilogue = Epilogue::kDGelu;
  a.aux = const_cast<void*>(pre);  // read only by DGELU
  a.aux_ld = Cin;
  return try_gemm(a, stream);
}

}  // namespace gtron::cuda
