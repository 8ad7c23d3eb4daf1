#include "tests/trainer/cli_util.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace gtron::testing {

CmdResult run_gtron(const std::vector<std::string>& args) {
  std::string cmd = "trainer/gtron";
  for (const std::string& a : args) cmd += " '" + a + "'";
  cmd += " 2>&1";
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string temp_dir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str());
  return dir;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::vector<std::string> metrics_losses(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    const size_t a = line.find("\"loss\": ");
    if (a == std::string::npos) continue;
    const size_t b = line.find(',', a);
    out.push_back(line.substr(a + 8, b - a - 8));
  }
  return out;
}

}  // namespace gtron::testing
