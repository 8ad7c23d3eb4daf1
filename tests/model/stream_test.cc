// Tests of model/stream.h (CPU streams, the capture seam, events, StreamGuard), the CUDA probe of
// model/device.h, and the tape core of model/autograd.h.
#include "model/stream.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model/autograd.h"
#include "model/device.h"

namespace gtron {
namespace {

using Closures = std::vector<std::function<void()>>;

void replay(const Closures& closures) {
  for (const auto& fn : closures) fn();
}

// Runs `fn` on a helper thread; returns true if it finished within `seconds`. If it did not,
// `unblock` runs (so the helper can finish and be joined: no thread is left behind).
bool finishes_within(double seconds, const std::function<void()>& fn,
                     const std::function<void()>& unblock) {
  std::atomic<bool> done{false};
  std::thread t([&] {
    fn();
    done = true;
  });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  bool finished = done;
  if (!finished) unblock();
  t.join();
  return finished;
}

TEST(Stream, CpuStreamRunsClosuresAtOnce) {
  Stream s(Device::cpu());
  EXPECT_EQ(s.native(), nullptr);
  EXPECT_TRUE(s.device().is_cpu());
  int x = 0;
  s.run([&] { x = 1; });
  EXPECT_EQ(x, 1);
  s.run([&] { x *= 10; });
  EXPECT_EQ(x, 10);
  s.synchronize();  // nothing pending on a CPU stream
  EXPECT_EQ(x, 10);
}

TEST(Stream, CaptureRecordsInsteadOfRunningAndReplaysInOrder) {
  Stream s(Device::cpu());
  std::vector<int> log;
  EXPECT_FALSE(s.capturing());
  s.begin_capture();
  EXPECT_TRUE(s.capturing());
  for (int i = 1; i <= 3; ++i) s.run([&log, i] { log.push_back(i); });
  EXPECT_TRUE(log.empty());  // nothing ran
  Closures graph = s.end_capture();
  EXPECT_FALSE(s.capturing());
  ASSERT_EQ(graph.size(), 3u);
  replay(graph);
  replay(graph);
  EXPECT_EQ(log, (std::vector<int>{1, 2, 3, 1, 2, 3}));
  // After capture, run() runs at once again; a new capture starts empty.
  s.run([&] { log.push_back(4); });
  EXPECT_EQ(log.size(), 7u);
  s.begin_capture();
  EXPECT_EQ(s.end_capture().size(), 0u);
}

TEST(StreamDeathTest, NestedCaptureIsACheckFailure) {
  Stream s(Device::cpu());
  s.begin_capture();
  EXPECT_DEATH(s.begin_capture(), "nested capture");
  s.end_capture();
  EXPECT_DEATH(s.end_capture(), "end_capture without begin_capture");
}

TEST(Event, RecordWaitAndSynchronizeOnCpuStreams) {
  Stream producer(Device::cpu());
  Stream consumer(Device::cpu());
  Event e(Device::cpu());
  int value = 0;
  producer.run([&] { value = 5; });
  e.record(producer);
  e.wait(consumer);  // the record is complete: returns at once
  consumer.run([&] { value += 1; });
  e.synchronize();
  EXPECT_EQ(value, 6);
  // An event never recorded does not block either.
  Event fresh(Device::cpu());
  fresh.wait(consumer);
  fresh.synchronize();
}

TEST(Event, ArmedEventBlocksTheWaitingStreamUntilCompletedByAnotherThread) {
  Stream s(Device::cpu());
  Event e(Device::cpu());
  std::atomic<int> stage{0};
  e.arm();  // a collective was issued
  std::thread worker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stage = 1;  // the collective's result is written
    e.complete();
  });
  e.wait(s);  // blocks until complete()
  int seen = -1;
  s.run([&] { seen = stage.load(); });
  EXPECT_EQ(seen, 1);
  worker.join();
}

TEST(Event, EveryArmNeedsItsOwnComplete) {
  Event e(Device::cpu());
  std::atomic<int> completed{0};
  e.arm();
  e.arm();
  std::thread worker([&] {
    for (int i = 0; i < 2; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      completed++;
      e.complete();
    }
  });
  e.synchronize();
  EXPECT_EQ(completed.load(), 2);
  worker.join();
}

TEST(Event, WaitRecordedDuringCaptureBlocksAtReplay) {
  Stream s(Device::cpu());
  Event e(Device::cpu());
  std::atomic<int> stage{0};
  s.begin_capture();
  e.wait(s);  // recorded, not run: must not block now even if the event is pending later
  s.run([&] { stage = stage.load() == 1 ? 2 : -1; });
  Closures graph = s.end_capture();
  EXPECT_EQ(stage.load(), 0);

  e.arm();
  std::thread worker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stage = 1;
    e.complete();
  });
  replay(graph);  // the recorded wait blocks until the worker completes the event
  EXPECT_EQ(stage.load(), 2);
  worker.join();
}

TEST(Event, RecordDuringCaptureTakesEffectAtEachReplay) {
  Stream s(Device::cpu());
  Stream other(Device::cpu());
  Event e(Device::cpu());
  s.begin_capture();
  e.record(s);
  Closures graph = s.end_capture();
  // Captured but not replayed: the event is not pending, a host synchronize returns.
  EXPECT_TRUE(finishes_within(
      5.0, [&] { e.synchronize(); }, [&] { e.complete(); }));
  replay(graph);
  replay(graph);
  replay(graph);
  // Replays must not bank completions: a later arm() still needs its own complete().
  std::atomic<int> stage{0};
  e.arm();
  std::thread worker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stage = 1;
    e.complete();
  });
  e.wait(other);
  int seen = -1;
  other.run([&] { seen = stage.load(); });
  EXPECT_EQ(seen, 1);
  worker.join();
}

TEST(StreamGuard, MakesTheGuardedStreamCurrentAndRestores) {
  Stream& def = default_stream(Device::cpu());
  EXPECT_EQ(&default_stream(Device::cpu()), &def);  // one per device
  EXPECT_EQ(&current_stream(Device::cpu()), &def);
  Stream a(Device::cpu());
  Stream b(Device::cpu());
  {
    StreamGuard ga(a);
    EXPECT_EQ(&current_stream(Device::cpu()), &a);
    {
      StreamGuard gb(b);
      EXPECT_EQ(&current_stream(Device::cpu()), &b);
      // Another thread has its own current stream.
      Stream* seen = nullptr;
      std::thread t([&] { seen = &current_stream(Device::cpu()); });
      t.join();
      EXPECT_EQ(seen, &def);
    }
    EXPECT_EQ(&current_stream(Device::cpu()), &a);
  }
  EXPECT_EQ(&current_stream(Device::cpu()), &def);
}

TEST(Device, CudaProbeDoesNotCrashAndFindsNoGpuWithoutADriver) {
  int n = cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(cuda_device_count(), n);  // probed once
  // No driver node: no GPU (CI and the build machine). On a GPU machine any count is fine.
  if (access("/dev/nvidiactl", F_OK) != 0) EXPECT_EQ(n, 0);
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(3).str(), "cuda:3");
  EXPECT_NE(Device::cpu(), Device::cuda(0));
}

TEST(Autograd, BackwardRunsTheTapeInReverseAndClearsIt) {
  clear_tape();
  Var loss = Var::leaf(Tensor::zeros({1}, DType::kF64));
  std::vector<int> order;
  double seed_seen = 0;
  record_backward([&] { order.push_back(1); });
  record_backward([&] { order.push_back(2); });
  record_backward([&] {
    order.push_back(3);
    seed_seen = loss.grad().item();  // the seed is in place before the first closure runs
  });
  EXPECT_EQ(tape_size(), 3u);
  backward(loss, 2.5);
  EXPECT_EQ(order, (std::vector<int>{3, 2, 1}));
  EXPECT_EQ(seed_seen, 2.5);
  EXPECT_EQ(tape_size(), 0u);
  backward(loss);  // an empty tape: nothing runs again
  EXPECT_EQ(order.size(), 3u);
}

TEST(Autograd, BackwardReleasesWhatClosuresHeld) {
  clear_tape();
  auto activation = std::make_shared<int>(7);
  std::weak_ptr<int> watch = activation;
  record_backward([held = std::move(activation)] { (void)held; });
  EXPECT_FALSE(watch.expired());
  backward(Var::leaf(Tensor::zeros({1}, DType::kF32)));
  EXPECT_TRUE(watch.expired());
}

TEST(Autograd, NoGradGuardStopsRecordingAndNests) {
  clear_tape();
  EXPECT_TRUE(grad_enabled());
  {
    NoGradGuard outer;
    EXPECT_FALSE(grad_enabled());
    record_backward([] {});
    EXPECT_EQ(tape_size(), 0u);
    EXPECT_FALSE(Var::output(Tensor::zeros({1}, DType::kF32), true).requires_grad());
    {
      NoGradGuard inner;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled());  // the inner guard restores "off", not "on"
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_TRUE(Var::output(Tensor::zeros({1}, DType::kF32), true).requires_grad());
  record_backward([] {});
  EXPECT_EQ(tape_size(), 1u);
  clear_tape();
  EXPECT_EQ(tape_size(), 0u);
}

TEST(Autograd, ParameterGradSlotIsMainGrad) {
  Parameter p("w", Tensor::from_vector({1, 2}, {2}, DType::kF64));
  Var v = Var::param(p);
  EXPECT_TRUE(v.requires_grad());
  EXPECT_TRUE(v.has_grad());
  v.grad().data<double>()[1] += 3;
  EXPECT_EQ(p.main_grad.to_vector(), (std::vector<double>{0, 3}));
  {
    NoGradGuard guard;
    EXPECT_FALSE(Var::param(p).requires_grad());
  }
  clear_tape();  // the use noted above: p dies with this test
}

// Note [work at the end of a tape run]: kEnd after the run's last closure, in registration order,
// with the run still current; a nested run gets its own serial and its own end; kEarly before a
// grad-ready hook fires; kAbort instead of kEnd when a closure throws.
TEST(Autograd, TapeRunEndWorkRunsAfterTheLastClosureAndNests) {
  clear_tape();
  EXPECT_EQ(tape_run_serial(), 0u);
  std::vector<std::string> log;
  uint64_t outer = 0, inner = 0;
  auto ev_name = [](TapeRunEvent ev) {
    return ev == TapeRunEvent::kEnd ? "end" : ev == TapeRunEvent::kEarly ? "early" : "abort";
  };
  record_backward([&] { log.push_back("closure 1"); });
  record_backward([&] {
    outer = tape_run_serial();
    at_tape_run_end([&](TapeRunEvent ev) {
      EXPECT_EQ(tape_run_serial(), outer);  // still current at its end
      log.push_back(std::string("outer b ") + ev_name(ev));
    });
    Tape nested;
    nested.closures.push_back([&] {
      inner = tape_run_serial();
      at_tape_run_end([&](TapeRunEvent ev) { log.push_back(std::string("inner ") + ev_name(ev)); });
    });
    run_tape(std::move(nested));
    EXPECT_EQ(tape_run_serial(), outer);  // back in the outer run
    log.push_back("closure 2");
  });
  record_backward([&] {
    at_tape_run_end([&](TapeRunEvent ev) { log.push_back(std::string("outer a ") + ev_name(ev)); });
  });
  backward(Var::leaf(Tensor::zeros({1}, DType::kF32)));
  EXPECT_NE(outer, 0u);
  EXPECT_NE(inner, 0u);
  EXPECT_NE(inner, outer);
  EXPECT_EQ(tape_run_serial(), 0u);
  EXPECT_EQ(log, (std::vector<std::string>{"inner end", "closure 2", "closure 1", "outer a end",
                                           "outer b end"}));
}

TEST(Autograd, TapeRunEndWorkRunsEarlyBeforeAGradReadyHookAndAbortsOnThrow) {
  clear_tape();
  Parameter p("w", Tensor::zeros({1}, DType::kF32));
  std::vector<std::string> log;
  p.grad_ready = [&] { log.push_back("hook"); };
  Var w = Var::param(p);  // its grad-ready closure runs last
  record_backward([&] {
    at_tape_run_end([&](TapeRunEvent ev) {
      log.push_back(ev == TapeRunEvent::kEarly ? "early" : ev == TapeRunEvent::kEnd ? "end" : "x");
    });
  });
  backward(Var::leaf(Tensor::zeros({1}, DType::kF32)));
  EXPECT_EQ(log, (std::vector<std::string>{"early", "hook", "end"}));
  p.grad_ready = nullptr;

  log.clear();
  record_backward([] { throw std::runtime_error("closure failed"); });
  record_backward([&] {
    at_tape_run_end([&](TapeRunEvent ev) {
      log.push_back(ev == TapeRunEvent::kAbort ? "abort" : "not abort");
    });
  });
  EXPECT_THROW(backward(Var::leaf(Tensor::zeros({1}, DType::kF32))), std::runtime_error);
  EXPECT_EQ(log, (std::vector<std::string>{"abort"}));
  EXPECT_EQ(tape_run_serial(), 0u);
}

}  // namespace
}  // namespace gtron
