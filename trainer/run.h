// The training run behind run_training() (trainer-internal): one class, two files —
// train.cc (set-up, the CPU loop, logging, checkpoints, the final evaluation) and train_cuda.cc
// (Note [CUDA step]: the GPU loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graphs/model_graphs.h"
#include "model/gpt.h"
#include "model/mixed_precision.h"
#include "parallel/grid.h"
#include "parallel/store.h"
#include "trainer/config.h"
#include "trainer/data/sampler.h"
#include "trainer/data/shards.h"
#include "trainer/io/checkpoint.h"
#include "trainer/metrics.h"
#include "trainer/optimizer.h"
#include "trainer/parallel_state.h"
#include "trainer/schedule.h"
#include "trainer/stop_signal.h"
#include "trainer/tensorboard.h"
#include "trainer/train.h"

namespace gtron::internal {

// The MoE layers' load and balance as metric columns (train_moe.cc).
std::vector<std::pair<std::string, double>> moe_metric_columns(
    const std::vector<MoeLayerStats>& stats, const MoeConfig& moe);

struct DevicePlan {
  Device device;
  bool bf16 = false;  // bf16 mixed precision (Note [bf16 shadows] in model/mixed_precision.h)
};

// The device and precision of a run (train_setup.cc). UserError where the config cannot work.
DevicePlan pick_device(const Config& cfg, const parallel::DistEnv& env);
// The communicators of a multi-process run on `device` (pick_device chose it for the backend).
parallel::CommunicatorFactory communicator_factory(const Config& cfg, Device device);

using Clock = std::chrono::steady_clock;

// One training run: the process group, model, data-parallel buffers, optimizer and data.
class Run {
 public:
  // init_dir: a checkpoint whose weights start the run (train --init) unless it resumes; "" = none.
  Run(const Config& cfg, bool resume, const std::string& init_dir, TrainSummary* summary);
  int train();

 private:
  // Note [CUDA step]: the GPU loop; returns an exit code like train().
  int train_cuda();
  // Reads the device loss rows of the steps since the last flush; pushes them to the summary,
  // stops on a non-finite value (returns false), logs when `done` is a log step.
  // `stopping`: the step is logged whatever log.every says (Note [stop agreement]).
  bool flush_cuda(int64_t done, bool stopping = false);
  // Note [stop agreement]: called by every rank after every step; the signal number the ranks
  // agreed to stop at after step `done`, or 0 to go on.
  int agreed_stop(int64_t done);
  // After an agreed stop at step `done` (checkpoint written): rank 0 says where; 128 + sig.
  int stopped(int sig, int64_t done, const std::string& checkpoint);
  // GTRON_TEST_KILL_RANK_AT_STEP (a test switch): SIGKILL this rank after step `done`.
  void maybe_test_kill(int64_t done) const;
  // An evaluation at step `done`: val record in metrics.jsonl, TensorBoard and (`console`) a
  // console line; rank 0 only (the others return).
  void log_eval(int64_t done, const EvalResult& ev, bool console = true);
  // After the last step: the final evaluation and summary line.
  int finish();
  // train --init: every parameter from checkpoint `dir` (shapes checked), fresh optimizer.
  void init_weights(const std::string& dir);
  // The model's state beyond its parameters (GPT::buffers: the MoE router biases) from the
  // tensors of checkpoint `dir`; UserError naming a missing or mis-shaped one.
  void load_buffers(const CheckpointTensors& c, const std::string& dir);
  // Sums the MoE load counts of this step over the data ranks (Note [router bias]). Collective.
  void sum_moe_load();
  bool is_rank0() const { return env_.rank == 0; }
  // The ranks that see different micro-batches (world / TP: TP peers share theirs), and this
  // rank's place among them.
  int data_ranks() const { return grid_.world ? grid_.layout.data_size : 1; }
  int data_rank() const { return grid_.world ? grid_.layout.data_rank : 0; }
  void print_header(const ResolvedData& data) const;
  // Mean over the data ranks of a few per-rank values (every rank gets the result).
  std::vector<double> world_mean(const std::vector<double>& values);
  // Collective; returns the checkpoint's directory on rank 0 ("" elsewhere).
  std::string save_checkpoint();
  void log_step(int64_t done, double lr, double gnorm, const std::vector<double>& losses);
  // Step 1 too, so that a curve starts where the loss does.
  bool is_log_step(int64_t done) const {
    return done == 1 || done % cfg_.log.every == 0 || done == cfg_.train.steps;
  }
  bool is_eval_step(int64_t done) const {
    return cfg_.train.eval_every > 0 && done % cfg_.train.eval_every == 0 &&
           done != cfg_.train.steps;
  }
  bool is_checkpoint_step(int64_t done) const {
    return (cfg_.checkpoint.every > 0 && done % cfg_.checkpoint.every == 0) ||
           done == cfg_.train.steps;
  }

  const Config& cfg_;
  TrainSummary* summary_;
  parallel::DistEnv env_;
  parallel::Rendezvous rdv_;
  parallel::Grid grid_;
  Device device_;
  bool bf16_ = false;
  ResolvedData data_;
  std::string tokenizer_json_;  // the data's tokenizer.json, carried by every checkpoint
  std::unique_ptr<ShardSet> train_shards_;
  std::unique_ptr<SequenceSampler> sampler_;
  std::unique_ptr<GPT> model_;
  std::unique_ptr<ParallelState> par_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<Bf16Weights> bf16_weights_;    // bf16 runs: the model's weight access
  std::unique_ptr<graphs::ModelGraphs> graphs_;  // graphs.scope (a pass-through for none)
  // CUDA: per-step rows [total, main, mtp_1..D, grad norm] since the last flush (f32, device),
  // and the lr of each of those steps (host).
  Tensor step_rows_;
  std::vector<double> row_lr_;
  std::vector<std::pair<std::string, double>> comm_extra_;  // log.comm_timing, for log_step
  std::vector<MoeLayerStats> moe_stats_;  // the last step's expert load, for log_step
  Schedule sched_;
  MetricsWriter metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // rank 0, log.tensorboard
  // Preemption (Note [stop agreement]): the handlers while the loop runs; with several ranks a
  // Gloo communicator of its own for the stop votes, and the vote in flight.
  std::unique_ptr<StopSignalScope> stop_signals_;
  std::unique_ptr<parallel::Communicator> control_;
  Tensor vote_;
  parallel::Work vote_work_;
  bool vote_pending_ = false;
  int64_t test_kill_rank_ = -1, test_kill_step_ = -1;  // GTRON_TEST_KILL_RANK_AT_STEP
  int64_t start_ = 0;
  int64_t accum_ = 1;
  double flops_per_step_ = 0;
  Clock::time_point t_run_ = Clock::now(), t_window_ = Clock::now();
  int64_t window_steps_ = 0;
};

}  // namespace gtron::internal
