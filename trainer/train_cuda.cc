#include <cmath>
#include <cstdio>

#include "model/cuda/runtime.h"
#include "model/stream.h"
#include "trainer/io/checkpoint_io.h"
#include "trainer/optimizer_cuda.h"
#include "trainer/run.h"

namespace gtron::internal {

// Note [CUDA step]
// A steady-state step on the GPU queues its work on the current stream and never waits for it:
// - tokens: the sampler writes each micro-batch window into a slot of a pinned ring, and one
//   cudaMemcpyAsync moves it into a device window; GPT cuts the shifted inputs and targets on the
//   device. Before a slot is rewritten the host waits on the event of the copy that last read it,
//   queued kRing micro-batches earlier: long done unless the host runs that far ahead of the GPU
//   (then the wait is flow control, not a drain of the queue).
// - backward is seeded from a device scalar (no host->device copy per micro-batch), promised to
//   the model beforehand (GPT::set_loss_seed): the cross-entropies write their gradient over the
//   logits in the forward's pass over them.
// - the losses are summed into the step's device row, the gradient norm and the clip factor are
//   computed on the device (the norm into the same row) and AdamW reads the factor there; AdamW
//   also writes the bf16 shadows of the parameters it updates whole, and the other shadows are
//   re-cast from the updated masters at their next use (Note [fused shadow refresh]).
// - the exception, a mixture of experts: after the update the load counters come to the host (one
//   wait a step) to be summed over the data ranks, logged and to move the router bias, as on the
//   CPU (Note [router bias] in model/moe.h).
// - the rows come back to the host (one sync) only at a flush: on log steps, and before an
//   evaluation or a checkpoint. The non-finite check runs at each flush over every step since the
//   previous one, so a NaN is detected at the next flush (at most log.every steps late, always
//   before a checkpoint is written) rather than before the update of the step it appears in, as
//   on the CPU. The message names both steps.
int Run::train_cuda() {
  const int64_t T = cfg_.train.seq_len, mb = cfg_.train.micro_batch;
  const int D = static_cast<int>(cfg_.mtp.depth);
  const int64_t width = 3 + D;  // total, main, mtp_1..D, grad norm
  GTRON_CHECK(2 + D <= cuda::kMaxScalars, "mtp.depth ", D, ": at most ", cuda::kMaxScalars - 2,
              " depths on CUDA");
  const int64_t rows = std::max<int64_t>(1, std::min(cfg_.log.every, cfg_.train.steps));
  Stream& stream = current_stream(device_);
  step_rows_ = Tensor::zeros({rows, width}, DType::kF32, device_, &stream);
  row_lr_.clear();

  constexpr int kRing = 4;
  const size_t window_bytes = static_cast<size_t>(mb * (T + 1)) * sizeof(int32_t);
  cuda::PinnedBuffer pinned(window_bytes * kRing);
  std::vector<std::unique_ptr<Event>> fences;
  for (int i = 0; i < kRing; ++i) fences.push_back(std::make_unique<Event>(device_));
  std::vector<bool> fenced(kRing, false);
  Tensor window = Tensor::empty({mb, T + 1}, DType::kI32, device_, &stream);
  // The same seed as the CPU loop, as a device scalar: 1/(accum·data ranks) makes the summed
  // gradients the mean over the global batch (TP peers share their micro-batches).
  const double seed = 1.0 / static_cast<double>(accum_ * data_ranks());
  Tensor seed_dev = Tensor::from_vector({seed}, Shape{}, DType::kF32).to(device_, &stream);
  // Every backward below is seeded with it: the heads' cross-entropies may write their gradient
  // in the forward (Note [one-pass cross-entropy]); the model holds the scalar from now on.
  model_->set_loss_seed(seed_dev);

  int64_t micro = 0;
  for (int64_t step = start_; step < cfg_.train.steps; ++step) {
    float* row = step_rows_.data<float>() + static_cast<int64_t>(row_lr_.size()) * width;
    par_->zero_grads();
    for (int64_t m = 0; m < accum_; ++m, ++micro) {
      par_->set_last_microbatch(m == accum_ - 1);
      const int slot = static_cast<int>(micro % kRing);
      if (fenced[slot]) fences[slot]->synchronize();
      auto* host = reinterpret_cast<int32_t*>(static_cast<char*>(pinned.data()) +
                                              static_cast<size_t>(slot) * window_bytes);
      const int64_t first_seq = (data_rank() * accum_ + m) * mb;
      sampler_->sample(data_seed(cfg_), step, first_seq, mb, host);
      cuda::memcpy_async(window.raw(), host, window_bytes, stream.native());
      fences[slot]->record(stream);
      fenced[slot] = true;
      GPTOutput out = graphs_->forward(window);
      backward_with(out.loss, seed_dev);
      par_->finish_backward();
      cuda::ScalarList losses;
      losses.src[losses.n++] = out.loss.value().data<float>();
      losses.src[losses.n++] = out.main_loss.value().data<float>();
      for (const Var& l : out.mtp_losses) losses.src[losses.n++] = l.value().data<float>();
      cuda::accumulate_scalars(losses, static_cast<float>(1.0 / static_cast<double>(accum_)), row,
                               stream.native());
    }
    par_->finish_grads();
    opt_->clip_on_device(par_->owned(), cfg_.optimizer.grad_clip, row + 2 + D);
    const double lr = sched_.at(step);
    opt_->step_on_device(par_->owned(), lr);
    par_->after_update();
    if (cfg_.model.moe.num_experts > 0) {
      // Note [router bias] in model/moe.h, as the CPU loop: the step's load over the data ranks,
      // the stats, then the bias update. The one host wait of an MoE step (Note [MoE on CUDA]).
      if (grid_.world) sum_moe_load();
      moe_stats_ = model_->moe_stats();
      model_->moe_update_bias();
    }
    if (bf16_weights_) bf16_weights_->refresh_after_step();
    row_lr_.push_back(lr);
    ++window_steps_;
    const int64_t done = step + 1;
    start_ = done;
    maybe_test_kill(done);
    // Host-side and one step behind: no device sync (Note [stop agreement] in train.cc).
    const int stop = agreed_stop(done);
    const bool eval = is_eval_step(done) && !stop, ckpt = is_checkpoint_step(done) || stop;
    if (is_log_step(done) || eval || ckpt || static_cast<int64_t>(row_lr_.size()) == rows) {
      if (!flush_cuda(done, stop != 0)) return kExitNonFinite;
    }
    if (eval) {
      par_->ensure_all_ready();
      log_eval(done, evaluate(*model_, cfg_, data_.val_glob));
    }
    if (ckpt) {
      const std::string dir = save_checkpoint();
      if (stop) return stopped(stop, done, dir);
    }
  }
  return finish();
}

bool Run::flush_cuda(int64_t done, bool stopping) {
  const int D = static_cast<int>(cfg_.mtp.depth);
  const int64_t width = 3 + D;
  const int64_t n = static_cast<int64_t>(row_lr_.size());
  if (n == 0) return true;
  Tensor rows_now = step_rows_.rows(0, n);
  // Several GPUs: the loss columns become means over the data ranks, as world_mean() does (TP
  // peers hold the same values; the norm column is the same everywhere).
  if (grid_.world) grid_.data_group()->all_reduce(rows_now).wait(current_stream(device_));
  std::vector<double> v = rows_now.to_vector();  // the one host sync
  step_rows_.zero_();
  if (grid_.world) {
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < width; ++c) v[r * width + c] /= data_ranks();
  }
  for (int64_t r = 0; r < n; ++r) {
    const double* row = v.data() + r * width;
    const double gnorm = row[2 + D];
    if (!std::isfinite(row[0]) || !std::isfinite(gnorm)) {
      auto last = find_latest_complete(checkpoint_dir(cfg_));
      std::fprintf(stderr,
                   "gtron: non-finite %s at step %ld (loss %g, grad norm %g), detected at step %ld "
                   "(on CUDA the check runs on log steps); stopping. Last good checkpoint: %s. "
                   "Hint: lower optimizer.lr or enable optimizer.grad_clip.\n",
                   std::isfinite(row[0]) ? "gradient" : "loss", static_cast<long>(done - n + 1 + r),
                   row[0], gnorm, static_cast<long>(done), last ? last->c_str() : "none");
      return false;
    }
    if (summary_) summary_->losses.push_back(row[0]);
  }
  const double* last = v.data() + (n - 1) * width;
  // Every rank reads its communication timers at log steps (rank 0 prints its own).
  const bool log = is_log_step(done) || stopping;
  if (log) comm_extra_ = par_->take_comm_metrics(window_steps_);
  if (is_rank0() && log) {
    log_step(done, row_lr_.back(), last[2 + D], std::vector<double>(last, last + 2 + D));
  }
  row_lr_.clear();
  return true;
}

}  // namespace gtron::internal
