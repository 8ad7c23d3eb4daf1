#include "trainer/data/document_stream.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "model/check.h"
#include "trainer/data/progress.h"

namespace gtron {
namespace {

constexpr size_t kReadAhead = 2;  // raw batches the reader may have waiting

bool blank(std::string_view s) { return s.find_first_not_of(" \t\r\n\f\v") == std::string::npos; }

std::string where(const std::vector<TextInput>& inputs, int32_t input, int64_t line) {
  return str_cat("text input '", inputs[static_cast<size_t>(input)].path, "', line ", line);
}

// The reader thread of Note [document stream] and its bounded queue. Its destructor stops and
// joins the thread, so an error on the calling thread never leaves it running.
class ReadAhead {
 public:
  ReadAhead(const std::vector<TextInput>& inputs, const std::string& separator, size_t bytes)
      : reader_(inputs, separator), bytes_(bytes), thread_([this] { run(); }) {}

  ~ReadAhead() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  RawBatch pop() {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return !queue_.empty(); });
    RawBatch b = std::move(queue_.front());
    queue_.pop_front();
    changed_.notify_all();
    return b;
  }

 private:
  void run() {
    for (bool last = false; !last;) {
      RawBatch b;
      try {
        reader_.next(&b, bytes_);
      } catch (...) {  // not the input's fault (e.g. out of memory): still ends the stream
        b.docs.clear();
        b.error = std::current_exception();
        b.last = true;
      }
      last = b.last;
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [this] { return stop_ || queue_.size() < kReadAhead; });
      if (stop_) return;
      queue_.push_back(std::move(b));
      changed_.notify_all();
    }
  }

  RawDocumentReader reader_;
  size_t bytes_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<RawBatch> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace

std::string document_where(const std::vector<TextInput>& inputs, const Document& doc) {
  return where(inputs, doc.input, doc.line);
}

DocumentStreamStats stream_documents(const std::vector<TextInput>& inputs,
                                     const DocumentStreamOptions& options, WorkerPool& pool,
                                     const std::function<void(std::vector<Document>&)>& on_batch) {
  const size_t batch_bytes =
      options.batch_bytes > 0
          ? options.batch_bytes
          : std::max<size_t>(size_t{4} << 20, static_cast<size_t>(pool.size()) << 20);
  int64_t total = 0;
  for (const TextInput& in : inputs) total += in.file_bytes;
  std::optional<Progress> progress;
  if (!options.progress_label.empty()) {
    progress.emplace(Progress::on_stderr(options.progress_label, total));
  }
  DocumentStreamStats stats;
  ReadAhead ahead(inputs, options.doc_separator, batch_bytes);
  for (;;) {
    const RawBatch raw = ahead.pop();
    const size_t n = raw.docs.size();
    std::vector<Document> docs(n);
    std::vector<std::exception_ptr> errors(n);  // per line: lines after max_docs never count
    pool.parallel_for(n, [&](size_t i, int) {
      const RawDocument& r = raw.docs[i];
      const std::string_view bytes(raw.bytes.data() + r.offset, r.size);
      Document& d = docs[i];
      d.input = r.input;
      d.line = r.line;
      try {
        d.text = r.json ? parse_json_line(bytes, options.text_field,
                                          inputs[static_cast<size_t>(r.input)].path, r.line)
                        : std::string(bytes);
      } catch (const UserError&) {
        errors[i] = std::current_exception();
      }
    });
    size_t kept = 0;
    bool enough = false;
    for (size_t i = 0; i < n && !enough; ++i) {
      if (errors[i]) std::rethrow_exception(errors[i]);
      if (blank(docs[i].text)) continue;
      docs[i].index = stats.documents++;
      if (kept != i) docs[kept] = std::move(docs[i]);
      ++kept;
      enough = options.max_docs > 0 && stats.documents == options.max_docs;
    }
    docs.resize(kept);
    if (!docs.empty()) on_batch(docs);
    stats.file_bytes = raw.file_bytes_done;
    if (progress) progress->update(stats.file_bytes, stats.documents);
    if (enough) break;
    if (raw.error) std::rethrow_exception(raw.error);
    if (raw.last) break;
  }
  if (progress) progress->finish();
  return stats;
}

}  // namespace gtron
