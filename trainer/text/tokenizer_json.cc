// tokenizer.json reading and writing for Tokenizer (see trainer/text/tokenizer.h for what is
// supported).
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/check.h"
#include "trainer/data/shards.h"
#include "trainer/text/byte_level.h"
#include "trainer/text/tokenizer.h"

namespace gtron {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr const char* kSupported =
    "gtron reads byte-level BPE tokenizers: model.type \"BPE\"; pre_tokenizer \"ByteLevel\" "
    "(GPT-2) or a \"Sequence\" of \"Split\" (the Llama-3 or Qwen2 pattern, behavior "
    "\"Isolated\") and \"ByteLevel\" (use_regex false); a \"ByteLevel\" decoder; normalizer null "
    "or \"NFC\"; "
    "post_processor null, \"ByteLevel\" or \"TemplateProcessing\" (the forms of GPT-2's, "
    "Llama-3's and Qwen2's tokenizer.json and `gtron tokenizer train`)";

[[noreturn]] void refuse(const std::string& what, const std::string& why) {
  throw UserError(str_cat("tokenizer '", what, "': ", why, ". ", kSupported, "."));
}

// Note [token ids]: the bounds on every id.
constexpr int64_t kMaxTokenIds = int64_t{1} << 24;
constexpr int64_t kMaxIdHoles = int64_t{1} << 20;

// The token id `v`, read from the file's field `field`, checked against Note [token ids]'s bounds
// before anything is sized by it; `listed` is the number of tokens the file lists.
int32_t checked_id(const json& v, const std::string& field, int64_t listed,
                   const std::string& what) {
  const int64_t limit = std::min(listed + kMaxIdHoles, kMaxTokenIds);
  // An unsigned value above INT64_MAX reads back negative, so it fails too.
  if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < limit) {
    return static_cast<int32_t>(v.get<int64_t>());
  }
  throw UserError(str_cat("tokenizer '", what, "': ", field, " is ", v.dump(),
                          ", not a token id of this file: ids are integers in [0, ", limit,
                          "), at most 2^20 past the ", listed,
                          " tokens it lists (model.vocab and added_tokens) and below 2^24. Hint: ",
                          "correct the id, or re-create the file with the tokenizers library or ",
                          "`gtron tokenizer train`."));
}

bool null_or(const json& obj, const char* key, const json& allowed) {
  return !obj.contains(key) || obj[key].is_null() || obj[key] == allowed;
}

void check_structure(const json& j, const std::string& what) {
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
    refuse(what, "not a tokenizer.json (no \"model\" object)");
  }
  const json& m = j["model"];
  const std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE") refuse(what, str_cat("model type \"", type, "\" is not supported"));
  if (!null_or(m, "dropout", 0.0) || !null_or(m, "byte_fallback", false) ||
      !null_or(m, "continuing_subword_prefix", "") || !null_or(m, "end_of_word_suffix", "")) {
    refuse(what,
           "BPE dropout, byte_fallback, continuing_subword_prefix and end_of_word_suffix "
           "are not supported");
  }
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& n = j["normalizer"];
    if (!n.is_object() || n.value("type", std::string()) != "NFC" || n.size() != 1) {
      refuse(what,
             str_cat("normalizer ", n.dump(), " is not supported (null or {\"type\": \"NFC\"})"));
    }
  }
  const json& dec = j.contains("decoder") ? j["decoder"] : json();
  if (!dec.is_null() && (!dec.is_object() || dec.value("type", std::string()) != "ByteLevel")) {
    refuse(what, str_cat("decoder ", dec.dump(), " is not supported"));
  }
  if (!m.contains("vocab") || !m["vocab"].is_object() || !m.contains("merges") ||
      !m["merges"].is_array()) {
    refuse(what, "model.vocab (an object) and model.merges (an array) are required");
  }
}

std::string type_of(const json& obj) {
  return obj.is_object() && obj.contains("type") && obj["type"].is_string()
             ? obj["type"].get<std::string>()
             : std::string();
}

// `field` of `obj` must be absent, null or `allowed`.
void expect_field(const json& obj, const char* field, const json& allowed, const std::string& where,
                  const std::string& what) {
  if (!null_or(obj, field, allowed)) {
    refuse(what, str_cat(where, ".", field, " ", obj[field].dump(), " is not supported (expected ",
                         allowed.dump(), ")"));
  }
}

// The pre_tokenizer: ByteLevel (use_regex true: the gpt2 pattern) or Sequence [Split, ByteLevel].
void read_pre_tokenizer(const json& j, TokenizerSpec* spec, const std::string& what) {
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  const std::string type = type_of(pre);
  if (type == "ByteLevel") {
    expect_field(pre, "use_regex", true, "pre_tokenizer", what);
    spec->pattern = SplitPattern::kGpt2;
    spec->add_prefix_space = pre.value("add_prefix_space", false);
    return;
  }
  if (type != "Sequence") {
    refuse(what, str_cat("pre_tokenizer ", pre.dump(), " is not supported"));
  }
  const json& seq = pre.contains("pretokenizers") ? pre["pretokenizers"] : json();
  if (!seq.is_array() || seq.size() != 2 || type_of(seq[0]) != "Split" ||
      type_of(seq[1]) != "ByteLevel") {
    refuse(what, str_cat("pre_tokenizer.pretokenizers ", seq.dump(),
                         " is not supported (expected [Split, ByteLevel])"));
  }
  const json& split = seq[0];
  const std::string where = "pre_tokenizer.pretokenizers[0]";
  const json& pattern = split.contains("pattern") ? split["pattern"] : json();
  if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string()) {
    refuse(what,
           str_cat(where, ".pattern ", pattern.dump(), " is not supported (expected {\"Regex\": ",
                   "the Llama-3, Qwen2 or GPT-2 pattern})"));
  }
  const std::optional<SplitPattern> known =
      split_pattern_from_regex(pattern["Regex"].get<std::string>());
  if (!known) {
    refuse(what, str_cat(where, ".pattern.Regex ", pattern["Regex"].dump(),
                         " is not a pattern gtron knows (Llama-3's, Qwen2's or GPT-2's, exactly)"));
  }
  if (!split.contains("behavior") || split["behavior"] != "Isolated") {
    refuse(what, str_cat(where, ".behavior ", split.value("behavior", json()).dump(),
                         " is not supported (expected \"Isolated\")"));
  }
  expect_field(split, "invert", false, where, what);
  const std::string byte_level = "pre_tokenizer.pretokenizers[1]";
  if (!seq[1].contains("use_regex") || seq[1]["use_regex"] != false) {
    refuse(what, str_cat(byte_level, ".use_regex ", seq[1].value("use_regex", json(true)).dump(),
                         " is not supported (expected false: the Split does the splitting)"));
  }
  expect_field(seq[1], "add_prefix_space", false, byte_level, what);
  spec->pattern = *known;
}

// A TemplateProcessing's single template: special tokens, then $A, then special tokens.
void read_template(const json& proc, const std::string& where, int64_t listed, TokenizerSpec* spec,
                   const std::string& what) {
  const json& single = proc.contains("single") ? proc["single"] : json();
  const json& specials = proc.contains("special_tokens") ? proc["special_tokens"] : json();
  if (!single.is_array() || !specials.is_object()) {
    refuse(what, str_cat(where, ".single (an array) and ", where,
                         ".special_tokens (an object) are required"));
  }
  bool seen_a = false;
  for (const json& piece : single) {
    if (piece.is_object() && piece.contains("Sequence") && !seen_a &&
        piece["Sequence"].value("id", json()) == "A") {
      seen_a = true;
      continue;
    }
    const json name = piece.is_object() && piece.contains("SpecialToken")
                          ? piece["SpecialToken"].value("id", json())
                          : json();
    if (!name.is_string() || !specials.contains(name.get<std::string>()) ||
        !specials[name.get<std::string>()].contains("ids") ||
        !specials[name.get<std::string>()]["ids"].is_array()) {
      refuse(what, str_cat(where, ".single item ", piece.dump(),
                           " is not supported (expected special tokens of ", where,
                           ".special_tokens around one {\"Sequence\": {\"id\": \"A\"}})"));
    }
    auto& ids = seen_a ? spec->template_after : spec->template_before;
    const json& given = specials[name.get<std::string>()]["ids"];
    for (size_t k = 0; k < given.size(); ++k) {
      ids.push_back(checked_id(given[k],
                               str_cat(where, ".special_tokens[", name.dump(), "].ids[", k, "]"),
                               listed, what));
    }
  }
  if (!seen_a) refuse(what, str_cat(where, ".single has no {\"Sequence\": {\"id\": \"A\"}}"));
}

// The post_processor: null, ByteLevel (offsets only: no ids change), TemplateProcessing, or a
// Sequence of those with at most one template.
void read_post_processor(const json& j, int64_t listed, TokenizerSpec* spec,
                         const std::string& what) {
  if (!j.contains("post_processor") || j["post_processor"].is_null()) return;
  const json& post = j["post_processor"];
  std::vector<std::pair<const json*, std::string>> parts;
  if (type_of(post) == "Sequence" && post.contains("processors") && post["processors"].is_array()) {
    for (size_t i = 0; i < post["processors"].size(); ++i) {
      parts.emplace_back(&post["processors"][i], str_cat("post_processor.processors[", i, "]"));
    }
  } else {
    parts.emplace_back(&post, "post_processor");
  }
  int templates = 0;
  for (const auto& [proc, where] : parts) {
    const std::string type = type_of(*proc);
    if (type == "TemplateProcessing" && templates++ == 0) {
      read_template(*proc, where, listed, spec, what);
    } else if (type != "ByteLevel") {
      refuse(what, str_cat(where, " ", proc->dump(),
                           " is not supported (expected ByteLevel or one TemplateProcessing)"));
    }
  }
  spec->post_processor_json = post.dump();
}

// The number of tokens the file lists: model.vocab's and added_tokens' entries (an added token
// is often in model.vocab too: then this counts it twice, which only loosens the bound).
int64_t listed_tokens(const json& j) {
  const bool added = j.contains("added_tokens") && j["added_tokens"].is_array();
  return static_cast<int64_t>(j["model"]["vocab"].size() + (added ? j["added_tokens"].size() : 0));
}

std::vector<SpecialToken> read_added_tokens(const json& j, int64_t listed,
                                            const std::string& what) {
  std::vector<SpecialToken> out;
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return out;
  if (!j["added_tokens"].is_array()) refuse(what, "added_tokens is not an array");
  for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
    const json& t = j["added_tokens"][i];
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        !t.contains("content") || !t["content"].is_string() || t["content"] == "") {
      refuse(what, str_cat("added token ", t.dump(), " needs an integer id and a content"));
    }
    const int32_t id = checked_id(t["id"], str_cat("added_tokens[", i, "].id"), listed, what);
    if (t.value("lstrip", false) || t.value("rstrip", false) || t.value("single_word", false)) {
      refuse(what, str_cat("added token ", t.dump(), ": lstrip, rstrip, single_word unsupported"));
    }
    // tokenizers' defaults when a flag is missing: special false, normalized = !special.
    const bool special = t.value("special", false);
    out.push_back({t["content"].get<std::string>(), id, special, t.value("normalized", !special)});
  }
  return out;
}

// "left right" (tokenizers < 0.20) or ["left", "right"] (newer).
std::pair<std::string, std::string> merge_parts(const json& m, const std::string& what) {
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ');
    if (space != std::string::npos && s.find(' ', space + 1) == std::string::npos) {
      return {s.substr(0, space), s.substr(space + 1)};
    }
  } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return {m[0].get<std::string>(), m[1].get<std::string>()};
  }
  refuse(what, str_cat("merge ", m.dump(), " is not \"left right\" or [\"left\", \"right\"]"));
}

TokenizerSpec spec_from_json(const json& j, const std::string& what) {
  check_structure(j, what);
  const int64_t listed = listed_tokens(j);
  TokenizerSpec spec;
  spec.specials = read_added_tokens(j, listed, what);
  read_pre_tokenizer(j, &spec, what);
  read_post_processor(j, listed, &spec, what);
  spec.ignore_merges = j["model"].value("ignore_merges", false);
  spec.nfc = j.contains("normalizer") && j["normalizer"].is_object();  // checked: NFC
  std::unordered_map<std::string, int32_t> special_of;
  int64_t size = 0;
  for (const SpecialToken& s : spec.specials) {
    special_of[s.content] = s.id;
    size = std::max<int64_t>(size, int64_t{s.id} + 1);
  }
  const json& vocab = j["model"]["vocab"];
  std::vector<std::pair<std::string, int32_t>> entries;
  for (const auto& [token, id_json] : vocab.items()) {
    const int32_t id =
        checked_id(id_json, str_cat("model.vocab[", json(token).dump(), "]"), listed, what);
    entries.emplace_back(token, id);
    size = std::max<int64_t>(size, int64_t{id} + 1);
  }
  spec.token_bytes.resize(static_cast<size_t>(size));  // Note [token ids]: < listed + 2^20
  std::unordered_map<std::string, int32_t> id_of;
  for (const auto& [token, id] : entries) {
    auto special = special_of.find(token);
    std::optional<std::string> bytes = special != special_of.end()
                                           ? std::optional<std::string>(token)
                                           : token_string_to_bytes(token);
    if (!bytes) refuse(what, str_cat("vocab token \"", token, "\" is not a byte-level token"));
    if (spec.token_bytes[id]) refuse(what, str_cat("two vocab tokens have id ", id));
    spec.token_bytes[id] = bytes;
    id_of[token] = id;
  }
  for (const SpecialToken& s : spec.specials) {
    if (!spec.token_bytes[s.id]) spec.token_bytes[s.id] = s.content;
  }
  for (const json& m : j["model"]["merges"]) {
    const auto [left, right] = merge_parts(m, what);
    auto a = id_of.find(left), b = id_of.find(right);
    if (a == id_of.end() || b == id_of.end()) {
      refuse(what, str_cat("merge ", m.dump(), " names a token that is not in model.vocab"));
    }
    spec.merges.emplace_back(a->second, b->second);
  }
  return spec;
}

// The tokenizer.json string of a token: its content for a special token, else byte-level form.
std::string token_string(const TokenizerSpec& spec, int32_t id, const std::vector<bool>& special) {
  return special[id] ? *spec.token_bytes[id] : bytes_to_token_string(*spec.token_bytes[id]);
}

}  // namespace

Tokenizer Tokenizer::from_json_text(const std::string& text, const std::string& what) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw UserError(str_cat("tokenizer '", what, "': not valid JSON (", e.what(), ")"));
  }
  try {
    return Tokenizer(spec_from_json(j, what), "tokenizer '" + what + "'");
  } catch (const json::exception& e) {
    refuse(what, str_cat("unexpected JSON value (", e.what(), ")"));
  }
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw UserError(str_cat("tokenizer '", path,
                            "': cannot be opened. Hint: train one with `gtron tokenizer train`."));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), path);
}

std::string Tokenizer::to_json_text() const {
  std::vector<bool> special(spec_.token_bytes.size(), false);
  ordered_json added = ordered_json::array();
  for (const SpecialToken& s : spec_.specials) {
    special[s.id] = true;
    added.push_back({{"id", s.id},
                     {"content", s.content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", s.normalized},
                     {"special", s.special}});
  }
  ordered_json vocab = ordered_json::object();
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (spec_.token_bytes[id]) vocab[token_string(spec_, id, special)] = id;
  }
  ordered_json merges = ordered_json::array();
  for (const auto& [a, b] : spec_.merges) {
    merges.push_back(token_string(spec_, a, special) + " " + token_string(spec_, b, special));
  }
  const ordered_json byte_level = {{"type", "ByteLevel"},
                                   {"add_prefix_space", spec_.add_prefix_space},
                                   {"trim_offsets", true},
                                   {"use_regex", true}};
  ordered_json pre = byte_level;
  if (spec_.pattern != SplitPattern::kGpt2) {
    const ordered_json split = {{"type", "Split"},
                                {"pattern", {{"Regex", split_pattern_regex(spec_.pattern)}}},
                                {"behavior", "Isolated"},
                                {"invert", false}};
    ordered_json bytes = byte_level;
    bytes["use_regex"] = false;
    pre = {{"type", "Sequence"}, {"pretokenizers", ordered_json::array({split, bytes})}};
  }
  const ordered_json post = spec_.post_processor_json.empty()
                                ? ordered_json()
                                : ordered_json::parse(spec_.post_processor_json);
  ordered_json model = {{"type", "BPE"},
                        {"dropout", nullptr},
                        {"unk_token", nullptr},
                        {"continuing_subword_prefix", nullptr},
                        {"end_of_word_suffix", nullptr},
                        {"fuse_unk", false},
                        {"byte_fallback", false}};
  if (spec_.ignore_merges) model["ignore_merges"] = true;
  model["vocab"] = vocab;
  model["merges"] = merges;
  const ordered_json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", spec_.nfc ? ordered_json{{"type", "NFC"}} : ordered_json()},
      {"pre_tokenizer", pre},
      {"post_processor", post},
      {"decoder", byte_level},
      {"model", model}};
  return j.dump(2) + "\n";
}

void Tokenizer::save(const std::string& path) const { write_file_atomic(path, to_json_text()); }

}  // namespace gtron
