#include "trainer/data/sampler.h"

#include <algorithm>
#include <limits>

#include "model/check.h"

namespace gtron {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

void check_seq_len(int64_t T) {
  if (T < 1) {
    throw UserError(str_cat("sequence length ", T, " is not allowed; expected T >= 1."));
  }
}

// Tokens reach the model as int32; a version-7 shard opened without a vocab check could hold more.
void check_fits_int32(const ShardSet& shards) {
  if (shards.max_token() > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    throw UserError(str_cat("data pattern '", shards.pattern(), "': token ", shards.max_token(),
                            " does not fit int32. Hint: open the shards with the model's vocab."));
  }
}

void copy_window(const std::vector<uint32_t>& tokens, int64_t offset, int64_t len, int32_t* out) {
  GTRON_CHECK(offset >= 0 && offset + len <= static_cast<int64_t>(tokens.size()), "window [",
              offset, ", ", offset + len, ") outside a shard of ", tokens.size(), " tokens");
  for (int64_t t = 0; t < len; ++t) out[t] = static_cast<int32_t>(tokens[offset + t]);
}

// The shard whose range [cumulative[s], cumulative[s+1]) holds r.
int64_t shard_of(const std::vector<int64_t>& cumulative, int64_t r) {
  return std::upper_bound(cumulative.begin(), cumulative.end(), r) - cumulative.begin() - 1;
}

}  // namespace

uint64_t window_hash(uint64_t seed, int64_t step, int64_t index) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ static_cast<uint64_t>(step));
  return splitmix64(h ^ static_cast<uint64_t>(index));
}

SequenceSampler::SequenceSampler(const ShardSet& shards, int64_t T) : shards_(shards), T_(T) {
  check_seq_len(T);
  check_fits_int32(shards);
  cumulative_.assign(1, 0);
  for (int64_t s = 0; s < shards.num_shards(); ++s) {
    const int64_t n = shards.num_tokens(s);
    if (n < T + 1) {
      throw UserError(str_cat("data shard '", shards.path(s), "': has ", n,
                              " tokens, fewer than one training window of seq_len + 1 = ", T + 1,
                              ". Hint: lower the sequence length, or prepare larger shards."));
    }
    cumulative_.push_back(cumulative_.back() + (n - T));
  }
}

void SequenceSampler::locate(uint64_t seed, int64_t step, int64_t index, int64_t* shard,
                             int64_t* offset) const {
  const uint64_t h = window_hash(seed, step, index);
  // floor(h * W / 2^64): uniform over [0, W) up to a bias of W / 2^64, far below anything visible.
  const auto r = static_cast<int64_t>(
      (static_cast<unsigned __int128>(h) * static_cast<unsigned __int128>(num_windows())) >> 64);
  *shard = shard_of(cumulative_, r);
  *offset = r - cumulative_[*shard];
}

void SequenceSampler::sample(uint64_t seed, int64_t step, int64_t first_seq, int64_t count,
                             int32_t* out) const {
  GTRON_CHECK(step >= 0 && first_seq >= 0 && count >= 0, "sample(step ", step, ", first_seq ",
              first_seq, ", count ", count, ")");
  for (int64_t j = 0; j < count; ++j) {
    int64_t shard = 0;
    int64_t offset = 0;
    locate(seed, step, first_seq + j, &shard, &offset);
    copy_window(shards_.tokens(shard), offset, T_ + 1, out + j * (T_ + 1));
  }
}

void sample_sequences(const ShardSet& shards, uint64_t seed, int64_t step, int64_t first_seq,
                      int64_t count, int64_t T, int32_t* out) {
  SequenceSampler(shards, T).sample(seed, step, first_seq, count, out);
}

EvalWindows::EvalWindows(const ShardSet& shards, int64_t T) : shards_(shards), T_(T) {
  check_seq_len(T);
  check_fits_int32(shards);
  cumulative_.assign(1, 0);
  for (int64_t s = 0; s < shards.num_shards(); ++s) {
    // Starts k*T with k*T + T + 1 <= n, i.e. k < (n - 1) / T.
    cumulative_.push_back(cumulative_.back() + (shards.num_tokens(s) - 1) / T);
  }
  if (num_windows() == 0) {
    throw UserError(str_cat("data pattern '", shards.pattern(),
                            "': no shard has seq_len + 1 = ", T + 1,
                            " tokens, so there is no evaluation window. Hint: lower the sequence "
                            "length, or prepare a larger validation split."));
  }
}

void EvalWindows::fill(int64_t first, int64_t count, int32_t* out) const {
  GTRON_CHECK(first >= 0 && count >= 0 && first + count <= num_windows(), "eval windows [", first,
              ", ", first + count, ") of ", num_windows());
  for (int64_t j = 0; j < count; ++j) {
    const int64_t w = first + j;
    const int64_t s = shard_of(cumulative_, w);
    copy_window(shards_.tokens(s), (w - cumulative_[s]) * T_, T_ + 1, out + j * (T_ + 1));
  }
}

}  // namespace gtron
