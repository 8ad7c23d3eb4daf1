// Test helpers that run the gtron binary as a user would (from the test's runfiles).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace gtron::testing {

struct CmdResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `trainer/gtron ARGS` through /bin/sh (args are single-quoted); returns its exit code and
// output.
CmdResult run_gtron(const std::vector<std::string>& args);
// Runs a shell command line; returns its exit code and output (stdout and stderr).
CmdResult run_command(const std::string& cmd);
// Runs `scripts/gtronrun LAUNCHER_ARGS -- trainer/gtron ARGS`.
CmdResult run_launcher(const std::vector<std::string>& launcher_args,
                       const std::vector<std::string>& args);
// Starts `sh -c 'exec CMD'` in the background with stdout and stderr to `log`: the pid returned
// is CMD's own process (e.g. the real gtron), which a test can signal.
pid_t spawn_command(const std::string& cmd, const std::string& log);
// `trainer/gtron ARGS` in the background (spawn_command).
pid_t spawn_gtron(const std::vector<std::string>& args, const std::string& log);
// Waits for a spawned process; its exit code, or 128 + N when signal N killed it.
int wait_exit_code(pid_t pid);
// Polls until metrics.jsonl at `path` holds at least `n` train records (true), or `pid` has
// exited or `timeout_s` passed (false). Does not reap `pid`.
bool wait_for_train_records(const std::string& path, size_t n, pid_t pid, double timeout_s);
// The whole file ("" when missing).
std::string read_text(const std::string& path);
// Trains the config `config_text` (written to dir/c.json) plus `sets` for its steps under
// dir/name through the gtron binary, EXPECTing exit 0; returns dir/name/checkpoints/step_N with
// N = `steps` (the config's train.steps).
std::string train_checkpoint(const std::string& config_text, const std::string& dir,
                             const std::string& name, const std::vector<std::string>& sets,
                             int steps);
// Runs gtron with `args`, EXPECTing exit 0 (the output is printed when it is not).
void expect_ok(const std::vector<std::string>& args);
// A TCP port that was free a moment ago (bind to port 0, read it back, close).
int free_port();
// Loss values from metrics.jsonl as doubles.
std::vector<double> metrics_loss_values(const std::string& path);
// max_i |a[i] − b[i]| / |a[i]| over the common prefix of two loss curves.
double worst_relative(const std::vector<double>& a, const std::vector<double>& b);
// A fresh directory under TEST_TMPDIR.
std::string temp_dir(const std::string& name);
void write_text(const std::string& path, const std::string& text);
// Main losses per step from a metrics.jsonl file (string compare-friendly: exact printed values).
std::vector<std::string> metrics_losses(const std::string& path);
// The sample text of `gtron sample`'s output: everything before its stats JSON line (the stats
// carry timings, so two runs differ there).
std::string sample_text_of(const std::string& output);

}  // namespace gtron::testing
