// Training metrics: one human line per logged step and the same record as a JSON line in
// metrics.jsonl, and one validation record per evaluation. MFU is model FLOPs
// (GPT::flops_per_token) against a stated per-device peak.
//
// metrics.jsonl holds two kinds of records, told apart by "split":
//   train: {"split": "train", "step": N, "loss": objective, "main_loss": ..., "mtp_losses": [...],
//           "lr": ..., "grad_norm": ..., "tokens_per_s": ..., ...extras,
//           "peak_gib_by_kind": {"other": ..., "weights": ..., ...}}
//   val:   {"split": "val", "step": N, "val_loss": objective, "val_main_loss": ...,
//           "val_mtp_losses": [...], "val_tokens": n[, "val_bits_per_byte": ...]}
// "loss" and "val_loss" are the objective main + (λ/D)·Σ_k mtp_k (= main at D = 0). A val record
// of step N follows the train record of step N. Readers that look for the text `"loss": ` (the
// convergence script, the tests) see train records only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "memory/caching_allocator.h"
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
  // The allocator's peak split by what the bytes are for (Note [allocation kinds] in
  // memory/caching_allocator.h), GiB by kind name; JSON only ("peak_gib_by_kind").
  std::vector<std::pair<std::string, double>> peak_by_kind;
};

// The peak of `st` by allocation kind, GiB, in AllocKind order.
std::vector<std::pair<std::string, double>> peak_gib_by_kind(const memory::AllocatorStats& st);
// The JSON object {"other": GiB, "weights": GiB, ...} of peak_gib_by_kind's pairs.
std::string format_peak_by_kind_json(const std::vector<std::pair<std::string, double>>& kinds);

// One evaluation: the mean validation losses at step `step` (see the top of this file).
struct ValMetrics {
  int64_t step = 0;
  double loss = 0;  // objective: main + (λ/D)·Σ_k mtp_k
  double main_loss = 0;
  std::vector<double> mtp_losses;
  int64_t tokens = 0;
  double bits_per_byte = -1;  // < 0: unknown (the data records no byte count)
};

// Peak FLOP/s used for MFU: H100/H200 bf16 dense 989e12, fp32 67e12; CPU: cores x 3.5 GHz x 32
// fp32 FLOPs/cycle (AVX2, two FMA pipes) at a 3.5 GHz boost clock — a nominal figure, printed
// so nobody is misled.
double peak_flops(Device device, bool bf16);
std::string describe_peak(Device device, bool bf16);

std::string format_line(const StepMetrics& m);
std::string format_json(const StepMetrics& m);
std::string format_val_line(const ValMetrics& m);
std::string format_val_json(const ValMetrics& m);
// The one-line legend printed before the first step: what "objective", "main" and "mtp [...]"
// of format_line are, for `depth` MTP depths of weight `loss_weight` (λ).
std::string loss_legend(int64_t depth, double loss_weight);
// objective = main + (λ/D)·Σ_k mtp_k, the loss the model minimizes (GPT's loss).
double objective(double main_loss, const std::vector<double>& mtp_losses, double loss_weight);

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
