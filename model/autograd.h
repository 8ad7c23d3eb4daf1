// Hand-written reverse-mode autograd.
//
// Forward ops record a closure on the thread's Tape; backward(loss) runs them in reverse order of
// recording (a valid topological order, since an op is recorded after its inputs exist). Each op's
// backward is written by hand beside its forward (model/ops/) and ACCUMULATES (+=) into the grads
// of its inputs: a value used twice receives both contributions.
//
// Parameters hold fp32 master weights (f64 for gradient checks) and an fp32 (f64) `main_grad`;
// the grad slot of a parameter's Var IS its main_grad, so every use of a weight in one step —
// the tied embedding/head under MTP gets 1 + D uses — adds exactly once into main_grad.
//
// Thread safety: the tape is thread-local; Vars are not shared across threads.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/tensor.h"

namespace gtron {

struct Parameter {
  std::string name;          // documented checkpoint name, e.g. "blocks.0.attn.qkv.weight"
  Tensor data;               // master weights, fp32 (f64 in gradient checks)
  Tensor main_grad;          // same shape and dtype as data; backward accumulates (+=) into it
  bool weight_decay = true;  // false for norms, biases and embeddings (AdamW excludes them)
  // DDP param-ready callback (idempotent). Anything that reads `data` ahead of its owner calls
  // make_ready() first. Null means always ready.
  std::function<void()> ready;
  // DDP grad-ready hook: called when the backward of every use recorded since the last hook has
  // run, i.e. when main_grad is final for this backward pass. Null means nobody listens.
  std::function<void()> grad_ready;
  int pending_uses = 0;  // uses recorded on the tape whose backward has not run yet

  Parameter(std::string name, Tensor data, bool weight_decay = true);
  // Calls `ready` (if any). While a ParamReadLog is active in this thread, also logs this
  // parameter (graphs/ records what a captured region reads).
  void make_ready();
  // Calls `grad_ready` (if any) — or, while a GradReadyDeferral is active in this thread, queues
  // this parameter on it instead (a graph's capture defers the hooks to after each replay).
  void fire_grad_ready();
  void zero_grad();
};

struct VarImpl {
  Tensor value;
  Tensor grad;  // lazily zero-initialized; for parameters, main_grad
  bool requires_grad = false;
  Parameter* param = nullptr;
};

// A value in the autograd graph: a tensor plus (maybe) a gradient slot. Cheap to copy.
class Var {
 public:
  Var() = default;
  // A constant (no gradient).
  static Var constant(Tensor value);
  // A leaf that receives a gradient (gradient checks, inputs).
  static Var leaf(Tensor value);
  // A parameter: value is param.data (made ready first), grad slot is param.main_grad.
  static Var param(Parameter& p);
  // An op output; requires grad if any input does and grad mode is on.
  static Var output(Tensor value, bool requires_grad);
  // A weight use whose value and grad slot its owner binds itself (GTP: a gathered full weight, a
  // send buffer bound when the use's backward starts). Requires grad when grad mode is on.
  static Var external(Tensor value);

  // Rebind the value or the grad slot (GTP binds them for backward just before the use's ops run;
  // ops read Var values when their backward runs).
  void set_value(Tensor value) const { impl_->value = std::move(value); }
  void set_grad(Tensor grad) const { impl_->grad = std::move(grad); }

  bool defined() const { return impl_ != nullptr; }
  const Tensor& value() const { return impl_->value; }
  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  // True once some backward has written into this Var's grad.
  bool has_grad() const { return impl_->param != nullptr || impl_->grad.defined(); }
  // The gradient slot, zero-initialized on first access. REQUIRES: requires_grad().
  Tensor& grad() const;
  // The gradient slot for a backward that writes every element of it. While the slot is empty it
  // is allocated uninitialized and *overwrite is set: the caller writes instead of accumulating
  // (no zero-fill, no read of zeros). Otherwise *overwrite is cleared and the caller accumulates.
  // REQUIRES: requires_grad().
  Tensor& grad_for_write(bool* overwrite) const;
  const Shape& shape() const { return impl_->value.shape(); }
  DType dtype() const { return impl_->value.dtype(); }
  Device device() const { return impl_->value.device(); }

 private:
  std::shared_ptr<VarImpl> impl_;
};

// True when ops should record backward closures (no NoGradGuard active in this thread).
bool grad_enabled();

class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// Records a backward closure on this thread's tape (ops call this only when an input needs grad).
void record_backward(std::function<void()> fn);

// Counts one use of `p` in this forward and records, before the use's own backward closures, a
// closure that fires p.grad_ready once every recorded use has run its backward (the tape runs in
// reverse, so a closure recorded before the ops that use p runs after all of them). No-op without
// grad mode. Var::param calls it; so does any weight access that makes its own Var for p.
void note_param_use(Parameter& p);
// Number of closures recorded since the last backward/clear (tests).
size_t tape_size();
// Drops the tape without running it (evaluation paths).
void clear_tape();

// A recorded tape segment (graphs/: the backward of a captured region, run once under capture).
struct Tape {
  std::vector<std::function<void()>> closures;  // in recording order
  std::vector<Parameter*> noted;                // parameters whose uses it counts
};

// Collects the closures recorded in this thread while it lives into its own Tape instead of the
// thread's tape (which it restores on destruction). take() hands the segment over.
class TapeScope {
 public:
  TapeScope();
  ~TapeScope();
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;
  Tape take();

 private:
  Tape outer_;
};

// Runs `tape` in reverse (the caller seeded its outputs' grads), freeing each closure after it
// runs. Closures it records go to the thread's current tape.
void run_tape(Tape tape);

// Logs every parameter whose make_ready() runs in this thread while it lives, in call order
// (duplicates kept: the reader dedupes). Scopes do not nest.
class ParamReadLog {
 public:
  ParamReadLog();
  ~ParamReadLog();
  ParamReadLog(const ParamReadLog&) = delete;
  ParamReadLog& operator=(const ParamReadLog&) = delete;
  const std::vector<Parameter*>& params() const { return params_; }

 private:
  friend struct Parameter;
  std::vector<Parameter*> params_;
};

// Queues the grad-ready hooks fired in this thread while it lives instead of calling them (in
// firing order). Scopes do not nest.
class GradReadyDeferral {
 public:
  GradReadyDeferral();
  ~GradReadyDeferral();
  GradReadyDeferral(const GradReadyDeferral&) = delete;
  GradReadyDeferral& operator=(const GradReadyDeferral&) = delete;
  const std::vector<Parameter*>& params() const { return params_; }

 private:
  friend struct Parameter;
  std::vector<Parameter*> params_;
};

// Seeds d(loss)/d(loss) = `seed` (a scalar loss) and runs the tape in reverse, then clears it.
void backward(const Var& loss, double seed = 1.0);
// Seeds the output's grad with `grad` (same shape) and runs the tape: d(sum(grad * y)).
void backward_with(const Var& y, const Tensor& grad);

// Float dispatch for kernels: calls fn(float{}) or fn(double{}) by dtype.
template <typename Fn>
void dispatch_float(DType dtype, Fn&& fn) {
  if (dtype == DType::kF32) {
    fn(float{});
  } else if (dtype == DType::kF64) {
    fn(double{});
  } else {
    GTRON_CHECK(false, "CPU kernels take f32 or f64; got ", dtype_name(dtype));
  }
}

}  // namespace gtron
