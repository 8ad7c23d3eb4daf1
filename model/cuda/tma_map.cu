// Host-side tensor maps (model/cuda/tma_map.h).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/check.h"
#include "model/cuda/check.h"
#include "model/cuda/tma_map.h"

namespace gtron::cuda::tma {

namespace {

constexpr int kPanel = 64;             // bf16 columns of a 128-byte swizzled panel
constexpr cuuint32_t kCodesBox = 128;  // e4m3 codes of a 128-byte swizzled row

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                cudaEnableDefault, &found));
    GTRON_CHECK(found == cudaDriverEntryPointSuccess && f != nullptr,
                "tma: the driver has no cuTensorMapEncodeTiled (CUDA 12.0+ driver needed)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

CUtensorMap head_map(const void* base, int HS, int heads, int T, int B, int64_t ld, int64_t batch,
                     int rows) {
  // With one batch its stride is never used; any stride past the rows keeps the map valid.
  const int64_t batch_stride = B > 1 ? batch : ld * T;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(HS), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(T), static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(HS) * 2, static_cast<cuuint64_t>(ld) * 2,
                                 static_cast<cuuint64_t>(batch_stride) * 2};
  const cuuint32_t box[4] = {kPanel, 1, static_cast<cuuint32_t>(rows), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r = encode_tiled()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  GTRON_CHECK(r == CUDA_SUCCESS, "tma: cuTensorMapEncodeTiled failed (", static_cast<int>(r),
              ") for HS ", HS, ", ", heads, " heads, T ", T, ", B ", B, ", row stride ", ld,
              ", batch stride ", batch_stride);
  return map;
}

CUtensorMap codes_map(const void* base, int64_t rows, int64_t cols, int box_rows) {
  GTRON_CHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0 && cols % 16 == 0 && box_rows > 0 &&
                  box_rows <= 256,
              "tma: fp8 codes map of [", rows, ", ", cols, "] at ", base, ", box rows ", box_rows,
              "; expected a 16-byte aligned base, columns a multiple of 16, box rows in 1..256");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols)};
  const cuuint32_t box[2] = {kCodesBox, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  CUtensorMap map;
  const CUresult r =
      encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides,
                     box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  GTRON_CHECK(r == CUDA_SUCCESS, "tma: cuTensorMapEncodeTiled failed (", static_cast<int>(r),
              ") for fp8 codes [", rows, ", ", cols, "], box rows ", box_rows);
  return map;
}

}  // namespace gtron::cuda::tma
