#include "model/ops/column_scratch.h"

#include <atomic>
#include <memory>
#include <vector>

#include "model/autograd.h"
#include "model/cuda/column_finish.h"
#include "model/ops/device_util.h"
#include "model/ops/linear.h"

namespace gtron {

namespace {

std::atomic<bool> g_deferral{true};  // set_column_finish_deferral_for_testing

// One tape run's queued finishes and the scratch their partials live in.
struct RunFinishes {
  uint64_t serial = 0;
  cuda::FinishBatch batch;
  std::vector<Tensor> keep;
};
// This thread's runs with queued finishes, outermost first (runs nest).
thread_local std::vector<std::unique_ptr<RunFinishes>> t_runs;

void activate_top() {
  cuda::set_active_finish_batch(t_runs.empty() ? nullptr : &t_runs.back()->batch);
}

void on_run_event(RunFinishes* r, TapeRunEvent ev) {
  if (ev != TapeRunEvent::kAbort) r->batch.flush();
  r->batch.clear();
  r->keep.clear();  // stream-ordered frees: the launches above still read them first
  if (ev == TapeRunEvent::kEarly) return;
  GTRON_CHECK(!t_runs.empty() && t_runs.back().get() == r, "column finishes of a tape run ended ",
              "out of order");
  t_runs.pop_back();
  activate_top();
}

}  // namespace

void set_column_finish_deferral_for_testing(bool on) {
  g_deferral.store(on, std::memory_order_relaxed);
}

Tensor column_scratch(int64_t floats, Stream& s) {
  Tensor t = scratch_floats(floats, s);
  keep_column_scratch(t, s);
  return t;
}

void keep_column_scratch(const Tensor& t, Stream& s) {
  const uint64_t serial = tape_run_serial();
  if (serial == 0 || !s.device().is_cuda() || !g_deferral.load(std::memory_order_relaxed)) {
    return;
  }
  if (t_runs.empty() || t_runs.back()->serial != serial) {
    t_runs.push_back(std::make_unique<RunFinishes>());
    RunFinishes* r = t_runs.back().get();
    r->serial = serial;
    at_tape_run_end([r](TapeRunEvent ev) { on_run_event(r, ev); });
  }
  t_runs.back()->keep.push_back(t);
  activate_top();
}

bool bias_grad_from_partials(const Var& y, const Var& b, Stream& s) {
  int64_t chunks = 0;
  const Tensor partials = y.take_col_partials(&chunks);
  if (!partials.defined() || !b.defined() || !b.requires_grad()) return false;
  const int64_t C = b.shape()[0];
  GTRON_CHECK(partials.numel() >= chunks * C, "bias partials: ", partials.numel(), " floats for ",
              chunks, " chunks of ", C);
  keep_column_scratch(partials, s);
  cuda::linear_bias_grad_from_partials(partials.data<float>(), chunks, C,
                                       f32_grad("linear bias", b.grad()), s.native());
  return true;
}

}  // namespace gtron
