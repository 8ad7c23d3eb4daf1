#include "trainer/data/progress.h"

#include <unistd.h>

#include <cmath>

#include "model/check.h"

namespace gtron {
namespace {

constexpr double kTerminalInterval = 0.25;  // seconds between rewrites of the terminal line

std::string human_bytes(int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  }
  return buf;
}

std::string human_seconds(double s) {
  const auto t = static_cast<int64_t>(std::llround(s));
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", static_cast<long>(t / 3600),
                  static_cast<long>(t / 60 % 60));
  } else if (t >= 60) {
    std::snprintf(buf, sizeof buf, "%ldm%02lds", static_cast<long>(t / 60),
                  static_cast<long>(t % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lds", static_cast<long>(t));
  }
  return buf;
}

// 1234567 -> "1,234,567".
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

Progress::Progress(std::string label, int64_t total_bytes, std::FILE* out, bool terminal,
                   double interval_s)
    : label_(std::move(label)),
      total_(total_bytes),
      out_(out),
      terminal_(terminal),
      interval_s_(terminal ? kTerminalInterval : interval_s),
      start_(std::chrono::steady_clock::now()) {}

Progress Progress::on_stderr(std::string label, int64_t total_bytes) {
  return Progress(std::move(label), total_bytes, stderr, ::isatty(STDERR_FILENO) == 1);
}

Progress::~Progress() {
  if (!finished_ && printed_ && terminal_) std::fputc('\n', out_);
}

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(int64_t bytes, int64_t documents) {
  bytes_ = bytes;
  documents_ = documents;
  const double now = elapsed();
  if (now - last_print_ < interval_s_) return;
  last_print_ = now;
  std::fprintf(out_, terminal_ ? "\r%s\x1b[K" : "%s\n", line(false).c_str());
  std::fflush(out_);
  printed_ = true;
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (!printed_) return;
  std::fprintf(out_, terminal_ ? "\r%s\x1b[K\n" : "%s\n", line(true).c_str());
  std::fflush(out_);
}

std::string Progress::line(bool done) const {
  const double secs = elapsed();
  const double rate = secs > 0 ? static_cast<double>(bytes_) / secs : 0.0;
  std::string s = label_ + ": " + human_bytes(bytes_);
  if (total_ > 0 && !done) {
    s += str_cat(" of ", human_bytes(total_), " (",
                 static_cast<int>(100.0 * static_cast<double>(bytes_) / total_), "%)");
  }
  s += ", " + grouped(documents_) + " documents";
  if (done) s += " in " + human_seconds(secs);
  char buf[32];
  std::snprintf(buf, sizeof buf, ", %.1f MB/s", rate / 1e6);
  s += buf;
  if (total_ > 0 && !done && rate > 0 && bytes_ < total_) {
    s += ", ETA " + human_seconds(static_cast<double>(total_ - bytes_) / rate);
  }
  return s;
}

}  // namespace gtron
