#include "trainer/text/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "model/check.h"
#include "trainer/text/normalize.h"

namespace gtron {
namespace {

constexpr size_t kMaxCachedPiece = 64;        // longer pieces are rare; do not keep them
constexpr size_t kMaxCacheEntries = 1 << 20;  // then the cache starts over

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

std::pair<size_t, size_t> find_special(std::string_view text, size_t pos,
                                       const std::vector<SpecialToken>& specials) {
  size_t best = std::string_view::npos, which = 0;
  for (size_t s = 0; s < specials.size(); ++s) {
    const size_t at = text.find(specials[s].content, pos);
    if (at == std::string_view::npos) continue;
    if (at < best || (at == best && specials[s].content.size() > specials[which].content.size())) {
      best = at;
      which = s;
    }
  }
  return {best, which};
}

Tokenizer::Tokenizer(TokenizerSpec spec, const std::string& what)
    : spec_(std::move(spec)), what_(what), pretokenizer_(spec_.pattern) {
  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
  std::vector<bool> special(spec_.token_bytes.size(), false);
  for (const SpecialToken& s : spec_.specials) {
    if (s.id < 0 || s.id >= vocab_size() || !spec_.token_bytes[s.id] || s.content.empty() ||
        *spec_.token_bytes[s.id] != s.content) {
      throw UserError(str_cat(what, ": special token \"", s.content, "\" (id ", s.id,
                              ") is not in the vocabulary with that id"));
    }
    special[s.id] = true;
    (s.normalized ? second_pass_ : first_pass_).push_back(s);
  }
  for (const auto* ids : {&spec_.template_before, &spec_.template_after}) {
    for (int32_t id : *ids) {
      if (id < 0 || id >= vocab_size() || !spec_.token_bytes[id]) {
        throw UserError(str_cat(what, ": the post-processor's template has id ", id,
                                ", which is no token of the vocabulary"));
      }
    }
  }
  if (spec_.add_prefix_space && spec_.pattern != SplitPattern::kGpt2) {
    throw UserError(str_cat(what, ": add_prefix_space goes only with the gpt2 split pattern"));
  }
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (!spec_.token_bytes[id] || special[id]) continue;
    const std::string& b = *spec_.token_bytes[id];
    if (b.empty() || !id_of_bytes_.emplace(b, id).second) {
      throw UserError(str_cat(what, ": token id ", id, " is empty or repeats another token"));
    }
    if (b.size() == 1) byte_id_[static_cast<unsigned char>(b[0])] = id;
  }
  for (size_t r = 0; r < spec_.merges.size(); ++r) {
    const auto [a, b] = spec_.merges[r];
    const bool known = a >= 0 && b >= 0 && a < vocab_size() && b < vocab_size() &&
                       spec_.token_bytes[a] && spec_.token_bytes[b] && !special[a] && !special[b];
    auto it = known ? id_of_bytes_.find(*spec_.token_bytes[a] + *spec_.token_bytes[b])
                    : id_of_bytes_.end();
    if (it == id_of_bytes_.end()) {
      throw UserError(str_cat(what, ": merge ", r, " (ids ", a, ", ", b,
                              ") does not join two tokens into a token of the vocabulary"));
    }
    rank_.emplace(pair_key(a, b), std::make_pair(static_cast<int32_t>(r), it->second));
  }
}

std::optional<int32_t> Tokenizer::special_id(const std::string& content) const {
  for (const SpecialToken& s : spec_.specials) {
    if (s.content == content) return s.id;
  }
  return std::nullopt;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) {
  std::vector<int32_t> out;
  encode_append(text, &out);
  return out;
}

std::optional<std::vector<int32_t>> Tokenizer::document_start(const std::string& eot) const {
  if (!spec_.template_before.empty() || !spec_.template_after.empty()) {
    return spec_.template_before;
  }
  if (const std::optional<int32_t> id = special_id(eot)) return std::vector<int32_t>{*id};
  return std::nullopt;
}

std::vector<int32_t> Tokenizer::encode_with_template(std::string_view text) {
  std::vector<int32_t> out = spec_.template_before;
  encode_append(text, &out);
  out.insert(out.end(), spec_.template_after.begin(), spec_.template_after.end());
  return out;
}

namespace {

// Calls stretch(text between added tokens) and token(id) in text order (step 1 of the header).
template <typename Stretch>
void cut_added(std::string_view text, const std::vector<SpecialToken>& added, Stretch&& stretch,
               std::vector<int32_t>* out) {
  for (size_t pos = 0; pos < text.size();) {
    const auto [at, which] = find_special(text, pos, added);
    const size_t end = std::min(at, text.size());
    stretch(text.substr(pos, end - pos));
    if (at == std::string_view::npos) break;
    out->push_back(added[which].id);
    pos = at + added[which].content.size();
  }
}

}  // namespace

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>* out) {
  cut_added(
      text, first_pass_, [&](std::string_view s) { encode_second_pass(s, out); }, out);
}

void Tokenizer::encode_second_pass(std::string_view text, std::vector<int32_t>* out) {
  if (spec_.nfc) {
    const std::string normalized = nfc_normalize(text);
    cut_added(
        normalized, second_pass_, [&](std::string_view s) { encode_stretch(s, out); }, out);
    return;
  }
  cut_added(
      text, second_pass_, [&](std::string_view s) { encode_stretch(s, out); }, out);
}

void Tokenizer::encode_stretch(std::string_view text, std::vector<int32_t>* out) {
  if (text.empty()) return;
  if (spec_.add_prefix_space && text[0] != ' ') {
    const std::string spaced = " " + std::string(text);
    pretokenizer_.split(spaced, [&](std::string_view piece) { encode_piece(piece, out); });
    return;
  }
  pretokenizer_.split(text, [&](std::string_view piece) { encode_piece(piece, out); });
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>* out) {
  if (piece.size() > kMaxCachedPiece) {
    merge_piece(piece, out);
    return;
  }
  std::string key(piece);
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    std::vector<int32_t> ids;
    merge_piece(piece, &ids);
    it = cache_.emplace(std::move(key), std::move(ids)).first;
  }
  out->insert(out->end(), it->second.begin(), it->second.end());
}

// BPE on one piece: a linked list of symbols and a min-heap of (rank, position) candidates;
// an entry is stale once either symbol changed (its pair's rank no longer matches).
void Tokenizer::merge_piece(std::string_view piece, std::vector<int32_t>* out) const {
  if (spec_.ignore_merges) {
    auto whole = id_of_bytes_.find(std::string(piece));
    if (whole != id_of_bytes_.end()) {
      out->push_back(whole->second);
      return;
    }
  }
  const int n = static_cast<int>(piece.size());
  if (n == 0) return;
  std::vector<int32_t> id(n), next(n), prev(n);
  for (int i = 0; i < n; ++i) {
    const auto byte = static_cast<unsigned char>(piece[i]);
    id[i] = byte_id_[byte];
    if (id[i] < 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", byte);
      throw UserError(str_cat(what_, ": the byte ", hex,
                              " has no token of its own, so this text cannot be encoded. Hint: "
                              "train the tokenizer with the full 256-byte alphabet."));
    }
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  using Entry = std::pair<int32_t, int32_t>;  // (rank, left position)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto rank_at = [&](int i) -> const std::pair<int32_t, int32_t>* {
    if (i < 0 || next[i] < 0) return nullptr;
    auto it = rank_.find(pair_key(id[i], id[next[i]]));
    return it == rank_.end() ? nullptr : &it->second;
  };
  auto push = [&](int i) {
    if (const auto* r = rank_at(i)) heap.emplace(r->first, i);
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto [rank, i] = heap.top();
    heap.pop();
    const auto* r = id[i] >= 0 ? rank_at(i) : nullptr;
    if (r == nullptr || r->first != rank) continue;  // stale
    const int j = next[i];
    id[i] = r->second;
    id[j] = -1;  // removed
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  for (int i = 0; i >= 0; i = next[i]) out->push_back(id[i]);
}

std::string Tokenizer::decode(const int32_t* ids, int64_t n) const {
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = ids[i];
    if (t >= 0 && t < vocab_size() && spec_.token_bytes[t]) {
      out += *spec_.token_bytes[t];
    } else {
      out += "\xEF\xBF\xBD";
    }
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  return decode(ids.data(), static_cast<int64_t>(ids.size()));
}

}  // namespace gtron
