#include "trainer/text/bpe_train.h"

#include <algorithm>
#include <map>
#include <queue>
#include <set>
#include <unordered_map>

#include "model/check.h"
#include "trainer/text/pretokenize.h"

namespace gtron {
namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
int32_t left_of(uint64_t key) { return static_cast<int32_t>(key >> 32); }
int32_t right_of(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

void check_options(const BpeTrainOptions& o) {
  std::set<std::string> seen;
  for (const std::string& s : o.specials) {
    if (s.empty() || !valid_utf8(s) || !seen.insert(s).second) {
      throw UserError(str_cat("special token \"", s,
                              "\": special tokens must be non-empty, valid UTF-8 and distinct"));
    }
  }
  const int64_t least = 256 + static_cast<int64_t>(o.specials.size());
  if (o.vocab_size < least || o.vocab_size > (1LL << 31) - 1) {
    throw UserError(str_cat("--vocab-size ", o.vocab_size, " is not allowed; expected at least ",
                            least, " (256 byte tokens + ", o.specials.size(),
                            " special tokens) and below 2^31"));
  }
}

// The training state of Note [BPE training], steps 2-4.
class Merger {
 public:
  explicit Merger(const std::vector<std::pair<std::string, int64_t>>& words) {
    for (int b = 0; b < 256; ++b) {
      token_bytes_.emplace_back(1, static_cast<char>(b));
      id_of_.emplace(token_bytes_.back(), b);
    }
    for (const auto& [bytes, count] : words) {
      const auto w = static_cast<int32_t>(symbols_.size());
      symbols_.emplace_back(bytes.begin(), bytes.end());
      for (int32_t& s : symbols_.back()) s = static_cast<unsigned char>(s);
      counts_.push_back(count);
      const auto& s = symbols_.back();
      for (size_t i = 0; i + 1 < s.size(); ++i) add(pair_key(s[i], s[i + 1]), count, w);
    }
    for (const auto& [key, count] : pair_count_) heap_.push({count, key});
    changed_.clear();
  }

  // Performs the next merge; false when no pair occurs at least min_count times.
  bool merge_next(int64_t min_count) {
    while (!heap_.empty()) {
      const Entry top = heap_.top();
      heap_.pop();
      auto it = pair_count_.find(top.key);
      if (it == pair_count_.end() || it->second != top.count) continue;  // stale
      if (top.count < min_count) return false;
      merge(top.key);
      return true;
    }
    return false;
  }

  int64_t num_tokens() const { return static_cast<int64_t>(token_bytes_.size()); }
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }
  const std::vector<std::string>& token_bytes() const { return token_bytes_; }

 private:
  struct Entry {
    int64_t count;
    uint64_t key;
    // priority_queue puts the largest on top: the highest count, then the smallest pair.
    bool operator<(const Entry& o) const {
      return count < o.count || (count == o.count && key > o.key);
    }
  };

  void add(uint64_t key, int64_t delta, int32_t word) {
    int64_t& c = pair_count_[key];
    c += delta;
    if (delta > 0) where_[key].push_back(word);
    changed_.push_back(key);
  }

  void merge(uint64_t key) {
    const int32_t a = left_of(key), b = right_of(key);
    const std::string bytes = token_bytes_[a] + token_bytes_[b];
    auto [it, fresh] = id_of_.emplace(bytes, static_cast<int32_t>(token_bytes_.size()));
    if (fresh) token_bytes_.push_back(bytes);
    const int32_t c = it->second;
    merges_.emplace_back(a, b);
    std::vector<int32_t> words = std::move(where_[key]);
    where_.erase(key);
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    for (int32_t w : words) merge_in_word(w, a, b, c);
    pair_count_.erase(key);
    std::sort(changed_.begin(), changed_.end());
    changed_.erase(std::unique(changed_.begin(), changed_.end()), changed_.end());
    for (uint64_t k : changed_) {
      auto pc = pair_count_.find(k);
      if (pc == pair_count_.end()) continue;
      if (pc->second > 0) {
        heap_.push({pc->second, k});
      } else {
        pair_count_.erase(pc);
        where_.erase(k);
      }
    }
    changed_.clear();
  }

  // Replaces every (a, b) in word w by c, left to right, and moves the pair counts around each
  // occurrence: (prev, a) -> (prev, c) and (b, next) -> (c, next). `prev` is the symbol already
  // written, so in "a a a a" the second occurrence sees the c of the first.
  void merge_in_word(int32_t w, int32_t a, int32_t b, int32_t c) {
    std::vector<int32_t>& s = symbols_[w];
    const int64_t k = counts_[w];
    std::vector<int32_t> out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
        if (!out.empty()) {
          add(pair_key(out.back(), a), -k, w);
          add(pair_key(out.back(), c), k, w);
        }
        if (i + 2 < s.size()) {
          add(pair_key(b, s[i + 2]), -k, w);
          add(pair_key(c, s[i + 2]), k, w);
        }
        out.push_back(c);
        i += 2;
      } else {
        out.push_back(s[i]);
        i += 1;
      }
    }
    s.swap(out);
  }

  std::vector<std::vector<int32_t>> symbols_;  // per word
  std::vector<int64_t> counts_;                // per word
  std::vector<std::string> token_bytes_;       // per id
  std::unordered_map<std::string, int32_t> id_of_;
  std::unordered_map<uint64_t, int64_t> pair_count_;
  std::unordered_map<uint64_t, std::vector<int32_t>> where_;  // pair -> words (may repeat)
  std::priority_queue<Entry> heap_;
  std::vector<uint64_t> changed_;  // pairs whose count changed during the current merge
  std::vector<std::pair<int32_t, int32_t>> merges_;
};

}  // namespace

BpeWordCounter::BpeWordCounter(BpeTrainOptions options, int workers)
    : options_(std::move(options)) {
  check_options(options_);
  GTRON_CHECK(workers >= 1, "BpeWordCounter needs a worker, got ", workers);
  for (const std::string& s : options_.specials) specials_.push_back({s, 0});
  // A few partitions per worker balance the merge loop.
  const size_t partitions = static_cast<size_t>(workers) * 4;
  totals_.resize(partitions);
  for (int w = 0; w < workers; ++w) {
    workers_.push_back({Pretokenizer(options_.pattern), std::vector<Table>(partitions), 0, {}});
  }
}

// Special tokens are cut out first; they never take part in merges (step 1 of the note).
void BpeWordCounter::count(int worker, std::string_view text) {
  Worker& w = workers_[static_cast<size_t>(worker)];
  const size_t partitions = w.tables.size();
  auto count_piece = [&](std::string_view piece) {
    w.key.assign(piece.data(), piece.size());
    ++w.tables[std::hash<std::string_view>()(piece) % partitions][w.key];
    ++w.pieces;
  };
  for (size_t pos = 0; pos < text.size();) {
    const auto [at, which] = find_special(text, pos, specials_);
    const size_t end = std::min(at, text.size());
    w.pretokenizer.split(text.substr(pos, end - pos), count_piece);
    if (at == std::string_view::npos) break;
    pos = at + specials_[which].content.size();
  }
}

void BpeWordCounter::merge(WorkerPool& pool) {
  pool.parallel_for(totals_.size(), [&](size_t p, int) {
    for (Worker& w : workers_) {
      for (auto& [word, n] : w.tables[p]) totals_[p][word] += n;
      w.tables[p].clear();
    }
  });
}

TokenizerSpec BpeWordCounter::train(BpeTrainStats* stats) {
  BpeTrainStats local;
  if (stats == nullptr) stats = &local;
  *stats = BpeTrainStats{};
  std::vector<std::pair<std::string, int64_t>> words;
  for (Table& t : totals_) {
    for (auto& [word, n] : t) words.emplace_back(word, n);
    Table().swap(t);
  }
  std::sort(words.begin(), words.end());
  for (const Worker& w : workers_) stats->pieces += w.pieces;
  stats->unique_words = static_cast<int64_t>(words.size());

  Merger merger(words);
  std::vector<std::pair<std::string, int64_t>>().swap(words);
  const int64_t target = options_.vocab_size - static_cast<int64_t>(specials_.size());
  while (merger.num_tokens() < target && merger.merge_next(options_.min_pair_count)) {
  }
  TokenizerSpec spec;
  for (const std::string& b : merger.token_bytes()) spec.token_bytes.emplace_back(b);
  spec.merges = merger.merges();
  std::vector<SpecialToken> specials = specials_;
  for (SpecialToken& s : specials) {
    s.id = static_cast<int32_t>(spec.token_bytes.size());
    spec.token_bytes.emplace_back(s.content);
  }
  spec.specials = specials;
  spec.pattern = options_.pattern;
  stats->merges = static_cast<int64_t>(spec.merges.size());
  return spec;
}

TokenizerSpec train_bpe(const std::vector<std::string_view>& texts, const BpeTrainOptions& options,
                        BpeTrainStats* stats) {
  BpeWordCounter counter(options, 1);
  for (std::string_view text : texts) counter.count(0, text);
  WorkerPool pool(1);
  counter.merge(pool);
  return counter.train(stats);
}

}  // namespace gtron
