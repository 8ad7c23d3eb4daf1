#include "trainer/stop_signal.h"

#include <unistd.h>

#include <atomic>

namespace gtron {

namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free atomic");

void on_stop_signal(int sig) {
  if (g_stop_signal.exchange(sig) != 0) _exit(128 + sig);  // the second signal: stop at once
}

void install(int sig, struct sigaction* old) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(sig, &sa, old);
}

}  // namespace

StopSignalScope::StopSignalScope() {
  g_stop_signal.store(0);
  install(SIGTERM, &old_term_);
  install(SIGINT, &old_int_);
}

StopSignalScope::~StopSignalScope() {
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGINT, &old_int_, nullptr);
}

int stop_signal_received() { return g_stop_signal.load(); }

const char* stop_signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    default:
      return "signal";
  }
}

}  // namespace gtron
