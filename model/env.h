// The GTRON_* environment switches (A/B switches and diagnostics, docs/gpu.md), read through one
// place so that a value outside what a switch takes is a UserError naming the variable and its
// values, never a silent default.
#pragma once

#include <atomic>
#include <string>
#include <vector>

namespace gtron {

// `name`'s value when set and not empty, else nullptr.
const char* env_value(const char* name);

// A switch: unset or empty gives `def`; "1" on, "0" off; anything else is a UserError.
bool env_flag(const char* name, bool def);

// The index in `choices` of `name`'s value; unset or empty gives `def_index`; a value not among
// the choices is a UserError that lists them.
int env_choice(const char* name, const std::vector<std::string>& choices, int def_index);

// A switch read at its first use and then kept in `slot` (-1: not read yet; a test's setter may
// store a value first): slot's value, filled with read() when it is still -1.
template <typename Read>
int env_once(std::atomic<int>& slot, Read read) {
  int v = slot.load();
  if (v < 0) {
    v = read();
    slot.store(v);
  }
  return v;
}

}  // namespace gtron
