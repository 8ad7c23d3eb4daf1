#include "model/autograd.h"

#include "memory/caching_allocator.h"
#include "model/stream.h"

namespace gtron {

namespace {
thread_local bool t_grad_enabled = true;
thread_local std::vector<std::function<void()>> t_tape;
thread_local std::vector<Parameter*> t_noted;  // parameters with uses on the current tape
thread_local ParamReadLog* t_read_log = nullptr;
thread_local GradReadyDeferral* t_deferral = nullptr;

// The tape runs in progress on this thread, outermost first (Note [work at the end of a tape
// run]).
struct TapeRun {
  uint64_t serial;
  std::vector<std::function<void(TapeRunEvent)>> at_end;
};
thread_local std::vector<TapeRun> t_runs;
thread_local uint64_t t_last_serial = 0;

void tape_runs_early() {
  for (auto run = t_runs.rbegin(); run != t_runs.rend(); ++run) {
    for (auto& fn : run->at_end) fn(TapeRunEvent::kEarly);
  }
}
}  // namespace

uint64_t tape_run_serial() { return t_runs.empty() ? 0 : t_runs.back().serial; }

void at_tape_run_end(std::function<void(TapeRunEvent)> fn) {
  GTRON_CHECK(!t_runs.empty(), "at_tape_run_end() outside a tape run");
  t_runs.back().at_end.push_back(std::move(fn));
}

void Parameter::make_ready() {
  if (t_read_log != nullptr) t_read_log->params_.push_back(this);
  if (ready) ready();
}

void Parameter::fire_grad_ready() {
  if (t_deferral != nullptr) {
    t_deferral->params_.push_back(this);
  } else if (grad_ready) {
    tape_runs_early();  // work left to the end of the run that this hook may read
    grad_ready();
  }
}

ParamReadLog::ParamReadLog() {
  GTRON_CHECK(t_read_log == nullptr, "nested ParamReadLog");
  t_read_log = this;
}
ParamReadLog::~ParamReadLog() { t_read_log = nullptr; }

GradReadyDeferral::GradReadyDeferral() {
  GTRON_CHECK(t_deferral == nullptr, "nested GradReadyDeferral");
  t_deferral = this;
}
GradReadyDeferral::~GradReadyDeferral() { t_deferral = nullptr; }

Parameter::Parameter(std::string n, Tensor d, bool wd)
    : name(std::move(n)), data(std::move(d)), weight_decay(wd) {
  memory::AllocKindScope kind(memory::AllocKind::kGradients);  // Note [allocation kinds]
  main_grad = Tensor::zeros(data.shape(), data.dtype(), data.device());
}

void Parameter::zero_grad() {
  main_grad.zero_();
  grad_unwritten = false;
}

Var Var::constant(Tensor value) {
  Var v;
  v.impl_ = std::make_shared<VarImpl>();
  v.impl_->value = std::move(value);
  return v;
}

Var Var::leaf(Tensor value) {
  Var v = constant(std::move(value));
  v.impl_->requires_grad = true;
  return v;
}

Var Var::param(Parameter& p) {
  GTRON_CHECK(!p.packed_master, "Var::param: ", p.name,
              " is packed (Note [packed masters]); its fp32 values are not in data");
  p.make_ready();
  Var v = constant(p.data);
  v.impl_->requires_grad = grad_enabled();
  v.impl_->param = &p;
  note_param_use(p);
  return v;
}

Var Var::param_as(Parameter& p, Tensor value) {
  Var v = constant(std::move(value));
  v.impl_->requires_grad = grad_enabled();
  v.impl_->param = &p;
  note_param_use(p);
  return v;
}

Var Var::external(Tensor value) {
  Var v = constant(std::move(value));
  v.impl_->requires_grad = grad_enabled();
  return v;
}

Var Var::output(Tensor value, bool requires_grad) {
  Var v = constant(std::move(value));
  v.impl_->requires_grad = requires_grad && grad_enabled();
  return v;
}

void Var::drop_grad_codes() const {
  GTRON_CHECK(!impl_->grad_values_skipped,
              "a gradient whose values its writer skipped (codes only: Note [gradient fp8 codes]) "
              "was accessed before its reader took the codes");
  impl_->grad_codes = GradCodes();
}

Tensor& Var::grad_for_write(bool* overwrite) const {
  GTRON_CHECK(requires_grad(), "grad_for_write() of a Var that does not require grad");
  impl_->col_partials = Tensor();  // Note [gradient column partials]: a new write
  drop_grad_codes();               // Note [gradient fp8 codes]
  *overwrite = impl_->param == nullptr && !impl_->grad.defined();
  if (*overwrite) {
    impl_->grad = Tensor::empty(impl_->value.shape(), impl_->value.dtype(), impl_->value.device());
  }
  return impl_->param != nullptr ? impl_->param->grad() : impl_->grad;
}

Tensor& Var::weight_grad(bool* overwrite) const {
  if (impl_->param == nullptr) {
    *overwrite = false;
    return grad();
  }
  GTRON_CHECK(requires_grad(), "weight_grad() of a Var that does not require grad");
  impl_->col_partials = Tensor();  // Note [gradient column partials]: a new write
  drop_grad_codes();               // Note [gradient fp8 codes]
  return impl_->param->grad_for_write(overwrite);
}

Tensor& Var::grad() const {
  GTRON_CHECK(requires_grad(), "grad() of a Var that does not require grad");
  impl_->col_partials = Tensor();  // Note [gradient column partials]: maybe a new write
  drop_grad_codes();               // Note [gradient fp8 codes]
  if (impl_->param != nullptr) return impl_->param->grad();
  if (!impl_->grad.defined()) {
    impl_->grad = Tensor::zeros(impl_->value.shape(), impl_->value.dtype(), impl_->value.device());
  }
  return impl_->grad;
}

bool grad_enabled() { return t_grad_enabled; }

NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }

void record_backward(std::function<void()> fn) {
  if (t_grad_enabled) t_tape.push_back(std::move(fn));
}

size_t tape_size() { return t_tape.size(); }

void note_param_use(Parameter& p) {
  if (!t_grad_enabled) return;
  ++p.pending_uses;
  Parameter* pp = &p;
  t_noted.push_back(pp);
  t_tape.push_back([pp] {
    GTRON_CHECK(pp->pending_uses > 0, "grad-ready accounting of ", pp->name);
    if (--pp->pending_uses == 0) pp->fire_grad_ready();
  });
}

void clear_tape() {
  // No backward will run for the dropped uses: forget them, or the next pass's count is off.
  for (Parameter* p : t_noted) p->pending_uses = 0;
  t_noted.clear();
  t_tape.clear();
}

TapeScope::TapeScope() {
  outer_.closures = std::move(t_tape);
  outer_.noted = std::move(t_noted);
  t_tape.clear();
  t_noted.clear();
}

TapeScope::~TapeScope() {
  t_tape = std::move(outer_.closures);
  t_noted = std::move(outer_.noted);
}

Tape TapeScope::take() {
  Tape t{std::move(t_tape), std::move(t_noted)};
  t_tape.clear();
  t_noted.clear();
  return t;
}

namespace {
void run_closures(std::vector<std::function<void()>> tape) {
  t_runs.push_back(TapeRun{++t_last_serial, {}});
  try {
    for (auto it = tape.rbegin(); it != tape.rend(); ++it) {
      (*it)();
      *it = nullptr;  // frees the activations this closure held, as early as possible
    }
  } catch (...) {
    std::vector<std::function<void(TapeRunEvent)>> at_end = std::move(t_runs.back().at_end);
    t_runs.pop_back();
    for (auto& fn : at_end) fn(TapeRunEvent::kAbort);
    throw;
  }
  // The end functions run with their run still current, then the run is gone even if one
  // throws.
  std::vector<std::function<void(TapeRunEvent)>> at_end = std::move(t_runs.back().at_end);
  t_runs.back().at_end.clear();
  try {
    for (auto& fn : at_end) fn(TapeRunEvent::kEnd);
  } catch (...) {
    t_runs.pop_back();
    throw;
  }
  t_runs.pop_back();
}

void run_tape() {
  // Move the tape out first: a closure must not see (or extend) the tape it runs from.
  std::vector<std::function<void()>> tape = std::move(t_tape);
  t_tape.clear();
  t_noted.clear();
  run_closures(std::move(tape));
}
}  // namespace

void run_tape(Tape tape) { run_closures(std::move(tape.closures)); }

void backward(const Var& loss, double seed) {
  GTRON_CHECK(loss.value().numel() == 1, "backward() takes a scalar loss; got ",
              loss.shape().str());
  GTRON_CHECK(loss.requires_grad(), "backward() of a loss that does not require grad");
  memory::AllocKindScope kind(memory::AllocKind::kBackward);  // Note [allocation kinds]
  Tensor g = Tensor::from_vector({seed}, loss.shape(), loss.dtype());
  if (loss.device().is_cuda()) g = g.to(loss.device());
  loss.grad().copy_from(g);
  run_tape();
}

void backward_with(const Var& y, const Tensor& grad) {
  GTRON_CHECK(grad.shape() == y.shape(), "backward_with: grad ", grad.shape().str(), " for ",
              y.shape().str());
  memory::AllocKindScope kind(memory::AllocKind::kBackward);
  y.grad().copy_from(grad);
  run_tape();
}

}  // namespace gtron
