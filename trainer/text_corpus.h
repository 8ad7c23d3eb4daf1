// Text files as documents, and the train/validation split that `gtron tokenizer train` and
// `gtron prepare --tokenizer` share (so a tokenizer can be trained on the training split only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gtron {

// Reads `files` in order. Each file is one document; with a non-empty separator_line, a file is
// also cut at every line equal to separator_line (the line itself is dropped, e.g. "%" in the
// fortune files). Documents of only whitespace are dropped. Throws UserError naming a missing or
// unreadable file, or when no document is left.
std::vector<std::string> read_documents(const std::vector<std::string>& files,
                                        const std::string& separator_line);

// How many leading documents are for training: the fewest whose bytes reach (1 - val_fraction)
// of all bytes; the rest are validation. val_fraction 0 keeps everything for training.
// REQUIRES (else UserError): 0 <= val_fraction < 1, and when val_fraction > 0, at least one
// document on each side.
size_t train_document_count(const std::vector<std::string>& documents, double val_fraction);

int64_t total_bytes(const std::vector<std::string>& documents, size_t begin, size_t end);

}  // namespace gtron
