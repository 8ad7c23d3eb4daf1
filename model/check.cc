#include "model/check.h"

#include <cstdio>
#include <cstdlib>

namespace gtron {

void check_failed(const char* cond, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "gtron: internal check failed: %s at %s:%d%s%s\n", cond, file, line,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace gtron
