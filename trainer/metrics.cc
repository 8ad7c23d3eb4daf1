#include "trainer/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "model/check.h"

namespace gtron {

double peak_flops(Device device, bool bf16) {
  if (device.is_cuda()) return bf16 ? 989e12 : 67e12;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return cores * 3.5e9 * 32;
}

std::string describe_peak(Device device, bool bf16) {
  char buf[160];
  if (device.is_cuda()) {
    std::snprintf(buf, sizeof buf, "%.0f TFLOP/s (H100/H200 %s dense)",
                  peak_flops(device, bf16) / 1e12, bf16 ? "bf16" : "fp32");
  } else {
    std::snprintf(buf, sizeof buf,
                  "%.0f GFLOP/s (CPU nominal: %u cores x 3.5 GHz boost x 32 FLOP/cycle, AVX2 FMA)",
                  peak_flops(device, bf16) / 1e9,
                  std::max(1u, std::thread::hardware_concurrency()));
  }
  return buf;
}

namespace {

std::string duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  }
  return buf;
}

// JSON numbers must be finite: NaN/inf become null.
std::string num(double v, const char* fmt = "%.6g") {
  if (!std::isfinite(v)) return "null";
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

}  // namespace

std::string format_line(const StepMetrics& m) {
  char buf[512];
  std::string mtp;
  for (size_t k = 0; k < m.mtp_losses.size(); ++k) {
    char b[32];
    std::snprintf(b, sizeof b, "%s%.4f", k ? "," : "", m.mtp_losses[k]);
    mtp += b;
  }
  std::snprintf(
      buf, sizeof buf,
      "step %5ld/%ld | objective %.4f | main %.4f%s%s%s | lr %.3e | gnorm %.3f | %.0f tok/s | "
      "MFU %.2f%% | mem %.3f GiB | eta %s",
      static_cast<long>(m.step), static_cast<long>(m.total_steps), m.loss, m.main_loss,
      mtp.empty() ? "" : " | mtp [", mtp.c_str(), mtp.empty() ? "" : "]", m.lr, m.grad_norm,
      m.tokens_per_s, 100 * m.mfu, m.peak_mem_gib, duration(m.eta_s).c_str());
  std::string s = buf;
  for (const auto& [k, v] : m.extra) s += " | " + k + " " + num(v);
  return s;
}

std::string format_json(const StepMetrics& m) {
  std::string s = "{\"split\": \"train\", \"step\": " + std::to_string(m.step) +
                  ", \"loss\": " + num(m.loss, "%.9g") +
                  ", \"main_loss\": " + num(m.main_loss, "%.9g") + ", \"mtp_losses\": [";
  for (size_t k = 0; k < m.mtp_losses.size(); ++k) {
    s += (k ? ", " : "") + num(m.mtp_losses[k], "%.9g");
  }
  s += "], \"lr\": " + num(m.lr) + ", \"grad_norm\": " + num(m.grad_norm) +
       ", \"tokens_per_s\": " + num(m.tokens_per_s) + ", \"mfu\": " + num(m.mfu) +
       ", \"peak_mem_gib\": " + num(m.peak_mem_gib) + ", \"elapsed_s\": " + num(m.elapsed_s) +
       ", \"eta_s\": " + num(m.eta_s);
  for (const auto& [k, v] : m.extra) s += ", \"" + k + "\": " + num(v, "%.15g");
  if (!m.peak_by_kind.empty()) {
    s += ", \"peak_gib_by_kind\": " + format_peak_by_kind_json(m.peak_by_kind);
  }
  return s + "}";
}

std::string format_peak_by_kind_json(const std::vector<std::pair<std::string, double>>& kinds) {
  std::string s = "{";
  for (size_t i = 0; i < kinds.size(); ++i) {
    s += (i ? ", \"" : "\"") + kinds[i].first + "\": " + num(kinds[i].second);
  }
  return s + "}";
}

std::vector<std::pair<std::string, double>> peak_gib_by_kind(const memory::AllocatorStats& st) {
  std::vector<std::pair<std::string, double>> out;
  for (int k = 0; k < memory::kAllocKinds; ++k) {
    out.emplace_back(memory::alloc_kind_name(static_cast<memory::AllocKind>(k)),
                     static_cast<double>(st.peak_by_kind[k]) / (1ull << 30));
  }
  return out;
}

std::string format_val_line(const ValMetrics& m) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "eval step %ld | val objective %.4f | val main %.4f",
                static_cast<long>(m.step), m.loss, m.main_loss);
  std::string s = buf;
  for (size_t k = 0; k < m.mtp_losses.size(); ++k) {
    std::snprintf(buf, sizeof buf, " | val mtp%zu %.4f", k + 1, m.mtp_losses[k]);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, " | %ld tokens", static_cast<long>(m.tokens));
  return s + buf;
}

std::string format_val_json(const ValMetrics& m) {
  std::string s = "{\"split\": \"val\", \"step\": " + std::to_string(m.step) +
                  ", \"val_loss\": " + num(m.loss, "%.9g") +
                  ", \"val_main_loss\": " + num(m.main_loss, "%.9g") + ", \"val_mtp_losses\": [";
  for (size_t k = 0; k < m.mtp_losses.size(); ++k) {
    s += (k ? ", " : "") + num(m.mtp_losses[k], "%.9g");
  }
  s += "], \"val_tokens\": " + std::to_string(m.tokens);
  if (m.bits_per_byte >= 0) s += ", \"val_bits_per_byte\": " + num(m.bits_per_byte);
  return s + "}";
}

std::string loss_legend(int64_t depth, double loss_weight) {
  char buf[320];
  if (depth == 0) {
    std::snprintf(buf, sizeof buf,
                  "columns: objective = main (mtp.depth 0), the loss minimized | main = "
                  "next-token cross-entropy, nats/token (compare with the floor)");
  } else {
    std::snprintf(buf, sizeof buf,
                  "columns: objective = main + %g/%ld x sum(mtp), the loss minimized | main = "
                  "next-token cross-entropy, nats/token (compare with the floor) | mtp [k] = "
                  "depth k's cross-entropy on the token k+1 ahead",
                  loss_weight, static_cast<long>(depth));
  }
  return buf;
}

double objective(double main_loss, const std::vector<double>& mtp_losses, double loss_weight) {
  if (mtp_losses.empty()) return main_loss;
  double sum = 0;
  for (double l : mtp_losses) sum += l;
  return main_loss + loss_weight / static_cast<double>(mtp_losses.size()) * sum;
}

void MetricsWriter::open(const std::string& path, bool append) {
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (f_ == nullptr) throw UserError("cannot open metrics file '" + path + "' for writing");
}

void MetricsWriter::open_for_resume(const std::string& path, int64_t step) {
  long keep = 0;  // bytes of the records kept
  if (std::FILE* in = std::fopen(path.c_str(), "r")) {
    char buf[4096];
    std::string line;
    while (std::fgets(buf, sizeof buf, in) != nullptr) {
      line += buf;
      if (line.back() != '\n') continue;
      const size_t at = line.find("\"step\": ");
      if (at != std::string::npos && std::atoll(line.c_str() + at + 8) > step) break;
      keep += static_cast<long>(line.size());
      line.clear();
    }
    std::fclose(in);
    if (::truncate(path.c_str(), keep) != 0) {
      throw UserError("cannot cut metrics file '" + path + "' back to step " +
                      std::to_string(step) + ": " + std::strerror(errno));
    }
  }
  open(path, /*append=*/true);
}

void MetricsWriter::write(const std::string& json_line) {
  if (f_ == nullptr) return;
  std::fputs(json_line.c_str(), f_);
  std::fputc('\n', f_);
  std::fflush(f_);
}

MetricsWriter::~MetricsWriter() {
  if (f_ != nullptr) std::fclose(f_);
}

}  // namespace gtron
