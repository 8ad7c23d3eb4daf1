// Documents of a corpus of any size, streamed through every core in input order (`gtron prepare`
// and `gtron tokenizer train`).
//
// Note [document stream]
// A reader thread reads the inputs (trainer/data/text_source.h) in chunks and cuts them into raw
// batches of about batch_bytes. The calling thread takes the batches in order, parses a batch's
// JSON lines on the worker pool, drops blank documents, numbers the rest (Document::index: the
// documents before it in the corpus) and hands the batch to the caller's callback, which does its
// heavy work on the same pool (Policy [deterministic parallel loops] in
// trainer/data/worker_pool.h) and then consumes the results in order. The reader stays at most two
// batches ahead, so memory is a few batches plus the largest document, whatever the corpus's size.
//
// Errors come in input order: the first bad line or unreadable file ends the stream with a
// UserError naming the file and the line, after every batch before it was handed over (so callers
// write to temporaries and remove them on error). With max_docs, reading stops after that many
// documents, and nothing after them is looked at.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trainer/data/text_source.h"
#include "trainer/data/worker_pool.h"

namespace gtron {

struct Document {
  std::string text;
  int64_t index = 0;  // documents before it in the corpus
  int32_t input = 0;  // index into the inputs
  int64_t line = 0;   // its first line in that file (1-based)
};

struct DocumentStreamOptions {
  std::string doc_separator;        // text files: a line that separates documents ("" = none)
  std::string text_field = "text";  // JSON lines: the member that holds the text
  int64_t max_docs = 0;             // 0 = every document
  size_t batch_bytes = 0;           // 0 = 1 MiB per worker, at least 4 MiB
  std::string progress_label;       // "" = no progress line (trainer/data/progress.h)
};

struct DocumentStreamStats {
  int64_t documents = 0;
  int64_t file_bytes = 0;  // of the inputs, as read (compressed bytes for .gz and .zst)
};

// Calls on_batch(docs) for consecutive non-empty batches, in order, on the calling thread; it may
// move the texts out. Throws UserError as Note [document stream] says; an exception from on_batch
// stops the reader and propagates.
DocumentStreamStats stream_documents(const std::vector<TextInput>& inputs,
                                     const DocumentStreamOptions& options, WorkerPool& pool,
                                     const std::function<void(std::vector<Document>&)>& on_batch);

// "text input 'PATH', line N": where a document starts, for messages.
std::string document_where(const std::vector<TextInput>& inputs, const Document& doc);

}  // namespace gtron
