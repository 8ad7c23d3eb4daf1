// Error handling, one policy everywhere.
//
// - UserError: bad configs, flags, shapes or files. Carries a message naming the thing, what was
// got,
//   what was expected and a hint. The CLI catches it, prints it and exits with code 2.
// - GTRON_CHECK: a broken internal invariant. Prints the condition, file and line, then aborts.
// - Backend call checks (CUDA_CHECK, CUBLAS_CHECK, NCCL_CHECK) are built on GTRON_CHECK_CALL in the
//   backend sources, so they report the call, file, line and device the same way.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace gtron {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] void check_failed(const char* cond, const char* file, int line,
                               const std::string& msg);

// Builds a message from stream-able pieces: str_cat("got ", n, " rows").
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace gtron

#define GTRON_CHECK(cond, ...)                                                         \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      ::gtron::check_failed(#cond, __FILE__, __LINE__, ::gtron::str_cat(__VA_ARGS__)); \
    }                                                                                  \
  } while (0)
