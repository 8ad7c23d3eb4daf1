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
// A fresh directory under TEST_TMPDIR.
std::string temp_dir(const std::string& name);
void write_text(const std::string& path, const std::string& text);
// Main losses per step from a metrics.jsonl file (string compare-friendly: exact printed values).
std::vector<std::string> metrics_losses(const std::string& path);

}  // namespace gtron::testing
