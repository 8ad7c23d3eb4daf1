#include "graphs/graph_runner.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "model/ops/add.h"
#include "model/stream.h"

namespace gtron::graphs {

struct GraphRunner::Entry {
  int calls = 0;                       // eager warmup calls so far
  std::vector<Parameter*> warm_reads;  // made ready during the last warmup
  std::vector<Parameter*> reads;       // Note [readiness across replay]: recorded at capture
  Graph fwd, bwd;
  std::vector<Tensor> in_static;  // the capture's inputs; another input is copied in at replay
  std::vector<Tensor> in_grads;   // input grads lent by the caller at capture (or undefined)
  std::vector<Var> in_vars;       // the capture's inputs (leaves where the caller needs grad)
  std::vector<Var> out_vars;      // the capture's outputs (static buffers)
  // One output with grad: its grad slot is a static buffer, zeroed at each forward replay, that
  // the returned Var shares (no copy). Otherwise output grads are copied into gout_static.
  bool bound_out = false;
  std::vector<bool> seeded;         // outputs whose grad is copied in before the backward replay
  std::vector<Tensor> gout_static;  // static output grads
  Tape tape;                        // the captured forward's backward, until it is captured
  std::vector<Parameter*> hooks;    // grad-ready hooks deferred by the backward capture, in order
};

namespace {

std::string signature(const std::vector<Var>& inputs) {
  std::string key;
  for (const Var& v : inputs) {
    key += v.shape().str() + dtype_name(v.dtype()) + v.device().str() +
           (v.requires_grad() ? "g;" : ";");
  }
  return key;
}

void append_unique(std::vector<Parameter*>& list, const std::vector<Parameter*>& more) {
  std::unordered_set<Parameter*> seen(list.begin(), list.end());
  for (Parameter* p : more) {
    if (seen.insert(p).second) list.push_back(p);
  }
}

// The weight access in capture domain 1 for a scope's lifetime.
class DomainScope {
 public:
  explicit DomainScope(WeightAccess* w) : w_(w) { w_->set_domain(1); }
  ~DomainScope() { w_->set_domain(0); }
  DomainScope(const DomainScope&) = delete;
  DomainScope& operator=(const DomainScope&) = delete;

 private:
  WeightAccess* w_;
};

}  // namespace

GraphPool::GraphPool(Device device) : device_(device) { allocator_for(device_).keep_pool(id()); }

GraphPool::~GraphPool() { allocator_for(device_).release_pool(id(), current_stream(device_).id()); }

GraphRunner::GraphRunner(std::string name, Fn fn, Device device, WeightAccess* weights,
                         GraphPool* pool, GraphOptions opt)
    : name_(std::move(name)),
      fn_(std::move(fn)),
      device_(device),
      weights_(weights),
      pool_(pool),
      opt_(opt) {
  GTRON_CHECK(opt_.warmup >= 2, "graph runner ", name_, ": warmup ", opt_.warmup, " < 2");
  GTRON_CHECK(weights_ != nullptr && pool_ != nullptr && pool_->device() == device_,
              "graph runner ", name_, ": needs a weight access and a pool on ", device_.str());
}

GraphRunner::~GraphRunner() { reset(); }

void GraphRunner::reset() { entries_.clear(); }

std::vector<Parameter*> GraphRunner::readiness_list() const {
  std::vector<Parameter*> all;
  for (const auto& kv : entries_) append_unique(all, kv.second->reads);
  return all;
}

void GraphRunner::make_ready(const std::vector<Parameter*>& params) {
  for (Parameter* p : params) {
    p->make_ready();
    weights_->prepare(*p);
  }
}

std::vector<Var> GraphRunner::operator()(const std::vector<Var>& inputs) {
  if (!grad_enabled()) {
    ++stats_.eager_calls;
    DomainScope domain(weights_);
    return fn_(inputs);
  }
  std::shared_ptr<Entry>& slot = entries_[signature(inputs)];
  if (!slot) slot = std::make_shared<Entry>();
  std::shared_ptr<Entry> e = slot;
  if (e->calls < opt_.warmup) return warmup(inputs, *e);

  Stream& stream = current_stream(device_);
  if (!e->fwd.valid()) {
    // Capture over the caller's own tensors (held from now on): a block's input is the previous
    // block's static output, so later replays find the same address and copy nothing. An input
    // whose grad slot is already bound (the previous runner's output) lends it to the capture:
    // the region's backward accumulates straight into it.
    for (const Var& v : inputs) {
      e->in_static.push_back(v.value());
      Var in = v.requires_grad() ? Var::leaf(v.value()) : Var::constant(v.value());
      const bool lend = v.requires_grad() && v.has_grad();
      if (lend) in.set_grad(v.grad());
      e->in_grads.push_back(lend ? v.grad() : Tensor());
      e->in_vars.push_back(in);
    }
    make_ready(e->warm_reads);  // the capture must find its DP gathers done
    capture_forward(*e);
  }
  if (opt_.readiness) make_ready(e->reads);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].value().raw() != e->in_static[i].raw()) {
      e->in_static[i].copy_from(inputs[i].value(), &stream);
    }
  }
  e->fwd.replay(stream);
  ++stats_.replays;

  std::vector<Var> outs;
  bool any_grad = false;
  for (const Var& o : e->out_vars) {
    outs.push_back(Var::output(o.value(), o.requires_grad()));
    any_grad = any_grad || outs.back().requires_grad();
  }
  if (e->bound_out) {  // consumers accumulate straight into the static output grad
    e->gout_static[0].zero_(&stream);
    outs[0].set_grad(e->gout_static[0]);
  }
  if (any_grad) {
    record_backward([this, e, outs, inputs] { backward(e, outs, inputs); });
  }
  return outs;
}

std::vector<Var> GraphRunner::warmup(const std::vector<Var>& inputs, Entry& e) {
  ++e.calls;
  ++stats_.eager_calls;
  // The tape runs in reverse: the first closure switches back after the region's backward, the
  // last switches into the region's domain before it.
  WeightAccess* w = weights_;
  record_backward([w] { w->set_domain(0); });
  std::vector<Var> outs;
  {
    DomainScope domain(weights_);
    ParamReadLog log;
    outs = fn_(inputs);
    if (e.calls == opt_.warmup) {
      e.warm_reads.clear();
      append_unique(e.warm_reads, log.params());
    }
  }
  record_backward([w] { w->set_domain(1); });
  return outs;
}

void GraphRunner::capture_forward(Entry& e) {
  Stream& stream = current_stream(device_);
  DomainScope domain(weights_);
  PrivatePoolGuard pool(device_, pool_->id());
  TapeScope tape;
  ParamReadLog log;
  weights_->set_capturing(true);
  Graph::begin_capture(stream);
  try {
    e.out_vars = fn_(e.in_vars);
    weights_->end_region();
  } catch (...) {
    Graph::abort_capture(stream);
    weights_->set_capturing(false);
    throw;
  }
  e.fwd = Graph::end_capture(stream);
  weights_->set_capturing(false);
  e.tape = tape.take();
  append_unique(e.reads, log.params());
  ++stats_.captures;
  stats_.nodes += static_cast<int64_t>(e.fwd.nodes());
  e.bound_out = e.out_vars.size() == 1 && e.out_vars[0].requires_grad();
  if (e.bound_out) {
    const Tensor& y = e.out_vars[0].value();
    e.gout_static.push_back(Tensor::empty(y.shape(), y.dtype(), device_, &stream));
    e.out_vars[0].set_grad(e.gout_static[0]);
  }
}

void GraphRunner::backward(const std::shared_ptr<Entry>& e, const std::vector<Var>& outs,
                           const std::vector<Var>& inputs) {
  Stream& stream = current_stream(device_);
  // Eager reduce-scatters still pending finish here, outside the graph (domain switch).
  weights_->set_domain(1);
  if (!e->bwd.valid()) {
    PrivatePoolGuard pool(device_, pool_->id());
    if (!e->bound_out) {
      for (size_t i = 0; i < outs.size(); ++i) {
        e->seeded.push_back(outs[i].requires_grad() && outs[i].has_grad());
        e->gout_static.push_back(e->seeded[i] ? outs[i].grad().clone(&stream) : Tensor());
      }
    }
    GradReadyDeferral hooks;
    weights_->set_capturing(true);
    Graph::begin_capture(stream);
    try {
      for (size_t i = 0; i < e->seeded.size(); ++i) {
        if (e->seeded[i]) e->out_vars[i].grad().copy_from(e->gout_static[i], &stream);
      }
      run_tape(std::move(e->tape));
      weights_->end_region();
      weights_->set_domain(0);  // the region's own pending reduce-scatters finish in the graph
    } catch (...) {
      Graph::abort_capture(stream);
      weights_->set_capturing(false);
      throw;
    }
    e->bwd = Graph::end_capture(stream);
    weights_->set_capturing(false);
    e->hooks = hooks.params();
    e->tape = Tape();
    ++stats_.captures;
    stats_.nodes += static_cast<int64_t>(e->bwd.nodes());
  } else {
    for (size_t i = 0; i < e->seeded.size(); ++i) {
      const bool seeded = outs[i].requires_grad() && outs[i].has_grad();
      GTRON_CHECK(seeded == e->seeded[i], "graph ", name_, ": output ", i,
                  seeded ? " has a gradient it had not at capture" : " lost its gradient");
      if (seeded) e->gout_static[i].copy_from(outs[i].grad(), &stream);
    }
  }
  weights_->set_domain(0);
  e->bwd.replay(stream);
  ++stats_.replays;
  for (Parameter* p : e->hooks) p->fire_grad_ready();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    if (e->in_grads[i].defined()) {
      // The graph accumulated into the grad the caller lent at capture: it must still be its.
      GTRON_CHECK(inputs[i].has_grad() && inputs[i].grad().raw() == e->in_grads[i].raw(), "graph ",
                  name_, ": input ", i, " changed its gradient buffer since capture");
    } else {
      accumulate_into(inputs[i].grad(), e->in_vars[i].grad());
    }
  }
}

}  // namespace gtron::graphs
