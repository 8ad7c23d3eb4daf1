// Reading, checking and printing configs (Note [config schema] in config.h).
//
// Policy: checks run in a fixed order, so a config with several faults always reports the same one:
//   1. the source: the file opens, its JSON parses, the top level is an object;
//   2. the overrides: each has the form key.path=value and names a schema key;
//   3. the file's structure: no unknown or dotted keys, sections are objects (in key order);
//   4. each key's value against its spec: type, range, enum name (in schema order);
//   5. combinations of keys; validate() adds those that need the world size.
// Every message reads "config error: <key path> = <value received>: <what is allowed>. Hint: ...".

#include "trainer/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "model/check.h"
#include "trainer/config_schema.h"

namespace gtron {

namespace config_internal {
void fail(const std::string& what, const std::string& hint) {
  throw UserError("config error: " + what + ". Hint: " + hint);
}
}  // namespace config_internal

namespace {

using config_internal::edit_distance;
using config_internal::fail;
using config_internal::find_key;
using config_internal::first_key_under;
using config_internal::is_section;
using config_internal::join;
using config_internal::KeySpec;
using config_internal::KeyType;
using config_internal::last_part;
using config_internal::schema;
using config_internal::split_path;
using config_internal::unknown_key_hint;
using json = nlohmann::json;

// A value as the user wrote it, cut short when long (a whole section given by mistake).
std::string show_value(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() <= 80 ? s : s.substr(0, 77) + "...";
}

// Where each key's value came from, for messages.
struct Origin {
  std::string source;                // the file name, or "config text"
  std::set<std::string> overridden;  // key paths given by --set
};

std::string show(const std::string& path, const json& v, const Origin* origin = nullptr) {
  std::string s = path + " = " + show_value(v);
  if (origin && origin->overridden.count(path)) s += " (from --set)";
  return s;
}

std::string pointer_of(const std::string& path) {
  std::string p = "/" + path;
  std::replace(p.begin(), p.end(), '.', '/');
  return p;
}

// Step 3: every key of the file is a schema key or a section, and sections are objects.
void check_structure(const json& obj, const std::string& prefix, const Origin& origin) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it.key().empty() || it.key().find('.') != std::string::npos) {
      fail(str_cat(show(path, *it), ": keys in ", origin.source, " must be plain names"),
           "nest sections as objects, e.g. {\"model\": {\"n_layer\": 4}}, or use --set "
           "model.n_layer=4");
    }
    if (find_key(path)) continue;  // its value is checked in step 4
    if (is_section(path)) {
      if (it->is_null()) continue;  // a null section keeps its defaults (model.rope_scaling)
      if (!it->is_object()) {
        fail(str_cat(show(path, *it), ": is a section in ", origin.source,
                     " and must be a JSON object"),
             str_cat("e.g. \"", it.key(), "\": {\"", last_part(first_key_under(path)),
                     "\": ...}; `gtron print-config` shows its keys"));
      }
      check_structure(*it, path, origin);
      continue;
    }
    fail(str_cat(show(path, *it), ": unknown key in ", origin.source), unknown_key_hint(path));
  }
}

// Note [auto switches]
// A switch with an "auto" setting (train.transient_grads) is an enum key whose names are "auto",
// "false" and "true". Its true and false are written as JSON booleans, as for a bool key, so a
// config or checkpoint written when the key was a bool still reads: checked_enum() takes a JSON
// boolean for such a key, and the schema writes the key back as a boolean or "auto".
bool takes_bools(const KeySpec& k) {
  const auto has = [&](const char* n) {
    return std::find(k.allowed.begin(), k.allowed.end(), n) != k.allowed.end();
  };
  return k.type == KeyType::kEnum && has("true") && has("false");
}

std::string describe_allowed(const KeySpec& k) {
  switch (k.type) {
    case KeyType::kInt:
    case KeyType::kFloat:
      return k.range.describe();
    case KeyType::kBool:
      return "true, false";
    case KeyType::kString:
      return k.non_empty ? "non-empty string" : "any string";
    case KeyType::kEnum: {
      std::vector<std::string> quoted;
      for (const std::string& a : k.allowed) {
        const bool bare = takes_bools(k) && (a == "true" || a == "false");
        quoted.push_back(bare ? a : "\"" + a + "\"");
      }
      return join(quoted, ", ");
    }
  }
  return "";
}

std::string default_hint(const KeySpec& k) {
  return "the default is " + show_value(k.default_value);
}

[[noreturn]] void fail_range(const KeySpec& k, const json& v, const Origin* origin) {
  const bool interval = k.range.lo && k.range.hi;
  fail(str_cat(show(k.path, v, origin), ": must be ", interval ? "in " : "", k.range.describe()),
       default_hint(k));
}

json checked_int(const KeySpec& k, const json& v, const Origin* origin) {
  int64_t n = 0;
  const bool integral = v.is_number() && std::floor(v.get<double>()) == v.get<double>();
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}) {
    fail_range(k, v, origin);
  } else if (v.is_number_integer()) {
    n = v.get<int64_t>();
  } else if (v.is_number_float() && integral && std::fabs(v.get<double>()) < 9.2e18) {
    n = static_cast<int64_t>(v.get<double>());  // 2e6 is a fine way to write an integer
  } else {
    const std::string got = !v.is_number() ? str_cat("got a JSON ", v.type_name())
                            : integral     ? "got a number beyond 64-bit integers"
                                           : "got a non-integral number";
    fail(str_cat(show(k.path, v, origin), ": expected an integer, ", got),
         str_cat("write a whole number without quotes; ", default_hint(k)));
  }
  if (!k.range.contains(static_cast<double>(n))) fail_range(k, v, origin);
  return n;
}

json checked_float(const KeySpec& k, const json& v, const Origin* origin) {
  if (!v.is_number()) {
    fail(str_cat(show(k.path, v, origin), ": expected a number, got a JSON ", v.type_name()),
         str_cat("write a number without quotes; ", default_hint(k)));
  }
  // 1e999 parses as inf, which every range below would admit: a float key takes finite numbers.
  if (!std::isfinite(v.get<double>())) {
    fail(str_cat(show(k.path, v, origin), ": must be a finite number"), default_hint(k));
  }
  if (!k.range.contains(v.get<double>())) fail_range(k, v, origin);
  return v.get<double>();
}

json checked_enum(const KeySpec& k, const json& v, const Origin* origin) {
  const std::string allowed = describe_allowed(k);
  if (v.is_boolean() && takes_bools(k)) return v.get<bool>() ? "true" : "false";
  if (!v.is_string()) {
    fail(str_cat(show(k.path, v, origin), ": expected one of ", allowed, ", got a JSON ",
                 v.type_name()),
         "put the name in double quotes");
  }
  const std::string name = v.get<std::string>();
  if (std::find(k.allowed.begin(), k.allowed.end(), name) != k.allowed.end()) return v;
  std::string near = k.allowed.front();
  for (const std::string& a : k.allowed) {
    if (edit_distance(name, a) < edit_distance(name, near)) near = a;
  }
  fail(str_cat(show(k.path, v, origin), ": must be one of ", allowed),
       edit_distance(name, near) <= 2 ? "did you mean \"" + near + "\"?" : default_hint(k));
}

// Step 4: checks one value against its spec and returns it in the form KeySpec::set takes.
json checked_value(const KeySpec& k, const json& v, const Origin* origin) {
  switch (k.type) {
    case KeyType::kInt:
      return checked_int(k, v, origin);
    case KeyType::kFloat:
      return checked_float(k, v, origin);
    case KeyType::kBool:
      if (!v.is_boolean()) {
        fail(str_cat(show(k.path, v, origin), ": expected true or false, got a JSON ",
                     v.type_name()),
             "write true or false without quotes");
      }
      return v;
    case KeyType::kString:
      if (!v.is_string()) {
        fail(str_cat(show(k.path, v, origin), ": expected a string, got a JSON ", v.type_name()),
             "put the value in double quotes");
      }
      if (k.non_empty && v.get<std::string>().empty()) {
        fail(str_cat(show(k.path, v, origin), ": must not be empty"),
             str_cat(default_hint(k), "; use \".\" for the current directory"));
      }
      return v;
    case KeyType::kEnum:
      break;
  }
  return checked_enum(k, v, origin);
}

// Step 2: "key.path=value" -> (key path, JSON value).
std::pair<std::string, json> parse_override(const std::string& text) {
  const size_t eq = text.find('=');
  auto trim = [](std::string s) {
    const char* ws = " \t\r\n";
    s.erase(0, s.find_first_not_of(ws));
    s.erase(s.find_last_not_of(ws) + 1);
    return s;
  };
  const std::string path = eq == std::string::npos ? "" : trim(text.substr(0, eq));
  if (path.empty()) {
    fail(str_cat("--set \"", text, "\": expected key.path=value"),
         "e.g. --set train.steps=100 or --set train.device=cpu");
  }
  const std::string raw = text.substr(eq + 1);
  const KeySpec* k = find_key(path);
  if (!k) {
    fail(str_cat("--set ", path, "=", raw, ": ",
                 is_section(path) ? "is a section, not a key" : "unknown key"),
         is_section(path) ? "set its keys one by one, e.g. --set " + first_key_under(path) + "=..."
                          : unknown_key_hint(path));
  }
  json v = json::parse(raw, nullptr, /*allow_exceptions=*/false);
  const bool wants_text = k->type == KeyType::kString || k->type == KeyType::kEnum;
  if (v.is_discarded() || (wants_text && !v.is_string())) v = raw;  // a bare string
  return {path, v};
}

// The value at a key path in a checked tree, or nullptr.
const json* value_at(const json& tree, const std::string& path) {
  const json* node = &tree;
  for (const std::string& part : split_path(path)) {
    auto it = node->find(part);
    if (it == node->end()) return nullptr;
    node = &*it;
  }
  return node;
}

// Nearest divisors of n below and above d, as "a or b" (for hints).
std::string nearby_divisors(int64_t n, int64_t d) {
  int64_t lo = std::min(d, n), hi = d;
  while (lo > 1 && n % lo != 0) --lo;
  while (hi < n && n % hi != 0) ++hi;
  return lo == hi || hi > n ? std::to_string(lo) : str_cat(lo, " or ", hi);
}

// train.global_batch must split evenly into micro-batches over `ranks` data ranks.
void check_batch(const Config& c, int64_t ranks, const std::string& ranks_text) {
  const TrainConfig& t = c.train;
  if (t.global_batch % t.micro_batch == 0 && (t.global_batch / t.micro_batch) % ranks == 0) return;
  const int64_t unit = t.micro_batch * ranks;
  const std::string times = ranks == 1 ? "" : str_cat(" × data ranks (", ranks_text, ") = ", unit);
  fail(str_cat("train.global_batch = ", t.global_batch,
               ": must be a multiple of train.micro_batch (", t.micro_batch, ")", times),
       str_cat("set train.global_batch to ", (t.global_batch + unit - 1) / unit * unit,
               ", or lower train.micro_batch; every rank runs whole micro-batches"));
}

// parallel.tp splits heads, the MLP width, the MTP projection's outputs and the padded vocabulary
// into equal parts (Note [tensor-parallel layout] in parallel/tensor_parallel.h).
void check_tensor_parallel(const Config& c) {
  const int64_t tp = c.parallel.tp;
  if (c.parallel.sequence_parallel && tp == 1) {
    fail(
        "parallel.sequence_parallel = true: needs parallel.tp > 1 (it splits the sequence over "
        "the tensor-parallel ranks)",
        "set parallel.tp to 2 or more, or parallel.sequence_parallel = false");
  }
  if (c.parallel.sequence_parallel && c.train.seq_len % tp != 0) {
    fail(str_cat("parallel.sequence_parallel = true: parallel.tp = ", tp,
                 " must divide train.seq_len (", c.train.seq_len, ")"),
         str_cat("use train.seq_len = ", (c.train.seq_len + tp - 1) / tp * tp, ", or another tp"));
  }
  if (tp == 1) return;
  const ModelConfig& m = c.model;
  const auto need = [&](const char* what, int64_t n) {
    if (n % tp == 0) return;
    fail(str_cat("parallel.tp = ", tp, ": must divide ", what, " (", n, ")"),
         str_cat("use parallel.tp = ", nearby_divisors(n, tp), ", or change the model"));
  };
  need("model.n_head", m.n_head);
  if (m.arch == ModelArch::kLlama) {
    // Each rank holds whole key/value heads, those its query heads read: NKV/TP of them, or one
    // shared with TP/NKV - 1 other ranks (Note [replicated key/value heads] in
    // model/tensor_parallel.h).
    const int64_t nkv = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
    if (nkv % tp != 0 && tp % nkv != 0) {
      fail(str_cat("parallel.tp = ", tp, ": must divide the key/value heads (model.n_kv_head = ",
                   nkv, ", 0 = model.n_head) or be a multiple of them"),
           str_cat("use parallel.tp = ", nearby_divisors(nkv, tp), ", a multiple of ", nkv,
                   " that divides model.n_head (", m.n_head, "), or change model.n_kv_head"));
    }
    need("the SwiGLU width (model.intermediate_size, 0 = 8·n_embd/3 rounded up to 64)",
         m.intermediate_size > 0 ? m.intermediate_size : (8 * m.n_embd / 3 + 63) / 64 * 64);
  } else {
    need("4 × model.n_embd, the MLP width", 4 * m.n_embd);
  }
  need("model.n_embd, the MTP projection's outputs", m.n_embd);
  need("the padded vocabulary (model.vocab_size rounded up to a multiple of 64)", m.padded_vocab());
}

// The llama family's keys, and the gpt2-only ones left at their defaults.
void check_llama(const ModelConfig& m) {
  const bool llama = m.arch == ModelArch::kLlama;
  if (!llama) {
    const char* set = m.n_kv_head != 0                                ? "model.n_kv_head"
                      : m.head_dim != 0                               ? "model.head_dim"
                      : m.intermediate_size != 0                      ? "model.intermediate_size"
                      : m.qk_norm                                     ? "model.qk_norm"
                      : m.qkv_bias                                    ? "model.qkv_bias"
                      : m.rope_scaling.type != RopeScalingType::kNone ? "model.rope_scaling.type"
                                                                      : nullptr;
    if (set != nullptr) {
      fail(str_cat(set, " is set, but model.arch = \"gpt2\": it belongs to the llama family"),
           "set model.arch = \"llama\", or remove the key");
    }
    return;
  }
  const int64_t nkv = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
  if (m.n_head % nkv != 0) {
    fail(str_cat("model.n_kv_head = ", nkv, ": must divide model.n_head (", m.n_head, ")"),
         str_cat("use model.n_kv_head = ", nearby_divisors(m.n_head, nkv)));
  }
  if (m.head_dim == 0 && m.n_embd % m.n_head != 0) {
    fail(str_cat("model.head_dim = 0 (n_embd / n_head): model.n_head = ", m.n_head,
                 " does not divide model.n_embd (", m.n_embd, ")"),
         "set model.head_dim, or change model.n_head");
  }
  const int64_t hs = m.head_dim > 0 ? m.head_dim : m.n_embd / m.n_head;
  if (hs % 2 != 0) {
    fail(str_cat("model.head_dim = ", hs, ": must be even (RoPE rotates pairs of dimensions)"),
         str_cat("use model.head_dim = ", hs + 1));
  }
  if (hs > 1024) {
    fail(str_cat("model.head_dim = ", hs, ": at most 1024"), "use a smaller head size");
  }
  const RopeScalingConfig& r = m.rope_scaling;
  if (r.type == RopeScalingType::kLlama3 && r.high_freq_factor <= r.low_freq_factor) {
    fail(str_cat("model.rope_scaling.high_freq_factor = ", r.high_freq_factor,
                 ": must be > model.rope_scaling.low_freq_factor (", r.low_freq_factor, ")"),
         "Llama 3.1 uses 4 and 1");
  }
}

// Step 5: combinations of keys; those that need the world size only when it is known (> 0).
void check_combinations(const Config& c, int world_size) {
  const ModelConfig& m = c.model;
  check_llama(m);
  config_internal::check_moe(c);
  config_internal::check_document_masking(c);
  if (m.arch == ModelArch::kGpt2 && m.n_embd % m.n_head != 0) {
    fail(str_cat("model.n_head = ", m.n_head, ": must divide model.n_embd (", m.n_embd, ")"),
         str_cat("use model.n_head = ", nearby_divisors(m.n_embd, m.n_head),
                 ", or change model.n_embd"));
  }
  if (c.train.seq_len > m.context_length) {
    fail(str_cat("train.seq_len = ", c.train.seq_len, ": must be <= model.context_length (",
                 m.context_length, ")"),
         "lower train.seq_len or raise model.context_length");
  }
  if (c.mtp.depth >= c.train.seq_len) {
    fail(str_cat("mtp.depth = ", c.mtp.depth, ": must be < train.seq_len (", c.train.seq_len, ")"),
         "depth k predicts the token k+1 places ahead, which must lie inside the window");
  }
  if (c.schedule.warmup_steps > c.train.steps) {
    fail(str_cat("schedule.warmup_steps = ", c.schedule.warmup_steps, ": must be <= train.steps (",
                 c.train.steps, ")"),
         "lower schedule.warmup_steps or raise train.steps");
  }
  const SyntheticDataConfig& s = c.data.synthetic;
  const bool synthetic = c.data.train.empty();  // both splits come from the Markov source
  if (synthetic && s.vocab > m.vocab_size) {
    fail(str_cat("data.synthetic.vocab = ", s.vocab, ": must be <= model.vocab_size (",
                 m.vocab_size, ") when data.train is \"\" (the synthetic source)"),
         "lower data.synthetic.vocab or raise model.vocab_size");
  }
  const int64_t window = c.train.seq_len + 1 + c.mtp.depth;  // tokens one sample reads
  if (synthetic && s.tokens < window) {
    fail(str_cat("data.synthetic.tokens = ", s.tokens,
                 ": must be >= train.seq_len + 1 + mtp.depth (", window,
                 ") when data.train is \"\""),
         "raise data.synthetic.tokens");
  }
  if (synthetic && c.data.val.empty() && s.val_tokens < window) {
    fail(str_cat("data.synthetic.val_tokens = ", s.val_tokens,
                 ": must be >= train.seq_len + 1 + mtp.depth (", window,
                 ") when data.train and data.val are \"\""),
         "raise data.synthetic.val_tokens");
  }
  // Note [transient gradients] in parallel/ddp.h: one capture must hold every write of a step.
  if (c.train.transient_grads == TransientGradsChoice::kOn &&
      c.graphs.scope == GraphScope::kLayers) {
    fail(
        "train.transient_grads = true: needs graphs.scope \"none\" or \"full\", but "
        "graphs.scope = \"layers\" (its blocks' captured writes and the head's eager ones share "
        "gradient buckets)",
        "set train.transient_grads = \"auto\" (off with \"layers\") or false, or graphs.scope = "
        "\"full\"");
  }

  if (c.train.packed_masters &&
      (c.train.device == DeviceChoice::kCpu || c.train.precision == PrecisionChoice::kFp32 ||
       c.train.precision == PrecisionChoice::kFp8)) {
    fail(str_cat("train.packed_masters = true: packs the bf16 weight copies of CUDA bf16 "
                 "training, but train.device = \"",
                 to_string(c.train.device), "\" and train.precision = \"",
                 to_string(c.train.precision), "\""),
         "set train.packed_masters = false, or train.device and train.precision to \"cuda\" "
         "(or \"auto\") and \"bf16\" (or \"auto\")");
  }
  if (c.train.precision == PrecisionChoice::kBf16 && c.train.device == DeviceChoice::kCpu) {
    fail("train.precision = \"bf16\": needs a CUDA device, but train.device = \"cpu\"",
         "use train.precision = \"fp32\" or \"auto\" on CPU");
  }
  const ParallelConfig& p = c.parallel;
  if (p.backend == CommBackend::kGloo && c.train.device == DeviceChoice::kCuda) {
    fail("parallel.backend = \"gloo\": runs on the CPU, but train.device = \"cuda\"",
         "use parallel.backend = \"nccl\" or \"ipc\" on GPUs, or train.device = \"cpu\"");
  }
  if ((p.backend == CommBackend::kNccl || p.backend == CommBackend::kIpc) &&
      c.train.device == DeviceChoice::kCpu) {
    fail(str_cat("parallel.backend = \"", to_string(p.backend),
                 "\": needs GPUs, but train.device = \"cpu\""),
         "use parallel.backend = \"gloo\" or \"auto\" on the CPU");
  }
  check_tensor_parallel(c);
  if (world_size <= 0) {
    // Every layout has at least parallel.gtp ranks, so this much is known before launch.
    check_batch(c, p.gtp, str_cat("at least parallel.gtp = ", p.gtp));
    return;
  }
  if (world_size % p.gtp != 0) {
    fail(str_cat("parallel.gtp = ", p.gtp, ": must divide the world size (", world_size, ")"),
         str_cat("launch a multiple of ", p.gtp,
                 " processes, or use parallel.gtp = ", nearby_divisors(world_size, p.gtp)));
  }
  if (world_size % (p.gtp * p.tp) != 0) {
    fail(str_cat("parallel.tp = ", p.tp, ": parallel.gtp × parallel.tp (", p.gtp * p.tp,
                 ") must divide the world size (", world_size, ")"),
         str_cat("launch a multiple of ", p.gtp * p.tp,
                 " processes, or use parallel.tp = ", nearby_divisors(world_size / p.gtp, p.tp)));
  }
  const int64_t data_ranks = world_size / p.tp;
  config_internal::check_expert_parallel_world(c, world_size);
  check_batch(c, data_ranks,
              p.tp == 1 ? str_cat(world_size, ", the world size")
                        : str_cat(data_ranks, " = world size / parallel.tp"));
  const int64_t accum = c.train.global_batch / (c.train.micro_batch * data_ranks);
  if (c.train.transient_grads == TransientGradsChoice::kOn && c.graphs.scope == GraphScope::kFull &&
      accum > 1) {
    fail(str_cat("train.transient_grads = true with graphs.scope = \"full\": needs one "
                 "micro-batch a step, but train.global_batch = ",
                 c.train.global_batch, " is ", accum, " micro-batches of ", c.train.micro_batch,
                 " on each of ", data_ranks, " data rank(s)"),
         "set train.transient_grads = \"auto\" or false, graphs.scope = \"none\", or "
         "train.global_batch = "
         "train.micro_batch × data ranks");
  }
}

// Steps 2 to 5 on a parsed JSON tree; world_size > 0 adds the checks that need it.
Config parse_config(const json& j, const std::vector<std::string>& sets, const std::string& source,
                    int world_size) {
  if (!j.is_object()) {
    fail(str_cat(source, ": the top level must be a JSON object, got a JSON ", j.type_name()),
         "a config looks like {\"model\": {\"n_layer\": 4}, \"train\": {\"steps\": 100}}");
  }
  Origin origin{source, {}};
  std::vector<std::pair<std::string, json>> overrides;
  for (const std::string& s : sets) overrides.push_back(parse_override(s));
  check_structure(j, "", origin);
  json tree = j;
  for (const auto& [path, value] : overrides) {
    tree[json::json_pointer(pointer_of(path))] = value;  // creates missing sections
    origin.overridden.insert(path);
  }
  Config c = default_config();
  for (const KeySpec& k : schema()) {
    if (const json* v = value_at(tree, k.path)) k.set(c, checked_value(k, *v, &origin));
  }
  check_combinations(c, world_size);
  return c;
}

// Byte offset -> "line L, column C" is already in nlohmann's message; drop its "[json...] " tag.
std::string parse_error_text(const json::exception& e) {
  std::string what = e.what();
  size_t tag_end = what.find("] ");
  return tag_end == std::string::npos ? what : what.substr(tag_end + 2);
}

}  // namespace

int64_t ModelConfig::padded_vocab() const { return (vocab_size + 63) / 64 * 64; }

Config config_from_json_text(const std::string& text, const std::vector<std::string>& sets,
                             const std::string& source, int world_size) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for 1e999
    fail(str_cat("cannot parse ", source, ": ", parse_error_text(e)),
         "JSON needs double-quoted keys and strings, commas between entries, no trailing commas "
         "and no comments");
  }
  return parse_config(j, sets, source, world_size);
}

Config load_config(const std::string& path, const std::vector<std::string>& sets, int world_size) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    fail(str_cat("cannot read config file \"", path, "\": it is a directory"),
         "pass a JSON file, e.g. --config configs/tiny.json");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    fail(str_cat("cannot open config file \"", path, "\": ", std::strerror(errno)),
         "paths are relative to the current directory; configs/ holds examples, e.g. "
         "configs/tiny.json");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    fail(str_cat("cannot read config file \"", path, "\": ", std::strerror(errno)),
         "check the file's permissions");
  }
  return config_from_json_text(ss.str(), sets, path, world_size);
}

void validate(const Config& cfg, int world_size) {
  GTRON_CHECK(world_size >= 1, "world_size = ", world_size);
  for (const KeySpec& k : schema()) checked_value(k, k.get(cfg), nullptr);
  check_combinations(cfg, world_size);
}

std::string resolved_json(const Config& cfg) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const KeySpec& k : schema()) {
    out[nlohmann::ordered_json::json_pointer(pointer_of(k.path))] = k.get(cfg);
  }
  return out.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string config_markdown_table() {
  auto cell = [](std::string s) {  // a '|' would end the cell
    for (size_t p = s.find('|'); p != std::string::npos; p = s.find('|', p + 2)) s.insert(p, "\\");
    return s;
  };
  std::string md = "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
  for (const KeySpec& k : schema()) {
    md += str_cat("| `", k.path, "` | ", config_internal::type_name(k.type), " | `",
                  show_value(k.default_value), "` | ", cell(describe_allowed(k)), " | ",
                  cell(k.doc), " |\n");
  }
  return md;
}

std::vector<std::string> config_key_paths() {
  std::vector<std::string> paths;
  for (const KeySpec& k : schema()) paths.push_back(k.path);
  return paths;
}

bool operator==(const Config& a, const Config& b) {
  for (const KeySpec& k : schema()) {
    if (k.get(a) != k.get(b)) return false;
  }
  return true;
}

bool operator!=(const Config& a, const Config& b) { return !(a == b); }

}  // namespace gtron
