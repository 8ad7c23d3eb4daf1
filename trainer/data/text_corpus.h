// Text files as documents, and the train/validation split that `gtron tokenizer train` and
// `gtron prepare --tokenizer` share (so a tokenizer can be trained on the training split only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gtron {

// The bytes of the file at `path`. Throws UserError naming `what` and the path when it is missing,
// not a regular file, or unreadable.
std::string read_file_bytes(const std::string& path, const std::string& what);

// Reads `files` in order. Each file is one document; with a non-empty separator_line, a file is
// also cut at every line equal to separator_line (the line itself is dropped, e.g. "%" in the
// fortune files). Documents of only whitespace are dropped. Every file is read as text whatever
// its name (`gtron tokenizer encode`); `gtron prepare` and `gtron tokenizer train` stream their
// inputs through trainer/data/document_stream.h, which cuts text files the same way. Throws
// UserError naming a missing or unreadable file, or when no document is left.
std::vector<std::string> read_documents(const std::vector<std::string>& files,
                                        const std::string& separator_line);

// Note [document split]
// Document i (0-based) is for validation when floor((i + 1) * f) > floor(i * f), f the
// val_fraction: floor(n * f) validation documents spread evenly through the corpus (with f = 0.1,
// every tenth), so validation text is drawn from every file, not only the last one.
struct DocumentSplit {
  std::vector<size_t> train, val;  // document indices, ascending
};
// REQUIRES (else UserError): 0 <= val_fraction < 1; when val_fraction > 0, at least one document
// on each side. val_fraction 0 puts every document into train.
DocumentSplit split_documents(size_t n, double val_fraction);

// The same split one document at a time, for a corpus that streams: the rule of the note, and its
// requirements checked before (check_val_fraction) and after (check_document_split) the documents
// are read. Both throw the UserErrors split_documents throws.
bool is_validation_document(int64_t i, double val_fraction);
void check_val_fraction(double val_fraction);
void check_document_split(int64_t train_documents, int64_t val_documents, double val_fraction);

int64_t total_bytes(const std::vector<std::string>& documents, const std::vector<size_t>& which);

}  // namespace gtron
