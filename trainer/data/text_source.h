// The text inputs of `gtron prepare` and `gtron tokenizer train`: which files --text names, and
// how each is cut into documents, read in chunks so a corpus of any size streams through.
//
// Note [text inputs]
// Each --text argument is a file, a directory or a glob; they are read in the order given.
//   - A directory stands for every file below it (recursively) whose name ends in .txt, .jsonl,
//     .txt.gz, .jsonl.gz, .txt.zst or .jsonl.zst, in byte order of their paths.
//   - An argument with *, ? or [ is a glob (glob(3)): its matches in byte order, a directory
//     among them as above. A glob that matches nothing is an error.
//   - A file named directly is read whatever its name (the fortune files have none).
// The name picks the format: a name ending in .gz is decompressed with zlib, .zst with libzstd;
// then a name ending in .jsonl is JSON lines, any other is text.
//   - Text: the file is one document; with a document separator, the file is also cut at every
//     line equal to it (a trailing \r ignored; the separator line itself is dropped), as
//     read_documents (trainer/data/text_corpus.h) does.
//   - JSON lines: every line is one JSON object whose member `text_field` (default "text") is a
//     string: that string (UTF-8) is one document. Lines of only whitespace are skipped. A line
//     that is not such an object is an error naming the file and the line (1-based).
// In both formats a document of only whitespace is dropped, so the same documents as text files
// or as JSON lines are the same corpus, document for document.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/data/byte_source.h"

namespace gtron {

enum class TextFormat { kText, kJsonLines };

struct TextInput {
  std::string path;
  TextFormat format = TextFormat::kText;
  Compression compression = Compression::kNone;
  int64_t file_bytes = 0;  // size on disk
};

// The format of a file by its name (Note [text inputs]).
TextInput text_input_for(const std::string& path);

// Expands --text arguments (Note [text inputs]). Throws UserError for an argument that is no
// file, directory or matching glob, for a directory with no text file, and when no argument is
// given.
std::vector<TextInput> expand_text_inputs(const std::vector<std::string>& args);

// One document's bytes before parsing: a text document, or one JSON line.
struct RawDocument {
  size_t offset = 0, size = 0;  // in RawBatch::bytes
  int32_t input = 0;            // index into the inputs
  int64_t line = 0;             // its first line in that file (1-based)
  bool json = false;            // a JSON line, to be parsed
};

struct RawBatch {
  std::string bytes;
  std::vector<RawDocument> docs;
  int64_t file_bytes_done = 0;  // bytes of all inputs read when this batch was complete
  // Set when reading failed (a corrupt file) after `docs`: the error comes after them.
  std::exception_ptr error;
  bool last = false;  // no batch follows
};

// Reads the inputs in order, in chunks, and cuts them into raw documents. Not thread-safe.
class RawDocumentReader {
 public:
  RawDocumentReader(std::vector<TextInput> inputs, std::string doc_separator);
  ~RawDocumentReader();

  // Fills *batch (cleared first) with the next raw documents, about `target_bytes` of them (one
  // document may be larger). Sets batch->last at the end of the inputs, and batch->error (with
  // batch->last) when a file cannot be read or decompressed: "text input 'PATH', line N: ...".
  void next(RawBatch* batch, size_t target_bytes);

  const std::vector<TextInput>& inputs() const { return inputs_; }

 private:
  void read_chunk(RawBatch* batch);
  void on_line(std::string_view line, RawBatch* batch);
  void end_document(RawBatch* batch);
  void end_file(RawBatch* batch);

  std::vector<TextInput> inputs_;
  std::string separator_;
  size_t file_ = 0;                     // the input being read
  std::unique_ptr<ByteSource> source_;  // open on inputs_[file_]
  int64_t file_bytes_before_ = 0;       // sizes of the inputs before file_
  int64_t line_ = 0;                    // lines of the file completed
  int64_t doc_line_ = 1;                // first line of the text document being gathered
  std::string partial_;                 // a line begun in an earlier chunk
  std::string doc_;                     // the text document being gathered
  std::vector<char> chunk_;
};

// The document in one JSON line (Note [text inputs]), line `line_number` of the file at `path`
// (both for messages only). Throws UserError ("text input 'PATH', line N: ...") for invalid JSON,
// a value that is no object, a missing member or a member that is no string.
std::string parse_json_line(std::string_view line, const std::string& text_field,
                            const std::string& path, int64_t line_number);

}  // namespace gtron
