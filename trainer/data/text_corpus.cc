#include "trainer/data/text_corpus.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/check.h"
#include "trainer/data/text_source.h"

namespace gtron {

std::string read_file_bytes(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw UserError(str_cat(what, " '", path, "': does not exist or is not a regular file."));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (!in) throw UserError(str_cat(what, " '", path, "': cannot be read."));
  return bytes.str();
}

std::vector<std::string> read_documents(const std::vector<std::string>& files,
                                        const std::string& separator_line) {
  if (files.empty()) throw UserError("no text files given. Hint: --text FILE...");
  std::vector<TextInput> inputs;
  for (const std::string& path : files) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      throw UserError(str_cat("text file '", path, "': does not exist or is not a regular file."));
    }
    inputs.push_back({path, TextFormat::kText, Compression::kNone, 0});  // text, whatever the name
  }
  // The same reader as the streaming commands: one definition of how a file becomes documents.
  RawDocumentReader reader(std::move(inputs), separator_line);
  std::vector<std::string> docs;
  RawBatch batch;
  do {
    reader.next(&batch, size_t{64} << 20);
    for (const RawDocument& d : batch.docs) docs.push_back(batch.bytes.substr(d.offset, d.size));
    if (batch.error) std::rethrow_exception(batch.error);
  } while (!batch.last);
  if (docs.empty()) {
    throw UserError(str_cat("the text files (", files.front(), (files.size() > 1 ? ", ..." : ""),
                            ") hold no text."));
  }
  return docs;
}

int64_t total_bytes(const std::vector<std::string>& documents, const std::vector<size_t>& which) {
  int64_t n = 0;
  for (size_t i : which) n += static_cast<int64_t>(documents[i].size());
  return n;
}

bool is_validation_document(int64_t i, double val_fraction) {
  return std::floor(static_cast<double>(i + 1) * val_fraction) >
         std::floor(static_cast<double>(i) * val_fraction);
}

void check_val_fraction(double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    throw UserError(str_cat("--val-fraction ", val_fraction,
                            " is not allowed; expected a fraction in [0, 1) (e.g. 0.1)."));
  }
}

void check_document_split(int64_t train_documents, int64_t val_documents, double val_fraction) {
  if (val_fraction > 0.0 && (val_documents == 0 || train_documents == 0)) {
    throw UserError(str_cat("--val-fraction ", val_fraction, " over ",
                            train_documents + val_documents, " documents leaves no document for ",
                            train_documents == 0 ? "training" : "validation",
                            ". Hint: more documents (see --doc-separator), or another fraction."));
  }
}

DocumentSplit split_documents(size_t n, double val_fraction) {
  check_val_fraction(val_fraction);
  DocumentSplit split;
  for (size_t i = 0; i < n; ++i) {
    (is_validation_document(static_cast<int64_t>(i), val_fraction) ? split.val : split.train)
        .push_back(i);
  }
  check_document_split(static_cast<int64_t>(split.train.size()),
                       static_cast<int64_t>(split.val.size()), val_fraction);
  return split;
}

}  // namespace gtron
