// A progress line for long reads of text (`gtron prepare`, `gtron tokenizer train`).
//
// Policy [progress output]: on a terminal, one line is rewritten in place (a carriage return) at
// most four times a second, and finish() ends it with a newline. Anywhere else (a log file, a
// pipe, a test's captured output) a plain line is printed every `interval_s` seconds (30 by
// default) and finish() prints a last one only if one was printed before: a short run prints
// nothing, a long one a line every half minute, never a flood. A line reads
//   prepare: 1.21 GB of 9.87 GB (12%), 481,230 documents, 84.2 MB/s, ETA 1m43s
// where bytes are bytes of the input files (compressed bytes for .gz and .zst, so that the ETA
// holds) and the ETA appears when the total is known.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace gtron {

// Not thread-safe: one thread reports.
class Progress {
 public:
  // total_bytes 0: unknown (no percentage, no ETA).
  Progress(std::string label, int64_t total_bytes, std::FILE* out, bool terminal,
           double interval_s = 30.0);
  // On stderr, a terminal when isatty(stderr).
  static Progress on_stderr(std::string label, int64_t total_bytes);
  // Without finish() (an error ends the run), a terminal line is only ended with a newline.
  ~Progress();
  Progress(Progress&&) = default;

  // The totals so far (both cumulative).
  void update(int64_t bytes, int64_t documents);
  void finish();

 private:
  std::string line(bool done) const;
  double elapsed() const;

  std::string label_;
  int64_t total_ = 0;
  std::FILE* out_;
  bool terminal_;
  double interval_s_;
  std::chrono::steady_clock::time_point start_;
  double last_print_ = 0;  // seconds since start_
  bool printed_ = false;
  bool finished_ = false;
  int64_t bytes_ = 0, documents_ = 0;
};

}  // namespace gtron
