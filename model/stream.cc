#include "model/stream.h"

#include <map>

#include "model/check.h"
#include "model/cuda/runtime.h"

namespace gtron {

Stream::Stream(Device device) : device_(device) {
  if (device.is_cuda()) native_ = cuda::stream_create(device.index);
}

Stream::~Stream() {
  if (native_ != nullptr) cuda::stream_destroy(native_);
}

void Stream::run(std::function<void()> fn) {
  GTRON_CHECK(device_.is_cpu(), "Stream::run is for CPU streams; got ", device_.str());
  if (capturing_) {
    recorded_.push_back(std::move(fn));
  } else {
    fn();
  }
}

void Stream::synchronize() {
  if (native_ != nullptr) cuda::stream_synchronize(native_);
}

void Stream::begin_capture() {
  GTRON_CHECK(!capturing_, "nested capture");
  capturing_ = true;
  recorded_.clear();
}

std::vector<std::function<void()>> Stream::end_capture() {
  GTRON_CHECK(capturing_, "end_capture without begin_capture");
  capturing_ = false;
  return std::move(recorded_);
}

Stream& default_stream(Device device) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, Stream*> streams;  // leaked on purpose: process lifetime
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(static_cast<int>(device.kind), device.index);
  auto it = streams.find(key);
  if (it == streams.end()) it = streams.emplace(key, new Stream(device)).first;
  return *it->second;
}

namespace {
// Per thread: the current stream of each device (null = default stream).
thread_local std::map<std::pair<int, int>, Stream*> t_current;

std::pair<int, int> key_of(Device d) { return {static_cast<int>(d.kind), d.index}; }
}  // namespace

Stream& current_stream(Device device) {
  auto it = t_current.find(key_of(device));
  if (it != t_current.end() && it->second != nullptr) return *it->second;
  return default_stream(device);
}

StreamGuard::StreamGuard(Stream& stream) : device_(stream.device()) {
  Stream*& slot = t_current[key_of(device_)];
  prev_ = slot;
  slot = &stream;
}

StreamGuard::~StreamGuard() { t_current[key_of(device_)] = prev_; }

Event::Event(Device device) : device_(device) {
  if (device.is_cuda()) {
    native_ = cuda::event_create(device.index);
  } else {
    cpu_ = std::make_shared<CpuState>();
  }
}

Event::~Event() {
  if (native_ != nullptr) cuda::event_destroy(native_);
}

void Event::record(Stream& stream) {
  if (native_ != nullptr) {
    cuda::event_record(native_, stream.native());
    return;
  }
  // A CPU stream has run everything queued before this point by the time the closure runs, so the
  // record arms and completes at once. While capturing that happens at each replay, not at capture
  // time: arming at capture would leave the event pending until a replay (a host synchronize would
  // hang), and every replay after the first would complete one record too many, so a later arm()
  // by a collective worker would count as done before complete().
  auto state = cpu_;
  stream.run([state] {
    std::lock_guard<std::mutex> lock(state->mu);
    state->armed++;
    state->done++;
    state->cv.notify_all();
  });
}

void Event::wait(Stream& stream) {
  if (native_ != nullptr) {
    cuda::stream_wait_event(stream.native(), native_);
    return;
  }
  auto state = cpu_;
  stream.run([state] {
    std::unique_lock<std::mutex> lock(state->mu);
    uint64_t target = state->armed;
    state->cv.wait(lock, [&] { return state->done >= target; });
  });
}

void Event::synchronize() {
  if (native_ != nullptr) {
    cuda::event_synchronize(native_);
    return;
  }
  std::unique_lock<std::mutex> lock(cpu_->mu);
  uint64_t target = cpu_->armed;
  cpu_->cv.wait(lock, [&] { return cpu_->done >= target; });
}

void Event::arm() {
  GTRON_CHECK(cpu_ != nullptr, "arm() is for CPU events");
  std::lock_guard<std::mutex> lock(cpu_->mu);
  cpu_->armed++;
}

void Event::complete() {
  GTRON_CHECK(cpu_ != nullptr, "complete() is for CPU events");
  std::lock_guard<std::mutex> lock(cpu_->mu);
  cpu_->done++;
  cpu_->cv.notify_all();
}

}  // namespace gtron
