#include "trainer/prepare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "model/check.h"
#include "trainer/data/document_stream.h"
#include "trainer/data/markov.h"
#include "trainer/data/shard_writer.h"
#include "trainer/data/shards.h"
#include "trainer/data/text_corpus.h"
#include "trainer/data/text_source.h"
#include "trainer/data/worker_pool.h"
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

// A shard file of ours: train_NNN.bin or val_NNN.bin (a corpus beyond one shard continues in 001),
// or its temporary (NAME.tmp) when `tmp_too`. The prefix ("train_" or "val_") goes to *prefix.
bool is_shard_name(std::string name, bool tmp_too, std::string* prefix = nullptr) {
  auto ends_with = [&](const std::string& s) {
    return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (tmp_too && ends_with(".tmp")) name.resize(name.size() - 4);
  if (!ends_with(".bin")) return false;
  const size_t us = name.find('_');
  const std::string head = name.substr(0, us + 1),
                    digits = name.substr(us + 1, name.size() - us - 5);
  if (prefix != nullptr) *prefix = head;
  return (head == "train_" || head == "val_") && digits.size() >= 3 &&
         digits.find_first_not_of("0123456789") == std::string::npos;
}

std::string refuse(const std::string& out_dir, const std::string& why) {
  return str_cat("prepare output directory '", out_dir, "': ", why,
                 ". Hint: choose another output directory, or delete this one to re-prepare.");
}

// True when out_dir is empty or every entry is a file an interrupted prepare may have left (shards,
// their temporaries, the meta temporary), so overwriting it destroys nothing of the user's.
bool only_partial_prepare_files(const std::string& out_dir) {
  const std::set<std::string> ours = {std::string(kMetaFile) + ".tmp", kTokenizerFile,
                                      std::string(kTokenizerFile) + ".tmp"};
  std::error_code ec;
  fs::directory_iterator it(out_dir, ec);
  if (ec) throw UserError(refuse(out_dir, str_cat("cannot list it: ", ec.message())));
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    if (ours.count(name) == 0 && !is_shard_name(name, /*tmp_too=*/true)) return false;
  }
  return true;
}

// The shard files of `prefix` ("train" or "val") in out_dir, in order.
std::vector<std::string> shard_files(const std::string& out_dir, const std::string& prefix) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    std::string head;
    if (is_shard_name(entry.path().filename().string(), /*tmp_too=*/false, &head) &&
        head == prefix + "_") {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Tokens in the shards of `prefix`, each read and validated against vocab.
int64_t shard_tokens(const std::string& out_dir, const std::string& prefix, int64_t vocab) {
  int64_t n = 0;
  for (const std::string& f : shard_files(out_dir, prefix)) {
    n += static_cast<int64_t>(read_shard(f, vocab).size());
  }
  return n;
}

// meta[key] when it is an integer, else -1 (a hand-edited meta.json must not crash the check).
int64_t meta_int(const json& meta, const char* key) {
  return meta.contains(key) && meta[key].is_number_integer() ? meta[key].get<int64_t>() : -1;
}

// True when prepare may write into out_dir (Policy [idempotent prepare]): it does not exist, or
// holds only what an interrupted prepare leaves. False when it holds a complete previous output
// (a meta.json). Throws UserError when it must refuse (not a directory, files of someone else's).
bool claimable(const std::string& out_dir) {
  std::error_code ec;
  if (!fs::exists(out_dir, ec)) return true;
  if (!fs::is_directory(out_dir, ec)) {
    throw UserError(refuse(out_dir, "exists and is not a directory"));
  }
  if (only_partial_prepare_files(out_dir)) return true;  // also true when empty
  if (!fs::exists(join(out_dir, kMetaFile), ec)) {
    throw UserError(
        refuse(out_dir, "is not empty and has no meta.json, so it is not a gtron prepare output"));
  }
  return false;
}

void create_out_dir(const std::string& out_dir) {
  std::error_code ec;
  if (!fs::create_directories(out_dir, ec) && ec) {
    throw UserError(refuse(out_dir, str_cat("cannot create it: ", ec.message())));
  }
}

json previous_meta(const std::string& out_dir) {
  std::ifstream in(join(out_dir, kMetaFile));
  json meta;
  try {
    in >> meta;
  } catch (const json::exception& e) {
    throw UserError(refuse(out_dir, str_cat("its meta.json is not valid JSON (", e.what(), ")")));
  }
  return meta;
}

// Throws UserError naming the first key of `params` whose value differs in meta.
void check_same_params(const std::string& out_dir, const json& meta, const json& params) {
  for (const auto& [key, want] : params.items()) {
    if (!meta.is_object() || !meta.contains(key) || meta[key] != want) {
      const std::string got = meta.is_object() && meta.contains(key) ? meta[key].dump() : "missing";
      throw UserError(
          refuse(out_dir, str_cat("holds a previous prepare with different parameters: ", key,
                                  " is ", got, " there, but ", want.dump(), " was requested")));
    }
  }
}

// Same parameters: the shards must be intact and hold the recorded counts.
void check_previous_shards(const std::string& out_dir, const json& meta) {
  const int64_t vocab = meta_int(meta, "vocab");
  const int64_t train_n = shard_tokens(out_dir, "train", vocab);
  const int64_t val_n = shard_tokens(out_dir, "val", vocab);
  if (vocab < 1 || train_n != meta_int(meta, "tokens") || val_n != meta_int(meta, "val_tokens")) {
    throw UserError(refuse(out_dir, str_cat("its shards hold ", train_n, " + ", val_n,
                                            " tokens, which does not match its meta.json")));
  }
}

// Applies Policy [idempotent prepare]. Returns true when out_dir holds a complete previous output
// with the same `params` (every key of params equal in meta.json) whose shards validate; false when
// the caller should write (out_dir now exists). Throws UserError when it must refuse.
bool reuse_or_claim(const std::string& out_dir, const json& params) {
  if (claimable(out_dir)) {
    create_out_dir(out_dir);
    return false;
  }
  const json meta = previous_meta(out_dir);
  check_same_params(out_dir, meta, params);
  check_previous_shards(out_dir, meta);
  return true;
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

// Entropy in nats of the token frequencies (counts[t]: occurrences of token t): the loss of a
// model that ignores context. Summed in token order, so it does not depend on hashing.
double unigram_entropy(const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  double h = 0;
  const auto n = static_cast<double>(total);
  for (int64_t c : counts) {
    if (c > 0) h -= static_cast<double>(c) / n * std::log(static_cast<double>(c) / n);
  }
  return h;
}

// What identifies the texts (Policy [idempotent prepare]): their bytes and the FNV-1a 64 hash of
// the documents in order, each followed by a 0 byte.
struct TextIdentity {
  int64_t bytes = 0;
  uint64_t hash = 0xcbf29ce484222325ULL;
  void add(const std::string& doc) {
    bytes += static_cast<int64_t>(doc.size());
    hash = fnv1a64_continue(hash, doc) * 0x100000001b3ULL;  // then the 0 byte: h = (h ^ 0) * p
  }
};

// The output directory and the parents a prepare creates, removed again (when empty) unless
// keep() was called: an error leaves nothing behind. The ShardWriters, destroyed first, remove
// their temporaries.
class CreatedDirs {
 public:
  explicit CreatedDirs(const std::string& out_dir) {
    std::error_code ec;
    for (fs::path p = fs::absolute(out_dir); !p.empty() && !fs::exists(p, ec);
         p = p.parent_path()) {
      created_.push_back(p);  // deepest first
    }
    create_out_dir(out_dir);
  }
  ~CreatedDirs() {
    if (kept_) return;
    std::error_code ec;
    for (const fs::path& p : created_) fs::remove(p, ec);  // only an empty directory goes
  }
  CreatedDirs(const CreatedDirs&) = delete;
  CreatedDirs& operator=(const CreatedDirs&) = delete;
  void keep() { kept_ = true; }

 private:
  std::vector<fs::path> created_;
  bool kept_ = false;
};

// Shard files of ours (and their temporaries) that an interrupted earlier prepare left beyond the
// ones just written: the glob train_*.bin must see only this output.
void remove_stale_shards(const std::string& out_dir, const std::vector<std::string>& written) {
  std::set<std::string> keep;
  for (const std::string& f : written) keep.insert(fs::path(f).filename().string());
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (keep.count(name) == 0 && is_shard_name(name, /*tmp_too=*/true)) {
      stale.push_back(entry.path());
    }
  }
  for (const fs::path& p : stale) fs::remove(p, ec);
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

namespace {

// Counts of the documents encoded into the shards; [0] train, [1] validation.
struct EncodedCorpus {
  TextIdentity text;
  int64_t documents[2] = {0, 0};
  int64_t bytes[2] = {0, 0};
  std::vector<int64_t> train_counts;  // occurrences of each token id in the train shards
};

// One batch of documents and their ids, on its way to the shards.
struct EncodedBatch {
  std::vector<Document> docs;
  std::vector<std::vector<int32_t>> ids;  // per document: start + its tokens + the closing ids
};

// Streams the documents (Note [document stream]) and encodes each batch on every worker with its
// own Tokenizer (Tokenizer is not thread-safe). A sink thread then hashes the batch's documents
// and appends their ids to the train or the validation shards in input order (Note [document
// split]) while the next batch is encoded: the serial part stays off the critical path.
EncodedCorpus encode_corpus(const std::string& tokenizer_text, const TokenizedTextOptions& options,
                            const std::vector<int32_t>& start, const std::vector<TextInput>& inputs,
                            const DocumentStreamOptions& stream, WorkerPool& pool,
                            ShardWriter* train, ShardWriter* val) {
  const auto workers = static_cast<size_t>(pool.size());
  std::vector<std::optional<Tokenizer>> encoders(workers);
  pool.parallel_for(workers, [&](size_t i, int) {
    encoders[i].emplace(Tokenizer::from_json_text(tokenizer_text, options.tokenizer));
  });
  const std::vector<int32_t> after = encoders[0]->spec().template_after;
  const auto vocab = static_cast<size_t>(encoders[0]->vocab_size());
  // Token counts of the train documents, per worker (summed at the end: integer sums).
  std::vector<std::vector<int64_t>> counts(workers, std::vector<int64_t>(vocab, 0));
  EncodedCorpus c;
  EncodedBatch sinking;    // the batch the sink is writing
  std::future<void> sink;  // declared after `sinking`: destroyed (joined) first
  auto write = [&c, &options, train, val](const EncodedBatch& b) {
    for (size_t i = 0; i < b.docs.size(); ++i) {
      const bool is_val = is_validation_document(b.docs[i].index, options.val_fraction);
      c.text.add(b.docs[i].text);
      ++c.documents[is_val];
      c.bytes[is_val] += static_cast<int64_t>(b.docs[i].text.size());
      (is_val ? val : train)->append(b.ids[i]);
    }
  };
  stream_documents(inputs, stream, pool, [&](std::vector<Document>& docs) {
    EncodedBatch batch;
    batch.docs = std::move(docs);
    batch.ids.resize(batch.docs.size());
    pool.parallel_for(batch.docs.size(), [&](size_t i, int worker) {
      const Document& d = batch.docs[i];
      std::vector<int32_t>& ids = batch.ids[i];
      ids = start;
      try {
        encoders[static_cast<size_t>(worker)]->encode_append(d.text, &ids);
      } catch (const UserError& e) {
        throw UserError(str_cat(document_where(inputs, d), ": ", e.what()));
      }
      ids.insert(ids.end(), after.begin(), after.end());
      if (!is_validation_document(d.index, options.val_fraction)) {
        std::vector<int64_t>& mine = counts[static_cast<size_t>(worker)];
        for (int32_t t : ids) ++mine[static_cast<size_t>(t)];
      }
    });
    if (sink.valid()) sink.get();  // the previous batch is written (or its error thrown here)
    sinking = std::move(batch);
    sink = std::async(std::launch::async, [&] { write(sinking); });
  });
  if (sink.valid()) sink.get();
  c.train_counts.assign(vocab, 0);
  for (const std::vector<int64_t>& mine : counts) {
    for (size_t t = 0; t < vocab; ++t) c.train_counts[t] += mine[t];
  }
  return c;
}

[[noreturn]] void no_text(const std::vector<TextInput>& inputs) {
  throw UserError(str_cat("the text inputs (", inputs.front().path,
                          (inputs.size() > 1 ? ", ..." : ""), ") hold no text."));
}

// out_dir holds a complete previous output: it is reused when its parameters and its texts are
// these (the texts are read and hashed, not encoded), else refused.
PrepareResult reuse_previous(const std::string& out_dir, const json& params,
                             const std::vector<TextInput>& inputs, DocumentStreamOptions stream,
                             WorkerPool& pool, int64_t vocab, double val_fraction) {
  const json meta = previous_meta(out_dir);
  check_same_params(out_dir, meta, params);  // other parameters: refused before any reading
  stream.progress_label = "prepare (hashing the texts to compare with " + out_dir + ")";
  TextIdentity text;
  int64_t split[2] = {0, 0};
  stream_documents(inputs, stream, pool, [&](std::vector<Document>& docs) {
    for (const Document& d : docs) {
      text.add(d.text);
      ++split[is_validation_document(d.index, val_fraction)];
    }
  });
  if (split[0] + split[1] == 0) no_text(inputs);
  check_document_split(split[0], split[1], val_fraction);
  check_same_params(out_dir, meta, {{"text_bytes", text.bytes}, {"text_fnv1a64", text.hash}});
  check_previous_shards(out_dir, meta);
  return result_for(out_dir, vocab, meta_int(meta, "tokens"), meta_int(meta, "val_tokens"), true);
}

}  // namespace

PrepareResult prepare_tokenized_text(const TokenizedTextOptions& options,
                                     const std::string& out_dir) {
  const std::string tokenizer_text = read_file_bytes(options.tokenizer, "tokenizer");
  const Tokenizer tok = Tokenizer::from_json_text(tokenizer_text, options.tokenizer);
  const std::optional<std::vector<int32_t>> start = tok.document_start(options.eot);
  if (!start) {
    throw UserError(str_cat("tokenizer '", options.tokenizer, "' has no special token \"",
                            options.eot,
                            "\" and no post-processor template to open each document with. Hint: "
                            "train it with --special '",
                            options.eot, "'."));
  }
  if (!(options.val_fraction > 0.0 && options.val_fraction < 1.0)) {
    throw UserError(str_cat("prepare: --val-fraction ", options.val_fraction,
                            " is not allowed; expected a fraction strictly between 0 and 1."));
  }
  const std::vector<TextInput> inputs = expand_text_inputs(options.files);
  json params = {{"source", "text"},
                 {"tokenizer", "bpe"},
                 {"tokenizer_sha256", sha256_hex(tokenizer_text)},
                 {"doc_separator", options.doc_separator},
                 {"val_fraction", options.val_fraction}};
  WorkerPool pool(options.threads > 0 ? options.threads : usable_hardware_threads());
  DocumentStreamOptions stream;
  stream.doc_separator = options.doc_separator;
  stream.text_field = options.text_field;
  stream.max_docs = options.max_docs;
  stream.progress_label = "prepare";
  const int64_t vocab = tok.vocab_size();
  if (!claimable(out_dir)) {
    return reuse_previous(out_dir, params, inputs, stream, pool, vocab, options.val_fraction);
  }
  CreatedDirs created(out_dir);
  const int version = vocab <= 65536 ? kShardVersionU16 : kShardVersionU32;
  ShardWriter train(out_dir, "train", version), val(out_dir, "val", version);
  const EncodedCorpus c =
      encode_corpus(tokenizer_text, options, *start, inputs, stream, pool, &train, &val);
  if (c.documents[0] + c.documents[1] == 0) no_text(inputs);
  check_document_split(c.documents[0], c.documents[1], options.val_fraction);
  params["text_bytes"] = c.text.bytes;
  params["text_fnv1a64"] = c.text.hash;
  write_file_atomic(join(out_dir, kTokenizerFile), tokenizer_text);
  std::vector<std::string> written = val.commit();
  for (std::string& f : train.commit()) written.push_back(std::move(f));
  remove_stale_shards(out_dir, written);
  json meta = params;
  meta["vocab"] = vocab;
  meta["doc_start_ids"] = *start;
  meta["doc_end_ids"] = tok.spec().template_after;
  if (const std::optional<int32_t> eot = tok.special_id(options.eot);
      eot && start->size() == 1 && (*start)[0] == *eot) {
    meta["eot_id"] = *eot;
  }
  json files = json::array();
  for (const TextInput& in : inputs) files.push_back(fs::absolute(in.path).string());
  meta["text_files"] = files;  // informational; identity is the content
  meta["documents"] = c.documents[0];
  meta["val_documents"] = c.documents[1];
  meta["tokens"] = train.tokens();
  meta["val_tokens"] = val.tokens();
  meta["unigram_entropy"] = unigram_entropy(c.train_counts);
  meta["train_bytes"] = c.bytes[0];
  meta["val_bytes"] = c.bytes[1];
  write_file_atomic(join(out_dir, kMetaFile), meta.dump(2) + "\n");
  created.keep();
  return result_for(out_dir, vocab, train.tokens(), val.tokens(), false);
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
