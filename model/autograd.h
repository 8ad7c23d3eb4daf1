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

#include <cstdint>
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
  // Note [packed masters] (model/mixed_precision.h): data's bytes hold the bf16 shadow and the
  // low halves, not fp32 values; only Bf16Weights and the optimizer read it then.
  bool packed_master = false;
  // DDP param-ready callback (idempotent). Anything that reads `data` ahead of its owner calls
  // make_ready() first. Null means always ready.
  std::function<void()> ready;
  // DDP grad-ready hook: called when the backward of every use recorded since the last hook has
  // run, i.e. when main_grad is final for this backward pass. Null means nobody listens.
  std::function<void()> grad_ready;
  int pending_uses = 0;  // uses recorded on the tape whose backward has not run yet
  // Note [transient gradients] (parallel/ddp.h): a DataParallel that keeps gradients only from
  // their first write in a step to the optimizer's update installs this hook; grad() calls it
  // until it sets grad_current (it binds main_grad). Null: main_grad always exists.
  std::function<void()> touch_grad;
  bool grad_current = false;
  // Note [first gradient write]: main_grad holds nothing of this step yet (the hook bound fresh
  // memory): the first writer overwrites it, or zeroes it first when it adds.
  bool grad_unwritten = false;

  Parameter(std::string name, Tensor data, bool weight_decay = true);
  // Calls `ready` (if any). While a ParamReadLog is active in this thread, also logs this
  // parameter (graphs/ records what a captured region reads).
  void make_ready();
  // Calls `grad_ready` (if any) — or, while a GradReadyDeferral is active in this thread, queues
  // this parameter on it instead (a graph's capture defers the hooks to after each replay).
  void fire_grad_ready();
  void zero_grad();
  // main_grad for a backward that adds into it: made current first when a touch_grad hook is
  // installed, and zeroed while unwritten. Every writer of a parameter's gradient goes through
  // here or grad_for_write (Var::grad and Var::weight_grad do).
  Tensor& grad() {
    if (touch_grad && !grad_current) touch_grad();
    if (grad_unwritten) {
      grad_unwritten = false;
      main_grad.zero_();
    }
    return main_grad;
  }
  // main_grad for a backward that writes every element of it: *overwrite says whether it may
  // write instead of adding (nothing of this step is in it yet; Note [first gradient write]).
  Tensor& grad_for_write(bool* overwrite) {
    if (touch_grad && !grad_current) touch_grad();
    *overwrite = grad_unwritten;
    grad_unwritten = false;
    return main_grad;
  }
};

// FP8 codes of a gradient dy [R, C] (Note [gradient fp8 codes]): q [R, C] in 1x128 tiles along C
// with rows-layout scales s, and qt [C, R], dy's transpose in 1x128 tiles along R, with its scales
// st (model/ops/fp8.h, Note [fp8 layouts]). Undefined tensors: none.
struct GradCodes {
  Tensor q, s, qt, st;
  bool defined() const { return q.defined(); }
};

struct VarImpl {
  Tensor value;
  Tensor grad;  // lazily zero-initialized; for parameters, main_grad
  bool requires_grad = false;
  Parameter* param = nullptr;
  // Note [gradient column partials]
  bool wants_col_partials = false;
  Tensor col_partials;  // chunks × C floats
  int64_t col_chunks = 0;
  // Note [gradient fp8 codes]
  bool wants_grad_codes = false;
  bool grad_values_unread = false;   // the reader takes the codes only
  bool grad_values_skipped = false;  // the writer stored the codes only
  GradCodes grad_codes;
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
  // A use of parameter p through another value (a bf16 shadow or copy the caller made from p's
  // data, made ready first): grad slot p's main_grad, reached when the backward runs.
  static Var param_as(Parameter& p, Tensor value);
  // An op output; requires grad if any input does and grad mode is on.
  static Var output(Tensor value, bool requires_grad);
  // A weight use whose value and grad slot its owner binds itself (GTP: a gathered full weight, a
  // send buffer bound when the use's backward starts). Requires grad when grad mode is on.
  static Var external(Tensor value);

  // Rebind the value or the grad slot (GTP binds them for backward just before the use's ops run;
  // ops read Var values when their backward runs).
  void set_value(Tensor value) const { impl_->value = std::move(value); }
  void set_grad(Tensor grad) const {
    drop_grad_codes();
    impl_->grad = std::move(grad);
    impl_->col_partials = Tensor();
  }

  bool defined() const { return impl_ != nullptr; }
  const Tensor& value() const { return impl_->value; }
  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  // True once some backward has written into this Var's grad.
  bool has_grad() const { return impl_->param != nullptr || impl_->grad.defined(); }
  // The dtype of the gradient slot, without touching it (a parameter's main_grad has its data's
  // dtype). REQUIRES: has_grad().
  DType grad_dtype() const {
    return impl_->param != nullptr ? impl_->param->data.dtype() : impl_->grad.dtype();
  }
  // The gradient slot, zero-initialized on first access. REQUIRES: requires_grad().
  Tensor& grad() const;
  // The gradient slot for a backward that writes every element of it. While the slot is empty it
  // is allocated uninitialized and *overwrite is set: the caller writes instead of accumulating
  // (no zero-fill, no read of zeros). Otherwise *overwrite is cleared and the caller accumulates.
  // REQUIRES: requires_grad().
  Tensor& grad_for_write(bool* overwrite) const;
  // The gradient slot of a weight use, for a backward that writes every element of it (a weight
  // gradient GEMM): a parameter's main_grad through Parameter::grad_for_write, so *overwrite is
  // set on the step's first write to it (Note [first gradient write]); any other slot (a
  // gathered GTP weight's bound send buffer) is grad()'s, *overwrite cleared.
  // REQUIRES: requires_grad().
  Tensor& weight_grad(bool* overwrite) const;

  // Note [gradient column partials]
  // A linear that adds a bias to its output y needs Σ_rows dy for the bias gradient, one more
  // pass over dy. The op whose backward writes dy may form fixed-row-chunk column partials of it
  // on the way (the flash attention backward does: Note [qkv bias partials]) and leave them here
  // for the linear to finish instead. They stand only for the gradient as it was when they were
  // set: any later grad() or grad_for_write() of this Var drops them, so a writer that comes
  // after sends the linear back to its own pass. The linear asks for them in its forward
  // (request_col_partials, so writers skip the work when nobody will use it) and takes them in
  // its backward before it reads its grad.
  void request_col_partials() const { impl_->wants_col_partials = true; }
  bool col_partials_requested() const { return impl_->wants_col_partials; }
  void set_col_partials(Tensor partials, int64_t chunks) const {
    impl_->col_partials = std::move(partials);
    impl_->col_chunks = chunks;
  }
  // The partials left by the last writer (undefined if none, or dropped), and their chunk count.
  Tensor take_col_partials(int64_t* chunks) const {
    *chunks = impl_->col_chunks;
    impl_->col_chunks = 0;
    Tensor t = std::move(impl_->col_partials);
    impl_->col_partials = Tensor();
    return t;
  }
  // Note [gradient fp8 codes]
  // An FP8 linear quantizes its output gradient dy twice over, in 1x128 tiles along its rows (the
  // data gradient) and along its columns (the weight gradient): one more pass over dy. The op
  // whose backward writes dy may write those codes in the same pass (SwiGLU's backward does, for
  // llama's gate|up projection) and leave them here, exactly fp8_quantize_rows_cols of the dy it
  // stored, for the linear to read instead. Like the column partials they stand only for the
  // gradient as it was when they were set: any later grad(), grad_for_write() or set_grad() drops
  // them. The linear asks in its forward (request_grad_codes) and takes them in its backward before
  // it reads its grad.
  //
  // A reader that will take the codes and never read dy's values (the linear without a bias
  // gradient or a residual to hand dy on to) says so with values_unread; dy's producer may then
  // leave the values unwritten (SwiGLU's backward does: 2 bytes an element less to store) and
  // says so with values_skipped. Until the codes are taken, any other access to such a gradient
  // (grad(), grad_for_write(), weight_grad(), set_grad(): a second writer) is an internal error,
  // not a sum over unwritten memory.
  void request_grad_codes(bool values_unread = false) const {
    impl_->wants_grad_codes = true;
    impl_->grad_values_unread = values_unread;
  }
  bool grad_codes_requested() const { return impl_->wants_grad_codes; }
  bool grad_values_unread() const { return impl_->wants_grad_codes && impl_->grad_values_unread; }
  void set_grad_codes(GradCodes codes, bool values_skipped = false) const {
    impl_->grad_codes = std::move(codes);
    impl_->grad_values_skipped = values_skipped && impl_->grad_values_unread;
  }
  // The codes left by the last writer (undefined if none, or dropped).
  GradCodes take_grad_codes() const {
    GradCodes c = std::move(impl_->grad_codes);
    impl_->grad_codes = GradCodes();
    impl_->grad_values_skipped = false;
    return c;
  }
  const Shape& shape() const { return impl_->value.shape(); }
  DType dtype() const { return impl_->value.dtype(); }
  Device device() const { return impl_->value.device(); }

 private:
  void drop_grad_codes() const;  // checks the values are there (Note [gradient fp8 codes])
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

// Note [work at the end of a tape run]
// An op's backward may leave work whose results nobody reads before the tape run ends to one
// batch at the end of the run (the column-sum finishes of the CUDA parameter gradients: Note
// [deferred column finishes] in model/ops/column_scratch.h). A tape run is one call of
// backward(), backward_with() or run_tape(); runs nest (a graph region's backward runs its own
// tape inside the trainer's). at_tape_run_end registers fn with the innermost run in progress:
// - fn(kEnd) runs after the run's last closure, before the run returns (inside a graph capture
//   when the run is captured), in registration order;
// - fn(kEarly) runs, for every run in progress, innermost first, just before a grad-ready hook
//   fires (a hook reads a final main_grad): fn must then do its pending work, and may be called
//   again later (kEarly any number of times, then one kEnd);
// - fn(kAbort) runs instead of kEnd when a closure throws: drop the pending work.
enum class TapeRunEvent { kEarly, kEnd, kAbort };
// A serial number of the innermost tape run in progress on this thread (unique per run), or 0
// outside every run.
uint64_t tape_run_serial();
// REQUIRES: a tape run is in progress on this thread.
void at_tape_run_end(std::function<void(TapeRunEvent)> fn);

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
