// model/env.h.
#include "model/env.h"

#include <cstdlib>

#include "model/check.h"

namespace gtron {

const char* env_value(const char* name) {
  const char* e = std::getenv(name);
  return e != nullptr && *e != '\0' ? e : nullptr;
}

bool env_flag(const char* name, bool def) { return env_choice(name, {"0", "1"}, def ? 1 : 0) == 1; }

int env_choice(const char* name, const std::vector<std::string>& choices, int def_index) {
  const char* e = env_value(name);
  if (e == nullptr) return def_index;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i] == e) return static_cast<int>(i);
  }
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i) list += (i == 0 ? "" : ", ") + choices[i];
  throw UserError(str_cat(name, " = \"", e, "\"; expected one of: ", list));
}

}  // namespace gtron
