// Training metrics: one human line per logged step and the same record as a JSON line in
// metrics.jsonl. MFU is model FLOPs (GPT::flops_per_token) against a stated per-device peak.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "model/device.h"

namespace gtron {

struct StepMetrics {
  int64_t step = 0;  // 1-based step just finished
  int64_t total_steps = 0;
  double loss = 0;                 // total loss (main + weighted MTP), mean over the global batch
  double main_loss = 0;            // next-token CE
  std::vector<double> mtp_losses;  // CE of each MTP depth
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;  // global tokens per second over the logging window
  double mfu = 0;           // fraction of peak
  double peak_mem_gib = 0;  // allocator peak (allocated) on this rank's device
  double elapsed_s = 0;
  double eta_s = 0;
  std::vector<std::pair<std::string, double>> extra;  // e.g. send-pool bytes (later issues)
};

// Peak FLOP/s used for MFU: H100/H200 bf16 dense 989e12, fp32 67e12; CPU: cores x 3.5 GHz x 32
// fp32 FLOPs/cycle (AVX2, two FMA pipes) at a 3.5 GHz boost clock — a nominal figure, printed
// so nobody is misled.
double peak_flops(Device device, bool bf16);
std::string describe_peak(Device device, bool bf16);

std::string format_line(const StepMetrics& m);
std::string format_json(const StepMetrics& m);

// Appends JSON lines to a file (flushed per line so a crash keeps what was logged).
class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Opens `path` for append when resuming, else truncates. Throws UserError if it cannot.
  void open(const std::string& path, bool append);
  // Resuming after step `step`: keeps the file up to its first record of a later step (a run that
  // died after its last checkpoint logged steps that will run again) or its first incomplete
  // line, cuts it there in place (truncate(2): the kept records are never rewritten, so a crash
  // here loses nothing kept) and appends after them. The file is in step order (each resume
  // cuts before appending), so what stays is one consistent curve. A missing file is created.
  void open_for_resume(const std::string& path, int64_t step);
  void write(const std::string& json_line);
  ~MetricsWriter();

 private:
  std::FILE* f_ = nullptr;
};

}  // namespace gtron
