// `gtron tokenizer train` and `gtron tokenizer encode`. Both print one JSON line of results.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gtron {

struct TokenizerTrainArgs {
  std::vector<std::string> text;    // files, directories, globs (trainer/data/text_source.h)
  std::string doc_separator;        // a line that separates documents ("" = one per file)
  std::string text_field = "text";  // JSON lines: the member with the text
  int64_t max_docs = 0;             // read at most this many documents (0 = all)
  int threads = 0;                  // worker threads (0 = every hardware thread)
  double val_fraction = 0.0;        // leave out prepare's validation split (0 = train on all)
  int64_t vocab_size = 0;
  std::vector<std::string> specials;
  std::string pattern = "gpt2";  // the split pattern: gpt2, llama3 or qwen2 (pretokenize.h)
  std::string out;               // tokenizer.json, written atomically
};

// Streams the documents (Note [document stream]) and counts their pieces on every thread (Note
// [parallel BPE counting]): the tokenizer is the same for any thread count. Prints {"out",
// "vocab_size", "merges", "unique_words", "pieces", "train_documents", "train_bytes", "seconds"}
// and a progress line on stderr (trainer/data/progress.h). Throws UserError for bad input
// (nothing is written then).
int tokenizer_train_command(const TokenizerTrainArgs& args);

struct TokenizerEncodeArgs {
  std::string tokenizer;
  std::vector<std::string> text;  // files, each encoded whole
  std::string ids_out;            // optional: the ids, space-separated, one line per file
};

// Encodes as tokenizers' encode(text) does, the file's template included (e.g. Llama-3's BOS).
// Prints {"bytes", "tokens", "seconds", "mb_per_s"} (encoding time only, one thread, cold cache).
int tokenizer_encode_command(const TokenizerEncodeArgs& args);

}  // namespace gtron
