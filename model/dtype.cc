#include "model/dtype.h"

#include "model/check.h"

namespace gtron {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF64:
      return 8;
    case DType::kI32:
      return 4;
  }
  GTRON_CHECK(false, "unknown dtype");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF64:
      return "f64";
    case DType::kI32:
      return "i32";
  }
  GTRON_CHECK(false, "unknown dtype");
}

}  // namespace gtron
