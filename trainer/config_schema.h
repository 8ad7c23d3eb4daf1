// The config schema table (internal to //trainer:config; the public API is trainer/config.h).
//
// Each KeySpec ties one key path to its type, default, bounds, doc and the Config field it reads
// and writes. The table order is the order of resolved_json() and of the Markdown table.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config.h"

namespace gtron {
namespace config_internal {

// Throws the UserError of a config fault: "config error: <what>. Hint: <hint>".
[[noreturn]] void fail(const std::string& what, const std::string& hint);

// model.moe, mtp.moe and parallel.ep against the other keys (config_moe.cc).
void check_moe(const Config& c);
// parallel.ep against the data ranks (world_size / parallel.tp) of a run (config_moe.cc).
void check_expert_parallel_world(const Config& c, int world_size);
// data.document_masking against the data source and the model's layout (config_data.cc).
void check_document_masking(const Config& c);

enum class KeyType { kInt, kFloat, kBool, kString, kEnum };

// Bounds of a numeric key; an absent bound is unbounded. Int keys compare as doubles, exact for
// every value a config uses (|x| < 2^53).
struct Range {
  std::optional<double> lo;
  std::optional<double> hi;
  bool lo_open = false;  // lo itself is excluded
  bool hi_open = false;  // hi itself is excluded

  bool contains(double x) const;
  std::string describe() const;  // ">= 1", "> 0", "[0, 1)", "any"
};

struct KeySpec {
  std::string path;  // "model.n_layer"
  KeyType type = KeyType::kInt;
  nlohmann::json default_value;      // in the key's JSON form (an enum as its name)
  Range range;                       // kInt and kFloat only
  bool non_empty = false;            // kString only: "" is rejected
  std::vector<std::string> allowed;  // kEnum only, in the enum's declaration order
  std::string doc;                   // one line, for the Markdown table
  // get: the field as JSON (an enum as its name). set: writes a value already checked against this
  // spec (ints as JSON integers, floats as numbers, enums as one of `allowed`).
  std::function<nlohmann::json(const Config&)> get;
  std::function<void(Config&, const nlohmann::json&)> set;
};

// The table, built once on first use (thread-safe static init).
const std::vector<KeySpec>& schema();

// The spec of a key path, or nullptr.
const KeySpec* find_key(const std::string& path);

// True when `path` names a section ("model", "data.synthetic"): a strict prefix of a key path.
bool is_section(const std::string& path);

const char* type_name(KeyType t);  // "int", "float", "bool", "string", "enum"

// Key-name helpers for messages.
std::string join(const std::vector<std::string>& items, const std::string& sep);
std::vector<std::string> split_path(const std::string& path);  // "a.b.c" -> {"a", "b", "c"}
size_t edit_distance(const std::string& a, const std::string& b);
std::string last_part(const std::string& path);  // "model.n_layer" -> "n_layer"
// The first schema key inside a section, for examples in hints.
std::string first_key_under(const std::string& section);
// "did you mean ...?" or the names of the enclosing section, then a pointer to print-config.
std::string unknown_key_hint(const std::string& path);

}  // namespace config_internal
}  // namespace gtron
