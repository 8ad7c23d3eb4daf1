// Preemption and restarts through the real binaries: SIGTERM / SIGINT to a running `gtron train`
// stop it after a step with one checkpoint (exit 143 / 130) from which --resume reproduces the
// uninterrupted losses; a second signal stops at once; under gtronrun two ranks stop at one step;
// `gtronrun --max-restarts` after a rank is SIGKILLed mid-run ends with the uninterrupted losses.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <regex>

#include "tests/trainer/cli_util.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;
using testing::metrics_losses;
using testing::read_text;
using testing::run_command;
using testing::run_gtron;
using testing::spawn_command;
using testing::spawn_gtron;
using testing::temp_dir;
using testing::wait_exit_code;
using testing::wait_for_train_records;
using testing::write_text;

// Long enough that a signal sent after a few logged steps arrives mid-run; no periodic
// checkpoints, so the only one before the end is the stop's.
const char kConfig[] = R"({
  "model": {"vocab_size": 64, "context_length": 16, "n_layer": 2, "n_head": 2, "n_embd": 32},
  "mtp": {"depth": 1},
  "data": {"synthetic": {"tokens": 50000, "val_tokens": 5000}},
  "optimizer": {"lr": 3e-3},
  "schedule": {"warmup_steps": 5},
  "train": {"steps": 1000, "global_batch": 8, "micro_batch": 4, "seq_len": 16, "device": "cpu",
            "eval_batches": 1},
  "checkpoint": {"every": 0, "keep": 5},
  "log": {"every": 1}
})";

std::vector<std::string> checkpoints_in(const std::string& dir) {
  std::vector<std::string> names;
  if (!fs::is_directory(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The step N of "stopped after step N" in `output`, or -1.
long stopped_step(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("stopped after step ([0-9]+) of"))) return -1;
  return std::stol(m[1]);
}

std::string launcher(const std::string& options, const std::string& dir, const std::string& out,
                     const std::string& extra = "") {
  return "scripts/gtronrun --standalone --nproc-per-node 2 " + options +
         " -- trainer/gtron train --config '" + dir + "/c.json' --out '" + out + "' " + extra;
}

class Preemption : public ::testing::Test {
 protected:
  void SetUp() override {
    // One thread per process, as gtronrun gives its ranks: OpenMP's spinning threads crawl on a
    // busy 2-core machine.
    setenv("OMP_NUM_THREADS", "1", 1);
    dir_ = temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    write_text(dir_ + "/c.json", kConfig);
  }
  // Starts `gtron train` on `out`, sends `sig` after 5 logged steps, returns the exit code.
  int train_and_signal(const std::string& out, int sig, std::string* output) {
    const std::string log = out + ".log";
    const pid_t pid = spawn_gtron({"train", "--config", dir_ + "/c.json", "--out", out}, log);
    EXPECT_TRUE(wait_for_train_records(out + "/metrics.jsonl", 5, pid, 120))
        << "no 5 steps logged while running:\n"
        << read_text(log);
    kill(pid, sig);
    const int code = wait_exit_code(pid);
    *output = read_text(log);
    return code;
  }
  std::string dir_;
};

TEST_F(Preemption, SigtermWritesACheckpointThatResumesToTheSameLosses) {
  const auto straight = run_gtron({"train", "--config", dir_ + "/c.json", "--out", dir_ + "/a"});
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::vector<std::string> want = metrics_losses(dir_ + "/a/metrics.jsonl");
  ASSERT_EQ(want.size(), 1000u);

  std::string out;
  ASSERT_EQ(train_and_signal(dir_ + "/b", SIGTERM, &out), 143) << out;
  const long step = stopped_step(out);
  ASSERT_GE(step, 5) << out;
  ASSERT_LT(step, 1000) << out;
  char name[32];
  std::snprintf(name, sizeof name, "step_%08ld", step);
  EXPECT_NE(out.find("gtron: SIGTERM: stopped after step"), std::string::npos) << out;
  EXPECT_NE(out.find("checkpoints/" + std::string(name) + " (continue with --resume)"),
            std::string::npos)
      << out;
  EXPECT_EQ(checkpoints_in(dir_ + "/b/checkpoints"), std::vector<std::string>{name});
  EXPECT_EQ(out.find("final:"), std::string::npos) << "a stopped run skips the final eval\n" << out;
  // The stop step is logged, and nothing after it.
  EXPECT_EQ(metrics_losses(dir_ + "/b/metrics.jsonl").size(), static_cast<size_t>(step));

  const auto resumed =
      run_gtron({"train", "--config", dir_ + "/c.json", "--out", dir_ + "/b", "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("(step " + std::to_string(step) + ")"), std::string::npos)
      << resumed.output;
  EXPECT_EQ(metrics_losses(dir_ + "/b/metrics.jsonl"), want);
}

TEST_F(Preemption, SigintExits130WithACheckpoint) {
  std::string out;
  ASSERT_EQ(train_and_signal(dir_ + "/b", SIGINT, &out), 130) << out;
  const long step = stopped_step(out);
  ASSERT_GE(step, 5) << out;
  EXPECT_NE(out.find("gtron: SIGINT: stopped after step"), std::string::npos) << out;
  char name[32];
  std::snprintf(name, sizeof name, "step_%08ld", step);
  EXPECT_EQ(checkpoints_in(dir_ + "/b/checkpoints"), std::vector<std::string>{name});
}

// SIGTERM and SIGINT microseconds apart (two of one signal could merge into one pending signal):
// the second is handled while the first step is still running (a step takes milliseconds) and
// ends the process at once with 128 + its number: no stop message, no checkpoint.
TEST_F(Preemption, ASecondSignalStopsAtOnce) {
  const std::string out_dir = dir_ + "/b", log = dir_ + "/b.log";
  const pid_t pid = spawn_gtron({"train", "--config", dir_ + "/c.json", "--out", out_dir}, log);
  ASSERT_TRUE(wait_for_train_records(out_dir + "/metrics.jsonl", 5, pid, 120)) << read_text(log);
  kill(pid, SIGTERM);
  kill(pid, SIGINT);
  const int code = wait_exit_code(pid);
  const std::string out = read_text(log);
  EXPECT_TRUE(code == 130 || code == 143) << code << "\n" << out;
  EXPECT_EQ(stopped_step(out), -1) << out;
  EXPECT_TRUE(checkpoints_in(out_dir + "/checkpoints").empty()) << out;
}

// SIGTERM to gtronrun reaches both ranks; they agree on one stop step (Note [stop agreement]),
// write one checkpoint together, and --resume under the launcher gives the uninterrupted losses.
TEST_F(Preemption, TwoRanksUnderTheLauncherStopAtOneStep) {
  const std::string sets = "--set train.steps=300";
  const auto straight = run_command(launcher("", dir_, dir_ + "/a", sets));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::vector<std::string> want = metrics_losses(dir_ + "/a/metrics.jsonl");
  ASSERT_EQ(want.size(), 300u);

  const std::string out_dir = dir_ + "/b", log = dir_ + "/b.log";
  const pid_t pid = spawn_command(launcher("", dir_, out_dir, sets), log);
  ASSERT_TRUE(wait_for_train_records(out_dir + "/metrics.jsonl", 5, pid, 120)) << read_text(log);
  kill(pid, SIGTERM);
  ASSERT_EQ(wait_exit_code(pid), 143) << read_text(log);
  const std::string out = read_text(log);
  const long step = stopped_step(out);
  ASSERT_GE(step, 5) << out;
  ASSERT_LT(step, 300) << out;
  EXPECT_EQ(out.find("exited with code"), std::string::npos) << "a rank did not exit 143\n" << out;
  char name[32];
  std::snprintf(name, sizeof name, "step_%08ld", step);
  EXPECT_EQ(checkpoints_in(out_dir + "/checkpoints"), std::vector<std::string>{name});

  const auto resumed = run_command(launcher("", dir_, out_dir, sets + " --resume"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("(step " + std::to_string(step) + ")"), std::string::npos)
      << resumed.output;
  EXPECT_EQ(metrics_losses(out_dir + "/metrics.jsonl"), want);
}

// Rank 1 is SIGKILLed after step 10 of attempt 0 (GTRON_TEST_KILL_RANK_AT_STEP, a test switch);
// gtronrun restarts the group with the same command, whose --resume finds no checkpoint on
// attempt 0 (it starts at step 0) and the step-8 checkpoint on attempt 1.
TEST_F(Preemption, RestartAfterAKilledRankGivesTheUninterruptedLosses) {
  const std::string sets = "--set train.steps=24 --set checkpoint.every=4 --resume";
  const auto straight = run_command(launcher("", dir_, dir_ + "/a", sets));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::vector<std::string> want = metrics_losses(dir_ + "/a/metrics.jsonl");
  ASSERT_EQ(want.size(), 24u);

  const auto restarted = run_command("GTRON_TEST_KILL_RANK_AT_STEP=1:10 " +
                                     launcher("--max-restarts 2", dir_, dir_ + "/b", sets));
  ASSERT_EQ(restarted.exit_code, 0) << restarted.output;
  // The launcher names the first rank it sees fail: the killed one (137), or its peer, which
  // fails on the broken connection (exit 1) when it notices first.
  EXPECT_TRUE(restarted.output.find("rank 1 exited with code 137; restarting the group (restart 1 "
                                    "of 2)") != std::string::npos ||
              restarted.output.find("rank 0 exited with code 1; restarting the group (restart 1 "
                                    "of 2)") != std::string::npos)
      << restarted.output;
  EXPECT_EQ(restarted.output.find("exited with code 141"), std::string::npos)
      << "a rank died of SIGPIPE\n"
      << restarted.output;
  EXPECT_NE(restarted.output.find("no complete checkpoint"), std::string::npos) << restarted.output;
  EXPECT_NE(restarted.output.find("resumed from " + dir_ + "/b/checkpoints/step_00000008 (step 8)"),
            std::string::npos)
      << restarted.output;
  EXPECT_EQ(metrics_losses(dir_ + "/b/metrics.jsonl"), want);
}

}  // namespace
}  // namespace gtron
