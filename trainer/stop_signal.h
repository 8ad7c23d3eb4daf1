// SIGTERM / SIGINT as a request to stop training cleanly (preemption).
//
// Contract: while a StopSignalScope is alive, the first SIGTERM or SIGINT only records its number
// (stop_signal_received() returns it from then on): the training loop finishes its step, the ranks
// agree on where to stop (Note [stop agreement] in trainer/train.cc), one checkpoint is written and
// the process exits 128 + signal. A second SIGTERM or SIGINT ends the process at once with
// _exit(128 + that signal). The handler does nothing else: it exchanges a lock-free atomic and, the
// second time, calls _exit, both async-signal-safe; it may run on any thread (OpenMP, Gloo).
// Handlers are installed with SA_RESTART, so the system calls it interrupts go on.
#pragma once

#include <signal.h>

namespace gtron {

class StopSignalScope {
 public:
  // Installs the handlers and clears the recorded signal.
  StopSignalScope();
  // Restores the dispositions found at construction (the default ones, normally): a signal after
  // the loop (during the final evaluation) ends the process as it would without gtron's handler.
  ~StopSignalScope();
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;

 private:
  struct sigaction old_term_ = {};
  struct sigaction old_int_ = {};
};

// 0, or the number of the first SIGTERM/SIGINT received inside a StopSignalScope.
int stop_signal_received();

// "SIGTERM", "SIGINT", else "signal".
const char* stop_signal_name(int sig);

}  // namespace gtron
