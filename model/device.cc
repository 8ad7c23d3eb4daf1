#include "model/device.h"

namespace gtron {

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

}  // namespace gtron
