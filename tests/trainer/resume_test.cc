// Resume is bit-exact, and a partial checkpoint is never loaded (issue: Trainer, acceptance 2, 4).
#include <gtest/gtest.h>

#include <fstream>

#include "tests/trainer/cli_util.h"

namespace gtron {
namespace {

using testing::metrics_losses;
using testing::run_gtron;
using testing::temp_dir;
using testing::write_text;

const char kConfig[] = R"({
  "model": {"vocab_size": 64, "context_length": 16, "n_layer": 2, "n_head": 2, "n_embd": 32},
  "mtp": {"depth": 1},
  "data": {"synthetic": {"tokens": 50000, "val_tokens": 5000}},
  "optimizer": {"lr": 3e-3},
  "schedule": {"warmup_steps": 5},
  "train": {"steps": 40, "global_batch": 8, "micro_batch": 4, "seq_len": 16, "device": "cpu"},
  "checkpoint": {"every": 20, "keep": 5},
  "log": {"every": 1}
})";

std::vector<std::string> train(const std::string& config, const std::string& out,
                               std::vector<std::string> extra, std::string* output = nullptr) {
  std::vector<std::string> args = {"train", "--config", config, "--out", out};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_gtron(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (output) *output = r.output;
  return metrics_losses(out + "/metrics.jsonl");
}

TEST(Resume, FortyStraightEqualsTwentyPlusTwenty) {
  const std::string dir = temp_dir("resume");
  write_text(dir + "/c.json", kConfig);
  auto straight = train(dir + "/c.json", dir + "/a", {});
  ASSERT_EQ(straight.size(), 40u);

  // 20 steps with the schedule of a 40-step run, then --resume to 40.
  auto first = train(dir + "/c.json", dir + "/b",
                     {"--set", "train.steps=40", "--set", "checkpoint.every=20"});
  (void)first;
  // Simulate a run stopped at 20 (after logging a few more steps): keep only step 20's
  // checkpoint; the metrics file still holds 40 lines, of which --resume keeps 20.
  std::system(("rm -rf '" + dir + "/b/checkpoints/step_00000040'").c_str());
  std::string out;
  auto resumed = train(dir + "/c.json", dir + "/b", {"--resume"}, &out);
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  ASSERT_EQ(resumed.size(), 40u);
  for (size_t i = 0; i < 40; ++i) EXPECT_EQ(straight[i], resumed[i]) << "step " << i + 1;
}

TEST(Resume, SameConfigTwiceGivesTheSameCurve) {
  const std::string dir = temp_dir("determinism");
  write_text(dir + "/c.json", kConfig);
  auto a = train(dir + "/c.json", dir + "/a", {"--set", "train.steps=10"});
  auto b = train(dir + "/c.json", dir + "/b", {"--set", "train.steps=10"});
  ASSERT_EQ(a.size(), 10u);
  EXPECT_EQ(a, b);
}

TEST(Resume, PartialCheckpointFallsBackToThePreviousComplete) {
  const std::string dir = temp_dir("partial");
  write_text(dir + "/c.json", kConfig);
  auto straight = train(dir + "/c.json", dir + "/a", {});
  // Break the newest checkpoint (truncate its weights) and leave a temporary directory behind, as a
  // crash in the middle of a save would.
  const std::string newest = dir + "/a/checkpoints/step_00000040/model.safetensors";
  std::string bytes;
  {
    std::ifstream f(newest, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  write_text(newest, bytes.substr(0, bytes.size() - 100));
  std::system(("mkdir -p '" + dir + "/a/checkpoints/.tmp-step_00000060-1'").c_str());
  std::string out;
  auto resumed = train(dir + "/c.json", dir + "/a", {"--resume"}, &out);
  EXPECT_NE(out.find("step_00000020 (step 20)"), std::string::npos) << out;
  EXPECT_NE(out.find("corrupt"), std::string::npos) << out;
  // Steps 21..40 are redone from the step-20 checkpoint and match the first run exactly; the
  // metrics file keeps one record per step (the abandoned 21..40 are replaced, not duplicated).
  ASSERT_EQ(resumed.size(), 40u);
  EXPECT_EQ(resumed, straight);
}

}  // namespace
}  // namespace gtron
