// `gtron prepare`: turns a source (a text file, or a synthetic Markov chain) into token shards.
//
// Output directory layout (both sources):
//   out_dir/train_000.bin   training tokens    (llm.c shard; version 1 when vocab <= 65536, else 7)
//   out_dir/val_000.bin     validation tokens  (taken from the END of the token stream)
//   out_dir/meta.json       the parameters and the results; written last, atomically
// (Text with a BPE tokenizer beyond 2^31-1 tokens, a shard's limit, continues in train_001.bin,
// val_001.bin, ...: the data globs train_*.bin and val_*.bin take them all.)
//
// Policy [idempotent prepare]: meta.json is written only after both shards are in place, so its
// presence marks a complete output. A prepare into an existing non-empty out_dir
//   - reuses it (writes nothing) when meta.json holds the same parameters and the shards validate
//     with the recorded token counts;
//   - completes it when it holds only what an interrupted prepare leaves (shards and their .tmp
//     files, no meta.json);
//   - otherwise refuses with a UserError naming the directory and the first difference; it never
//     deletes or overwrites files it did not make.
//
// Text: a byte-level tokenizer, token = byte value (vocab 256). The parameters that identify a text
// prepare are the file's path, byte size and FNV-1a 64 hash, and val_fraction.
//
// Text with a BPE tokenizer (prepare_tokenized_text): text files and JSON lines, plain or
// compressed, are streamed as documents (Note [text inputs] in trainer/data/text_source.h, Note
// [document stream] in trainer/data/document_stream.h), split into train and validation documents
// (Note [document split]), and every document is encoded as [end-of-text] + its tokens, so
// documents are separated by the end-of-text token (llm.c's convention). Documents are encoded on
// every thread and written in input order, so the shards are the same for any thread count, and
// the same documents as text files or as JSON lines give the same shards. Memory stays at a few
// batches of text whatever the corpus's size. out_dir also gets a copy of the tokenizer.json (the
// trainer puts it into every checkpoint). The parameters that identify it are the tokenizer's
// SHA-256, the texts' byte count and FNV-1a 64 hash, the document separator and val_fraction.
// Shards are written as temporaries and renamed at the end, so a bad line (or any error) leaves
// nothing behind; a previous output in out_dir is reused after its texts are hashed again
// (without encoding).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gtron {

struct PrepareResult {
  std::string train_pattern;  // out_dir/train_*.bin
  std::string val_pattern;    // out_dir/val_*.bin
  int64_t vocab = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  bool reused = false;  // true: a matching previous output was found and nothing was written
};

// REQUIRES (else UserError): text_file exists, is readable and non-empty; 0 < val_fraction < 1; the
// split leaves at least 1 token on each side (val = max(1, floor(bytes * val_fraction))).
// meta.json: {"source": "text", "tokenizer": "bytes", "vocab": 256, "text_file", "text_bytes",
// "text_fnv1a64", "val_fraction", "tokens", "val_tokens"}.
PrepareResult prepare_text(const std::string& text_file, const std::string& out_dir,
                           double val_fraction);

struct TokenizedTextOptions {
  std::vector<std::string> files;   // files, directories and globs (Note [text inputs])
  std::string tokenizer;            // tokenizer.json
  std::string doc_separator;        // a line that separates documents ("" = one document per file)
  std::string text_field = "text";  // JSON lines: the member that holds a document's text
  int64_t max_docs = 0;             // read at most this many documents (0 = all)
  int threads = 0;                  // worker threads (0 = every hardware thread)
  double val_fraction = 0.1;
  std::string eot = "<|endoftext|>";  // the special token between documents
};

// Each document is written as Tokenizer::document_start(eot) (the post-processor template's
// leading ids, e.g. Llama-3's <|begin_of_text|>, else the `eot` token), its tokens and the
// template's closing ids. REQUIRES (else UserError): readable inputs with text (a bad JSON line is
// named by file and line), a loadable tokenizer with a template or the `eot` special token, a
// split with a document on each side (trainer/data/text_corpus.h). meta.json: {"source": "text",
// "tokenizer": "bpe", "tokenizer_sha256", "vocab" (the tokenizer's vocabulary size),
// "doc_start_ids", "doc_end_ids", "eot_id" (when documents open with the eot token alone),
// "text_files", "text_bytes", "text_fnv1a64", "doc_separator", "val_fraction", "documents",
// "val_documents", "tokens", "val_tokens", "unigram_entropy" (nats/token, of the train tokens),
// "train_bytes", "val_bytes"}.
PrepareResult prepare_tokenized_text(const TokenizedTextOptions& options,
                                     const std::string& out_dir);

// One chain of tokens + val_tokens tokens from MarkovSource(order, vocab, alpha, seed, bigram),
// generated with seed splitmix64(seed); the last val_tokens go to val. meta.json is MarkovSource's
// (with entropy_rate and unigram_entropy). REQUIRES (else UserError): the MarkovSource
// requirements, tokens >= 1, val_tokens >= 1, tokens <= 2^31 - 1, val_tokens <= 2^31 - 1.
PrepareResult prepare_synthetic_markov(int order, int vocab, double alpha, int64_t tokens,
                                       int64_t val_tokens, uint64_t seed,
                                       const std::string& out_dir, double bigram = 0.0);

// Byte-level tokenizer for `gtron sample` prompts: one token per byte, 0..255.
std::vector<int32_t> tokenize_bytes(const std::string& text);

// Byte-level detokenizer: token t in [0, 256) becomes byte t. Tokens outside that range (e.g. a
// padded-vocab id a model sampled) become U+FFFD (bytes EF BF BD), so output is never silently
// lost.
std::string detokenize_bytes(const int32_t* tokens, int64_t n);
std::string detokenize_bytes(const std::vector<int32_t>& tokens);

}  // namespace gtron
