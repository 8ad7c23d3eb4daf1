#include "tests/trainer/cli_util.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace gtron::testing {

namespace {
std::string quoted(const std::vector<std::string>& args) {
  std::string s;
  for (const std::string& a : args) s += " '" + a + "'";
  return s;
}
}  // namespace

CmdResult run_gtron(const std::vector<std::string>& args) {
  return run_command("trainer/gtron" + quoted(args));
}

CmdResult run_launcher(const std::vector<std::string>& launcher_args,
                       const std::vector<std::string>& args) {
  return run_command("scripts/gtronrun" + quoted(launcher_args) + " -- trainer/gtron" +
                     quoted(args));
}

pid_t spawn_command(const std::string& cmd, const std::string& log) {
  const std::string line = "exec " + cmd + " > '" + log + "' 2>&1";
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

pid_t spawn_gtron(const std::vector<std::string>& args, const std::string& log) {
  return spawn_command("trainer/gtron" + quoted(args), log);
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

bool wait_for_train_records(const std::string& path, size_t n, pid_t pid, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (metrics_losses(path).size() >= n) return true;
    siginfo_t info{};
    if (waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string train_checkpoint(const std::string& config_text, const std::string& dir,
                             const std::string& name, const std::vector<std::string>& sets,
                             int steps) {
  write_text(dir + "/c.json", config_text);
  std::vector<std::string> args = {"train", "--config", dir + "/c.json", "--out", dir + "/" + name};
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  const CmdResult r = run_gtron(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  char step[16];
  std::snprintf(step, sizeof(step), "step_%08d", steps);
  return dir + "/" + name + "/checkpoints/" + step;
}

void expect_ok(const std::vector<std::string>& args) {
  const CmdResult r = run_gtron(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::vector<double> metrics_loss_values(const std::string& path) {
  std::vector<double> out;
  for (const std::string& s : metrics_losses(path)) out.push_back(std::stod(s));
  return out;
}

CmdResult run_command(const std::string& line) {
  std::string cmd = line + " 2>&1";
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

std::string sample_text_of(const std::string& output) {
  return output.substr(0, output.find("{\"tokens\": "));
}

double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(a[i]));
  }
  return worst;
}

}  // namespace gtron::testing
