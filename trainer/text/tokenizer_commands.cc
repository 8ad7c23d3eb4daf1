#include "trainer/text/tokenizer_commands.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "model/check.h"
#include "trainer/data/document_stream.h"
#include "trainer/data/shards.h"
#include "trainer/data/text_corpus.h"
#include "trainer/data/text_source.h"
#include "trainer/data/worker_pool.h"
#include "trainer/text/bpe_train.h"
#include "trainer/text/pretokenize.h"
#include "trainer/text/tokenizer.h"

namespace gtron {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int tokenizer_train_command(const TokenizerTrainArgs& args) {
  if (args.out.empty()) throw UserError("gtron tokenizer train: --out tokenizer.json is required");
  const std::optional<SplitPattern> pattern = split_pattern_from_name(args.pattern);
  if (!pattern) {
    throw UserError(str_cat("gtron tokenizer train: --pattern '", args.pattern,
                            "' is not a split pattern gtron knows; expected one of ",
                            split_pattern_names()));
  }
  const auto t0 = std::chrono::steady_clock::now();
  check_val_fraction(args.val_fraction);
  const std::vector<TextInput> inputs = expand_text_inputs(args.text);
  WorkerPool pool(args.threads > 0 ? args.threads : usable_hardware_threads());
  BpeTrainOptions options;
  options.vocab_size = args.vocab_size;
  options.specials = args.specials;
  options.pattern = *pattern;
  BpeWordCounter counter(options, pool.size());  // checks the options before any reading
  DocumentStreamOptions stream;
  stream.doc_separator = args.doc_separator;
  stream.text_field = args.text_field;
  stream.max_docs = args.max_docs;
  stream.progress_label = "tokenizer train";
  int64_t train_docs = 0, val_docs = 0, train_bytes = 0;
  const DocumentStreamStats read =
      stream_documents(inputs, stream, pool, [&](std::vector<Document>& docs) {
        pool.parallel_for(docs.size(), [&](size_t i, int worker) {
          if (!is_validation_document(docs[i].index, args.val_fraction)) {
            counter.count(worker, docs[i].text);
          }
        });
        counter.merge(pool);
        for (const Document& d : docs) {
          if (is_validation_document(d.index, args.val_fraction)) {
            ++val_docs;
          } else {
            ++train_docs;
            train_bytes += static_cast<int64_t>(d.text.size());
          }
        }
      });
  if (read.documents == 0) {
    throw UserError(str_cat("the text inputs (", inputs.front().path,
                            (inputs.size() > 1 ? ", ..." : ""), ") hold no text."));
  }
  check_document_split(train_docs, val_docs, args.val_fraction);
  BpeTrainStats stats;
  Tokenizer tok(counter.train(&stats), args.out);
  const std::filesystem::path parent = std::filesystem::path(args.out).parent_path();
  std::error_code ec;
  if (!parent.empty() && !std::filesystem::create_directories(parent, ec) && ec) {
    throw UserError(str_cat("--out '", args.out, "': cannot create its folder: ", ec.message()));
  }
  tok.save(args.out);
  const nlohmann::ordered_json report = {{"out", args.out},
                                         {"vocab_size", tok.vocab_size()},
                                         {"merges", stats.merges},
                                         {"unique_words", stats.unique_words},
                                         {"pieces", stats.pieces},
                                         {"train_documents", train_docs},
                                         {"train_bytes", train_bytes},
                                         {"seconds", seconds_since(t0)}};
  std::printf("%s\n", report.dump().c_str());
  return 0;
}

int tokenizer_encode_command(const TokenizerEncodeArgs& args) {
  Tokenizer tok = Tokenizer::load(args.tokenizer);
  const std::vector<std::string> files = read_documents(args.text, "");
  if (files.size() != args.text.size()) {
    throw UserError("gtron tokenizer encode: a --text file holds no text");
  }
  std::vector<std::vector<int32_t>> ids(files.size());
  int64_t bytes = 0, tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t f = 0; f < files.size(); ++f) {
    ids[f] = tok.encode_with_template(files[f]);
    bytes += static_cast<int64_t>(files[f].size());
    tokens += static_cast<int64_t>(ids[f].size());
  }
  const double secs = seconds_since(t0);
  if (!args.ids_out.empty()) {
    std::string text;
    for (const auto& line : ids) {
      for (size_t i = 0; i < line.size(); ++i) text += (i ? " " : "") + std::to_string(line[i]);
      text += "\n";
    }
    write_file_atomic(args.ids_out, text);
  }
  const nlohmann::ordered_json report = {{"bytes", bytes},
                                         {"tokens", tokens},
                                         {"seconds", secs},
                                         {"mb_per_s", secs > 0 ? bytes / secs / 1e6 : 0.0}};
  std::printf("%s\n", report.dump().c_str());
  return 0;
}

}  // namespace gtron
