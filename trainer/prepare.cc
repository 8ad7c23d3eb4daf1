#include "trainer/prepare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>

#include "model/check.h"
#include "trainer/data/markov.h"
#include "trainer/data/shards.h"
#include "trainer/data/text_corpus.h"
#include "trainer/io/sha256.h"
#include "trainer/text/tokenizer.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kTrainFile = "train_000.bin";
constexpr const char* kValFile = "val_000.bin";
constexpr const char* kMetaFile = "meta.json";
constexpr const char* kTokenizerFile = "tokenizer.json";
constexpr int64_t kMaxShardTokens = std::numeric_limits<int32_t>::max();

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

PrepareResult result_for(const std::string& out_dir, int64_t vocab, int64_t tokens,
                         int64_t val_tokens, bool reused) {
  PrepareResult r;
  r.train_pattern = join(out_dir, "train_*.bin");
  r.val_pattern = join(out_dir, "val_*.bin");
  r.vocab = vocab;
  r.train_tokens = tokens;
  r.val_tokens = val_tokens;
  r.reused = reused;
  return r;
}

std::string refuse(const std::string& out_dir, const std::string& why) {
  return str_cat("prepare output directory '", out_dir, "': ", why,
                 ". Hint: choose another output directory, or delete this one to re-prepare.");
}

// True when out_dir is empty or every entry is a file an interrupted prepare may have left (shards,
// their temporaries, the meta temporary), so overwriting it destroys nothing of the user's.
bool only_partial_prepare_files(const std::string& out_dir) {
  const std::set<std::string> ours = {kTrainFile,
                                      kValFile,
                                      std::string(kTrainFile) + ".tmp",
                                      std::string(kValFile) + ".tmp",
                                      std::string(kMetaFile) + ".tmp",
                                      kTokenizerFile,
                                      std::string(kTokenizerFile) + ".tmp"};
  std::error_code ec;
  fs::directory_iterator it(out_dir, ec);
  if (ec) throw UserError(refuse(out_dir, str_cat("cannot list it: ", ec.message())));
  for (const auto& entry : it) {
    if (ours.count(entry.path().filename().string()) == 0) return false;
  }
  return true;
}

// meta[key] when it is an integer, else -1 (a hand-edited meta.json must not crash the check).
int64_t meta_int(const json& meta, const char* key) {
  return meta.contains(key) && meta[key].is_number_integer() ? meta[key].get<int64_t>() : -1;
}

// Applies Policy [idempotent prepare]. Returns true when out_dir holds a complete previous output
// with the same `params` (every key of params equal in meta.json) whose shards validate; false when
// the caller should write (out_dir now exists). Throws UserError when it must refuse.
bool reuse_or_claim(const std::string& out_dir, const json& params) {
  std::error_code ec;
  if (!fs::exists(out_dir, ec)) {
    if (!fs::create_directories(out_dir, ec) && ec) {
      throw UserError(refuse(out_dir, str_cat("cannot create it: ", ec.message())));
    }
    return false;
  }
  if (!fs::is_directory(out_dir, ec)) {
    throw UserError(refuse(out_dir, "exists and is not a directory"));
  }
  if (only_partial_prepare_files(out_dir)) return false;  // also true when empty
  const std::string meta_path = join(out_dir, kMetaFile);
  std::ifstream in(meta_path);
  if (!in) {
    throw UserError(
        refuse(out_dir, "is not empty and has no meta.json, so it is not a gtron prepare output"));
  }
  json meta;
  try {
    in >> meta;
  } catch (const json::exception& e) {
    throw UserError(refuse(out_dir, str_cat("its meta.json is not valid JSON (", e.what(), ")")));
  }
  for (const auto& [key, want] : params.items()) {
    if (!meta.is_object() || !meta.contains(key) || meta[key] != want) {
      const std::string got = meta.is_object() && meta.contains(key) ? meta[key].dump() : "missing";
      throw UserError(
          refuse(out_dir, str_cat("holds a previous prepare with different parameters: ", key,
                                  " is ", got, " there, but ", want.dump(), " was requested")));
    }
  }
  // Same parameters: the shards must be intact and hold the recorded counts.
  const int64_t vocab = meta_int(meta, "vocab");
  const auto train_n = static_cast<int64_t>(read_shard(join(out_dir, kTrainFile), vocab).size());
  const auto val_n = static_cast<int64_t>(read_shard(join(out_dir, kValFile), vocab).size());
  if (vocab < 1 || train_n != meta_int(meta, "tokens") || val_n != meta_int(meta, "val_tokens")) {
    throw UserError(refuse(out_dir, str_cat("its shards hold ", train_n, " + ", val_n,
                                            " tokens, which does not match its meta.json")));
  }
  return true;
}

// [eot] + tokens of each document in `which`, concatenated.
// Each document as `start` + its tokens (+ the template's closing ids, if any).
std::vector<uint32_t> encode_documents(Tokenizer& tok, const std::vector<std::string>& docs,
                                       const std::vector<size_t>& which,
                                       const std::vector<int32_t>& start) {
  std::vector<uint32_t> tokens;
  std::vector<int32_t> ids;
  const std::vector<int32_t>& after = tok.spec().template_after;
  for (size_t d : which) {
    ids = start;
    tok.encode_append(docs[d], &ids);
    ids.insert(ids.end(), after.begin(), after.end());
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  return tokens;
}

std::string read_text_file(const std::string& path) {
  std::string text = read_file_bytes(path, "text file");
  if (text.empty()) {
    throw UserError(
        str_cat("text file '", path, "': is empty; expected at least 2 bytes of text."));
  }
  return text;
}

uint64_t fnv1a64_continue(uint64_t h, const std::string& bytes) {
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

uint64_t fnv1a64(const std::string& bytes) {
  return fnv1a64_continue(0xcbf29ce484222325ULL, bytes);
}

// Entropy in nats of the token frequencies: the loss of a model that ignores context.
double unigram_entropy(const std::vector<uint32_t>& tokens) {
  std::unordered_map<uint32_t, int64_t> counts;
  for (uint32_t t : tokens) ++counts[t];
  double h = 0;
  const auto n = static_cast<double>(tokens.size());
  for (const auto& [t, c] : counts) h -= c / n * std::log(c / n);
  return h;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

PrepareResult prepare_text(const std::string& text_file, const std::string& out_dir,
                           double val_fraction) {
  if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
    throw UserError(str_cat("prepare: val_fraction ", val_fraction,
                            " is not allowed; expected a fraction strictly between 0 and 1 (e.g. "
                            "0.1)."));
  }
  const std::string text = read_text_file(text_file);
  const auto n = static_cast<int64_t>(text.size());
  const int64_t val_n =
      std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(n) * val_fraction));
  const int64_t train_n = n - val_n;
  if (train_n < 1 || train_n > kMaxShardTokens || val_n > kMaxShardTokens) {
    throw UserError(str_cat("text file '", text_file, "': ", n, " bytes split at val_fraction ",
                            val_fraction, " gives ", train_n, " train and ", val_n,
                            " val tokens; each must be in [1, 2^31-1]. Hint: use a longer (or "
                            "shorter) text, or another val_fraction."));
  }
  json params = {{"source", "text"},
                 {"text_bytes", n},
                 {"text_fnv1a64", fnv1a64(text)},
                 {"val_fraction", val_fraction}};
  if (reuse_or_claim(out_dir, params)) return result_for(out_dir, 256, train_n, val_n, true);

  std::vector<uint32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  write_shard(join(out_dir, kValFile),
              std::vector<uint32_t>(tokens.begin() + train_n, tokens.end()), kShardVersionU16);
  tokens.resize(static_cast<size_t>(train_n));
  write_shard(join(out_dir, kTrainFile), tokens, kShardVersionU16);

  json meta = params;
  meta["tokenizer"] = "bytes";
  meta["vocab"] = 256;
  meta["text_file"] = fs::absolute(text_file).string();  // informational; identity is the content
  meta["tokens"] = train_n;
  meta["val_tokens"] = val_n;
  write_file_atomic(join(out_dir, kMetaFile), meta.dump(2) + "\n");
  return result_for(out_dir, 256, train_n, val_n, false);
}

PrepareResult prepare_tokenized_text(const TokenizedTextOptions& options,
                                     const std::string& out_dir) {
  const std::string tokenizer_text = read_file_bytes(options.tokenizer, "tokenizer");
  Tokenizer tok = Tokenizer::from_json_text(tokenizer_text, options.tokenizer);
  const std::optional<std::vector<int32_t>> start = tok.document_start(options.eot);
  if (!start) {
    throw UserError(str_cat("tokenizer '", options.tokenizer, "' has no special token \"",
                            options.eot,
                            "\" and no post-processor template to open each document with. Hint: "
                            "train it with --special '",
                            options.eot, "'."));
  }
  const std::vector<std::string> docs = read_documents(options.files, options.doc_separator);
  if (!(options.val_fraction > 0.0)) {
    throw UserError(str_cat("prepare: --val-fraction ", options.val_fraction,
                            " is not allowed; expected a fraction strictly between 0 and 1."));
  }
  const DocumentSplit split = split_documents(docs.size(), options.val_fraction);
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const std::string& d : docs) hash = fnv1a64_continue(hash, d + '\0');
  json params = {{"source", "text"},
                 {"tokenizer", "bpe"},
                 {"tokenizer_sha256", sha256_hex(tokenizer_text)},
                 {"text_bytes", total_bytes(docs, split.train) + total_bytes(docs, split.val)},
                 {"text_fnv1a64", hash},
                 {"doc_separator", options.doc_separator},
                 {"val_fraction", options.val_fraction}};
  const int64_t vocab = tok.vocab_size();
  if (reuse_or_claim(out_dir, params)) {
    json meta = json::parse(read_file_bytes(join(out_dir, kMetaFile), "meta"));
    return result_for(out_dir, vocab, meta_int(meta, "tokens"), meta_int(meta, "val_tokens"), true);
  }
  const std::vector<uint32_t> train = encode_documents(tok, docs, split.train, *start);
  const std::vector<uint32_t> val = encode_documents(tok, docs, split.val, *start);
  if (train.size() > static_cast<size_t>(kMaxShardTokens) ||
      val.size() > static_cast<size_t>(kMaxShardTokens)) {
    throw UserError(str_cat("prepare: ", train.size(), " + ", val.size(),
                            " tokens; each shard holds at most 2^31-1. Hint: fewer texts."));
  }
  const int version = vocab <= 65536 ? kShardVersionU16 : kShardVersionU32;
  write_file_atomic(join(out_dir, kTokenizerFile), tokenizer_text);
  write_shard(join(out_dir, kValFile), val, version);
  write_shard(join(out_dir, kTrainFile), train, version);
  json meta = params;
  meta["vocab"] = vocab;
  meta["doc_start_ids"] = *start;
  meta["doc_end_ids"] = tok.spec().template_after;
  if (const std::optional<int32_t> eot = tok.special_id(options.eot);
      eot && start->size() == 1 && (*start)[0] == *eot) {
    meta["eot_id"] = *eot;
  }
  json files = json::array();
  for (const std::string& f : options.files) files.push_back(fs::absolute(f).string());
  meta["text_files"] = files;  // informational; identity is the content
  meta["documents"] = split.train.size();
  meta["val_documents"] = split.val.size();
  meta["tokens"] = train.size();
  meta["val_tokens"] = val.size();
  meta["unigram_entropy"] = unigram_entropy(train);
  meta["train_bytes"] = total_bytes(docs, split.train);
  meta["val_bytes"] = total_bytes(docs, split.val);
  write_file_atomic(join(out_dir, kMetaFile), meta.dump(2) + "\n");
  return result_for(out_dir, vocab, static_cast<int64_t>(train.size()),
                    static_cast<int64_t>(val.size()), false);
}

PrepareResult prepare_synthetic_markov(int order, int vocab, double alpha, int64_t tokens,
                                       int64_t val_tokens, uint64_t seed,
                                       const std::string& out_dir, double bigram) {
  if (tokens < 1 || val_tokens < 1 || tokens > kMaxShardTokens || val_tokens > kMaxShardTokens) {
    throw UserError(str_cat("prepare markov: got tokens ", tokens, " and val_tokens ", val_tokens,
                            "; each must be in [1, 2^31-1]."));
  }
  // Validates order/vocab/alpha before touching the output directory.
  const MarkovSource source(order, vocab, alpha, seed, bigram);
  json params = {{"source", "markov"},       {"order", order},  {"vocab", vocab},
                 {"alpha", alpha},           {"seed", seed},    {"tokens", tokens},
                 {"val_tokens", val_tokens}, {"bigram", bigram}};
  if (reuse_or_claim(out_dir, params)) return result_for(out_dir, vocab, tokens, val_tokens, true);

  const int version = vocab <= 65536 ? kShardVersionU16 : kShardVersionU32;
  std::vector<uint32_t> all = source.generate(tokens + val_tokens, splitmix64(seed));
  write_shard(join(out_dir, kValFile), std::vector<uint32_t>(all.begin() + tokens, all.end()),
              version);
  all.resize(static_cast<size_t>(tokens));
  write_shard(join(out_dir, kTrainFile), all, version);
  source.write_meta_json(join(out_dir, kMetaFile), tokens, val_tokens);
  return result_for(out_dir, vocab, tokens, val_tokens, false);
}

std::vector<int32_t> tokenize_bytes(const std::string& text) {
  std::vector<int32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string detokenize_bytes(const int32_t* tokens, int64_t n) {
  std::string out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] >= 0 && tokens[i] < 256) {
      out.push_back(static_cast<char>(tokens[i]));
    } else {
      out += "\xEF\xBF\xBD";
    }
  }
  return out;
}

std::string detokenize_bytes(const std::vector<int32_t>& tokens) {
  return detokenize_bytes(tokens.data(), static_cast<int64_t>(tokens.size()));
}

}  // namespace gtron
