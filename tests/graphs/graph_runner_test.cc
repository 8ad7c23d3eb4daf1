// The graph runner on the CPU recorded-closure backend (issue: graphs, acceptance 2): replays are
// bit-identical to eager execution, the readiness list is recorded deduplicated and in order,
// ready callbacks run before every replay (and skipping them reproduces the stale-parameter
// bug), grad-ready hooks fire after each replay in eager order, reset() clears everything, and
// the GTP send pool's capture guard fires when warmup did not fill it.
#include "graphs/graph_runner.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "model/ops/gelu.h"
#include "model/ops/linear.h"
#include "model/stream.h"
#include "parallel/gtp.h"
#include "parallel/self_communicator.h"

namespace gtron::graphs {
namespace {

constexpr int64_t C = 4;

Tensor values(int64_t n, double base, const Shape& shape) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] =
        base + 0.01 * static_cast<double>(i % 7) - 0.02 * static_cast<double>(i % 3);
  return Tensor::from_vector(v, shape, DType::kF32);
}

// y = linear(gelu(linear(x, W, b)), W): reads W, b, W. A lazily "gathered" W imitates DDP's
// overlap_param_gather: after update(), W.data keeps last step's values until W's ready
// callback copies the new ones in.
struct Model {
  Parameter W{"W", values(C* C, 0.1, {C, C})};
  Parameter b{"b", values(C, -0.05, {C})};
  Tensor next_W;  // the values W's pending "gather" delivers
  bool stale = false;
  std::vector<std::string>* log = nullptr;  // ready callbacks and the region's kernels, in order
  DirectWeights direct;

  Model() {
    W.ready = [this] {
      if (log) log->push_back("ready W");
      if (stale) {
        W.data.copy_from(next_W);
        stale = false;
      }
    };
    b.ready = [this] {
      if (log) log->push_back("ready b");
    };
  }
  void update(double base) {
    next_W = values(C * C, base, {C, C});
    stale = true;
  }
  std::vector<Var> forward(const std::vector<Var>& in) {
    Var w = Var::param(W);  // in this order: the test checks the order of reads
    Var bias = Var::param(b);
    Var h = gelu(linear(in[0], w, bias));
    std::vector<std::string>* l = log;
    current_stream(Device::cpu()).run([l] {
      if (l) l->push_back("kernel");
    });
    return {linear(h, Var::param(W), Var())};
  }
};

struct Result {
  std::vector<double> y, dx, dW, db;
};

// One micro-batch: forward (through `runner` or eagerly), backward with a fixed output grad.
Result step(Model& m, GraphRunner* runner, int call) {
  m.W.zero_grad();
  m.b.zero_grad();
  Var x = Var::leaf(values(3 * C, 0.3 + 0.1 * call, {3, C}));
  std::vector<Var> out = runner ? (*runner)({x}) : m.forward({x});
  Result r;
  r.y = out[0].value().to_vector();
  backward_with(out[0], values(3 * C, 1.0 - 0.05 * call, {3, C}));
  r.dx = x.grad().to_vector();
  r.dW = m.W.main_grad.to_vector();
  r.db = m.b.main_grad.to_vector();
  return r;
}

void expect_same(const Result& a, const Result& b, int call) {
  EXPECT_EQ(a.y, b.y) << "call " << call;
  EXPECT_EQ(a.dx, b.dx) << "call " << call;
  EXPECT_EQ(a.dW, b.dW) << "call " << call;
  EXPECT_EQ(a.db, b.db) << "call " << call;
}

struct Fixture {
  Model graphed, eager;
  GraphPool pool{Device::cpu()};
  std::unique_ptr<GraphRunner> runner;
  explicit Fixture(GraphOptions opt = {}) {
    runner = std::make_unique<GraphRunner>(
        "test", [this](const std::vector<Var>& in) { return graphed.forward(in); }, Device::cpu(),
        &graphed.direct, &pool, opt);
  }
};

TEST(GraphRunner, ReplaysAreBitIdenticalToEagerAcrossParameterUpdates) {
  Fixture f;
  for (int call = 0; call < 7; ++call) {
    if (call >= 3) {  // an optimizer step between micro-batches, delivered lazily
      f.graphed.update(0.2 + 0.01 * call);
      f.eager.update(0.2 + 0.01 * call);
    }
    expect_same(step(f.graphed, f.runner.get(), call), step(f.eager, nullptr, call), call);
  }
  EXPECT_EQ(f.runner->stats().eager_calls, 2);  // warmups
  EXPECT_EQ(f.runner->stats().captures, 2);     // one forward, one backward graph
  EXPECT_EQ(f.runner->stats().replays, 10);     // calls 3..7, forward and backward
  EXPECT_GT(f.runner->stats().nodes, 4);        // kernels, copies and zero-fills were recorded
}

TEST(GraphRunner, ChainedRegionsPassBuffersWithoutCopiesAndMatchEager) {
  // B reads A's static output and lends its grad slot: still bit-identical to eager.
  Model a, b, ea, eb;
  GraphPool pool(Device::cpu());
  GraphRunner ra(
      "a", [&](const std::vector<Var>& in) { return a.forward(in); }, Device::cpu(), &a.direct,
      &pool);
  GraphRunner rb(
      "b", [&](const std::vector<Var>& in) { return b.forward(in); }, Device::cpu(), &b.direct,
      &pool);
  for (int call = 0; call < 6; ++call) {
    std::vector<double> y[2], dx[2], dW[2];
    for (int graphed = 0; graphed < 2; ++graphed) {
      Model& m1 = graphed ? a : ea;
      Model& m2 = graphed ? b : eb;
      for (Model* m : {&m1, &m2}) {
        m->W.zero_grad();
        m->b.zero_grad();
        if (call >= 3) m->update(0.3 + 0.02 * call);
      }
      Var x = Var::leaf(values(3 * C, 0.2 + 0.1 * call, {3, C}));
      Var h = graphed ? ra({x})[0] : m1.forward({x})[0];
      Var out = graphed ? rb({h})[0] : m2.forward({h})[0];
      y[graphed] = out.value().to_vector();
      backward_with(out, values(3 * C, 0.7, {3, C}));
      dx[graphed] = x.grad().to_vector();
      dW[graphed] = m1.W.main_grad.to_vector();
    }
    EXPECT_EQ(y[0], y[1]) << "call " << call;
    EXPECT_EQ(dx[0], dx[1]) << "call " << call;
    EXPECT_EQ(dW[0], dW[1]) << "call " << call;
  }
  EXPECT_EQ(rb.stats().replays, 8);  // calls 3..6, forward and backward
}

TEST(GraphRunner, SkippingReadinessReplaysStaleParametersAndReadinessFixesIt) {
  // The stale-parameter bug: the replay after an update reads W before its "gather" ran.
  for (bool readiness : {false, true}) {
    Fixture f(GraphOptions{2, readiness});
    for (int call = 0; call < 3; ++call) step(f.graphed, f.runner.get(), call);
    f.graphed.update(0.5);
    f.eager.update(0.5);
    const Result graphed = step(f.graphed, f.runner.get(), 3);
    const Result eager = step(f.eager, nullptr, 3);
    if (readiness) {
      expect_same(graphed, eager, 3);
    } else {
      EXPECT_NE(graphed.y, eager.y) << "without readiness the replay must read the stale W";
    }
  }
}

TEST(GraphRunner, RecordsReadsOnceInOrderAndMakesThemReadyBeforeEveryReplay) {
  Fixture f;
  std::vector<std::string> log;
  f.graphed.log = &log;
  for (int call = 0; call < 3; ++call) step(f.graphed, f.runner.get(), call);
  // W is read twice by the region: listed once, before b.
  EXPECT_EQ(f.runner->readiness_list(), (std::vector<Parameter*>{&f.graphed.W, &f.graphed.b}));
  for (int call = 3; call < 5; ++call) {
    log.clear();
    step(f.graphed, f.runner.get(), call);
    // Every replay: the ready callbacks first, then the replayed kernels (once, no host code).
    EXPECT_EQ(log, (std::vector<std::string>{"ready W", "ready b", "kernel"})) << "call " << call;
  }
}

TEST(GraphRunner, ResetDeletesTheGraphsAndClearsTheList) {
  Fixture f;
  for (int call = 0; call < 4; ++call) step(f.graphed, f.runner.get(), call);
  ASSERT_EQ(f.runner->readiness_list().size(), 2u);
  f.runner->reset();
  EXPECT_TRUE(f.runner->readiness_list().empty());
  step(f.graphed, f.runner.get(), 4);  // warms up again
  EXPECT_EQ(f.runner->stats().eager_calls, 3);
  EXPECT_EQ(f.runner->stats().captures, 2);
}

TEST(GraphRunner, GradReadyHooksFireAfterEachReplayInEagerOrder) {
  Fixture f;
  std::vector<std::string> fired;
  f.graphed.W.grad_ready = [&] { fired.push_back("W"); };
  f.graphed.b.grad_ready = [&] { fired.push_back("b"); };
  step(f.graphed, f.runner.get(), 0);  // eager
  const std::vector<std::string> eager_order = fired;
  ASSERT_EQ(eager_order.size(), 2u);
  for (int call = 1; call < 5; ++call) {
    fired.clear();
    step(f.graphed, f.runner.get(), call);
    EXPECT_EQ(fired, eager_order) << "call " << call;  // capture (call 2) and replays alike
  }
}

TEST(GraphRunner, WithoutGradTheRegionRunsEagerly) {
  Fixture f;
  NoGradGuard no_grad;
  Var x = Var::constant(values(3 * C, 0.3, {3, C}));
  for (int i = 0; i < 4; ++i) (*f.runner)({x});
  EXPECT_EQ(f.runner->stats().eager_calls, 4);
  EXPECT_EQ(f.runner->stats().captures, 0);
}

TEST(GraphRunner, GtpSendPoolCaptureGuardFiresWhenWarmupDidNotFillIt) {
  // The send pool may not allocate during a capture. With warmups (which fill it) the runner
  // captures GTP backward fine; a capture on an empty pool throws the guard's error.
  parallel::SelfCommunicator self;
  Model m;
  parallel::GtpWeights gtp({&m.W}, &self);
  GraphPool pool(Device::cpu());
  auto fn = [&](const std::vector<Var>& in) {
    Var w = gtp.use(m.W);
    Var y = linear(in[0], w, Var());
    gtp.used(m.W, w);
    return std::vector<Var>{y};
  };
  GraphRunner runner("gtp", fn, Device::cpu(), &gtp, &pool);
  for (int call = 0; call < 4; ++call) {
    Var x = Var::leaf(values(3 * C, 0.3, {3, C}));
    std::vector<Var> out = runner({x});
    backward_with(out[0], values(3 * C, 1.0, {3, C}));
    gtp.finish_backward();
  }
  EXPECT_EQ(runner.stats().captures, 2);

  parallel::SelfCommunicator self2;
  Model m2;
  parallel::GtpWeights cold(std::vector<Parameter*>{&m2.W}, &self2);
  Var x = Var::leaf(values(3 * C, 0.3, {3, C}));
  Var w = cold.use(m2.W);
  Var y = linear(x, w, Var());
  cold.used(m2.W, w);
  cold.set_capturing(true);
  try {
    backward_with(y, values(3 * C, 1.0, {3, C}));
    FAIL() << "the capture guard did not fire";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("during graph capture"), std::string::npos) << e.what();
  }
  clear_tape();
}

}  // namespace
}  // namespace gtron::graphs
