// The training loop (one process, or DP × GTP ranks over Gloo/NCCL; trainer/run.h) and
// evaluation, shared by the gtron CLI subcommands.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "trainer/config.h"
#include "trainer/model_config.h"
#include "trainer/text/tokenizer.h"

namespace gtron {

// Exit codes of the CLI.
constexpr int kExitOk = 0;
constexpr int kExitUserError = 2;
constexpr int kExitNonFinite = 3;  // NaN/inf loss or gradient: training stopped

// Creates `path` and its missing parents (mkdir -p); UserError naming the folder that failed.
void make_dirs(const std::string& path);

// Where a run's data comes from: configured globs, or the embedded synthetic Markov source written
// to <out_dir>/data (idempotent), whose meta.json gives the entropy floor.
struct ResolvedData {
  std::string train_glob;
  std::string val_glob;
  std::optional<double> entropy_rate;     // nats/token, when the source is known
  std::optional<double> unigram_entropy;  // nats/token
  // Text prepared with a BPE tokenizer: its tokenizer.json (beside meta.json) and the validation
  // split's size, for bits per byte.
  std::string tokenizer_path;
  std::optional<double> val_tokens, val_bytes;
  // data.document_masking: the token that opens a document (meta.json's doc_start_ids[0], for
  // GPTConfig::document_start); -1 when off.
  int32_t document_start = -1;
};
// Also refuses (UserError) a model.vocab_size below the vocabulary recorded in the data's
// meta.json, and data.document_masking where the data marks no documents (synthetic or
// byte-level data) or the model cannot mask them (GPT-2 under sequence parallelism).
ResolvedData resolve_data(const Config& cfg);

struct TrainSummary {
  std::vector<double> losses;  // total loss of every step run (resumed runs: only the new steps)
  int64_t first_step = 1;      // step number of losses[0]
  double val_loss = 0;         // main val loss at the end
  std::optional<double> entropy_rate;
};

// Trains per `cfg` (validated), resuming from the newest complete checkpoint when `resume`. When
// it does not resume and `init_dir` is set, the weights start from that checkpoint (fresh
// optimizer, step 0; every tensor must match the model's names and shapes). Throws UserError for
// bad inputs; returns kExitNonFinite if the loss or gradient stops being finite (the last good
// checkpoint is kept).
int run_training(const Config& cfg, bool resume, TrainSummary* summary = nullptr,
                 const std::string& init_dir = "");

struct EvalResult {
  double main_loss = 0;
  std::vector<double> mtp_losses;
  int64_t tokens = 0;
};
// Mean validation losses over train.eval_batches micro-batches of the val set.
EvalResult evaluate(GPT& model, const Config& cfg, const std::string& val_glob);

// Bits per byte of a validation loss in nats/token, when the data records its val bytes.
std::optional<double> bits_per_byte(const ResolvedData& data, double nats_per_token);

}  // namespace gtron
