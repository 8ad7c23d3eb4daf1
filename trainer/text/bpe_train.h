// Training a byte-level BPE tokenizer (`gtron tokenizer train`).
//
// Note [BPE training]
// 1. Special tokens are cut out of every text (they never take part in merges); the stretches
//    between them are pre-tokenized with the split pattern (trainer/text/pretokenize.h), and
//    equal pieces are counted once: the corpus becomes a list of unique words with counts.
// 2. Every word starts as its bytes; ids 0..255 are the 256 single bytes, whether or not they
// occur.
// 3. Each step merges the most frequent adjacent pair (occurrences weighted by word counts).
//    Tie-break: the pair (left id, right id) that is smallest, comparing left ids first. Every
//    occurrence in every word is replaced left to right (in "a a a", the pair (a, a) becomes
//    "aa a"). The merged token gets the next id, unless its bytes are already a token (two pairs
//    can spell the same bytes), which it then reuses.
// 4. Training stops when the vocabulary (bytes + merged tokens + specials) reaches vocab_size, or
//    when no pair occurs at least min_pair_count times.
// Pair counts are kept up to date incrementally: a merge visits only the words that contain the
// pair (an index pair -> words) and adjusts the counts of the pairs around each occurrence; a
// max-heap with lazy deletion finds the next pair. The result is deterministic: it depends only
// on the texts and the options.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "trainer/data/worker_pool.h"
#include "trainer/text/pretokenize.h"
#include "trainer/text/tokenizer.h"

namespace gtron {

struct BpeTrainOptions {
  int64_t vocab_size = 0;             // REQUIRES: >= 256 + specials.size()
  std::vector<std::string> specials;  // get the last ids, in this order
  int64_t min_pair_count = 2;
  SplitPattern pattern = SplitPattern::kGpt2;  // pre-tokenization, and the file's pre_tokenizer
};

struct BpeTrainStats {
  int64_t pieces = 0;        // pre-tokenized pieces of the corpus
  int64_t unique_words = 0;  // distinct pieces
  int64_t merges = 0;
};

// Throws UserError for a vocab_size below 256 + specials, an empty or repeated special token, or
// a special that is not valid UTF-8 (tokenizer.json is UTF-8).
TokenizerSpec train_bpe(const std::vector<std::string_view>& texts, const BpeTrainOptions& options,
                        BpeTrainStats* stats = nullptr);

// Note [parallel BPE counting]
// Step 1 of Note [BPE training] for a corpus that streams through many threads: each worker counts
// the pieces of the texts it is given into its own tables, one per partition of the pieces (by a
// hash of their bytes); merge() adds the tables into the totals, one partition per loop index, and
// empties them. Counts are integer sums and the words are sorted before merging starts, so the
// tokenizer is the same for any number of workers and any split of the texts among them.
class BpeWordCounter {
 public:
  // Validates the options (as train_bpe does). REQUIRES: workers >= 1.
  BpeWordCounter(BpeTrainOptions options, int workers);

  // Counts the pieces of `text` for `worker`. Thread-safe for distinct workers.
  void count(int worker, std::string_view text);
  // Adds every worker's tables into the totals (on the pool's threads). Call it between loops,
  // e.g. after each batch, so the workers' tables stay small.
  void merge(WorkerPool& pool);
  // Steps 2-4 of Note [BPE training] on the totals (merge() first). Leaves the counter empty.
  TokenizerSpec train(BpeTrainStats* stats = nullptr);

 private:
  using Table = std::unordered_map<std::string, int64_t>;
  struct Worker {
    Pretokenizer pretokenizer;
    std::vector<Table> tables;  // one per partition
    int64_t pieces = 0;
    std::string key;
  };
  BpeTrainOptions options_;
  std::vector<SpecialToken> specials_;
  std::vector<Worker> workers_;
  std::vector<Table> totals_;  // one per partition
};

}  // namespace gtron
