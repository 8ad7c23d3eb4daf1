// tokenizer.json reading and writing for Tokenizer (see trainer/text/tokenizer.h for what is
// supported).
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
    "gtron reads byte-level BPE tokenizers: model.type \"BPE\", a \"ByteLevel\" pre_tokenizer and "
    "decoder, no normalizer (the form GPT-2's tokenizer.json and `gtron tokenizer train` use)";

[[noreturn]] void refuse(const std::string& what, const std::string& why) {
  throw UserError(str_cat("tokenizer '", what, "': ", why, ". ", kSupported, "."));
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
    refuse(what, str_cat("normalizer ", j["normalizer"].value("type", std::string("?")),
                         " is not supported"));
  }
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  if (!pre.is_object() || pre.value("type", std::string()) != "ByteLevel" ||
      !pre.value("use_regex", true)) {
    refuse(what, str_cat("pre_tokenizer ", pre.dump(), " is not supported"));
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

std::vector<SpecialToken> read_added_tokens(const json& j, const std::string& what) {
  std::vector<SpecialToken> out;
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return out;
  if (!j["added_tokens"].is_array()) refuse(what, "added_tokens is not an array");
  for (const json& t : j["added_tokens"]) {
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        !t.contains("content") || !t["content"].is_string() || t["content"] == "") {
      refuse(what, str_cat("added token ", t.dump(), " needs an integer id and a content"));
    }
    if (t.value("lstrip", false) || t.value("rstrip", false) || t.value("single_word", false)) {
      refuse(what, str_cat("added token ", t.dump(), ": lstrip, rstrip, single_word unsupported"));
    }
    out.push_back({t["content"].get<std::string>(), t["id"].get<int32_t>()});
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
  TokenizerSpec spec;
  spec.specials = read_added_tokens(j, what);
  spec.add_prefix_space = j["pre_tokenizer"].value("add_prefix_space", false);
  spec.ignore_merges = j["model"].value("ignore_merges", false);
  std::unordered_map<std::string, int32_t> special_of;
  int64_t size = 0;
  for (const SpecialToken& s : spec.specials) {
    special_of[s.content] = s.id;
    size = std::max<int64_t>(size, int64_t{s.id} + 1);
  }
  const json& vocab = j["model"]["vocab"];
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1LL << 31)) {
      refuse(what, str_cat("vocab entry \"", token, "\" has id ", id.dump()));
    }
    size = std::max<int64_t>(size, id.get<int64_t>() + 1);
  }
  spec.token_bytes.resize(static_cast<size_t>(size));
  std::unordered_map<std::string, int32_t> id_of;
  for (const auto& [token, id_json] : vocab.items()) {
    const auto id = id_json.get<int32_t>();
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
    if (s.id < 0) refuse(what, str_cat("added token \"", s.content, "\" has a negative id"));
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
                     {"normalized", false},
                     {"special", true}});
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
      {"version", "1.0"},          {"truncation", nullptr}, {"padding", nullptr},
      {"added_tokens", added},     {"normalizer", nullptr}, {"pre_tokenizer", byte_level},
      {"post_processor", nullptr}, {"decoder", byte_level}, {"model", model}};
  return j.dump(2) + "\n";
}

void Tokenizer::save(const std::string& path) const { write_file_atomic(path, to_json_text()); }

}  // namespace gtron
