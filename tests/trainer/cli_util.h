// Test helpers that run the gtron binary as a user would (from the test's runfiles).
#pragma once

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
