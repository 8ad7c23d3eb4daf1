#include "trainer/data/text_corpus.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/check.h"

namespace gtron {
namespace {

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\n\f\v") == std::string::npos; }

void add_document(std::string doc, std::vector<std::string>* out) {
  if (!blank(doc)) out->push_back(std::move(doc));
}

}  // namespace

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
  std::vector<std::string> docs;
  for (const std::string& path : files) {
    std::string text = read_file_bytes(path, "text file");
    if (separator_line.empty()) {
      add_document(std::move(text), &docs);
      continue;
    }
    std::string doc;
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find('\n', pos);
      end = end == std::string::npos ? text.size() : end + 1;
      std::string_view line(text.data() + pos, end - pos);
      std::string_view bare = line.substr(0, line.size() - (line.back() == '\n' ? 1 : 0));
      if (!bare.empty() && bare.back() == '\r') bare.remove_suffix(1);
      if (bare == separator_line) {
        add_document(std::move(doc), &docs);
        doc.clear();
      } else {
        doc.append(line);
      }
      pos = end;
    }
    add_document(std::move(doc), &docs);
  }
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

DocumentSplit split_documents(size_t n, double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    throw UserError(str_cat("--val-fraction ", val_fraction,
                            " is not allowed; expected a fraction in [0, 1) (e.g. 0.1)."));
  }
  DocumentSplit split;
  for (size_t i = 0; i < n; ++i) {
    const bool val = std::floor(static_cast<double>(i + 1) * val_fraction) >
                     std::floor(static_cast<double>(i) * val_fraction);
    (val ? split.val : split.train).push_back(i);
  }
  if (val_fraction > 0.0 && (split.val.empty() || split.train.empty())) {
    throw UserError(str_cat("--val-fraction ", val_fraction, " over ", n,
                            " documents leaves no document for ",
                            split.train.empty() ? "training" : "validation",
                            ". Hint: more documents (see --doc-separator), or another fraction."));
  }
  return split;
}

}  // namespace gtron
