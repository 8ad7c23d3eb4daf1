// Safe runs (Note [preflight] in trainer/preflight.h), through the real binary: every input is
// checked before step 1 with nothing written, an earlier run is never clobbered without --resume
// or --overwrite, and the checkpoint commands take the checkpoint's own config.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/trainer/cli_util.h"
#include "trainer/data/shards.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::run_gtron;
using testing::temp_dir;
using testing::write_text;

const char kConfig[] = R"({
  "model": {"vocab_size": 64, "context_length": 16, "n_layer": 1, "n_head": 2, "n_embd": 16},
  "mtp": {"depth": 1},
  "data": {"synthetic": {"tokens": 20000, "val_tokens": 2000}},
  "train": {"steps": 4, "global_batch": 4, "micro_batch": 2, "seq_len": 16, "device": "cpu"},
  "checkpoint": {"every": 2, "keep": 5},
  "log": {"every": 1}
})";

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

bool mentions(const std::string& out, const std::string& what) {
  return out.find(what) != std::string::npos;
}

class SafeRuns : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir("safe_runs");
    config_ = dir_ + "/c.json";
    write_text(config_, kConfig);
  }
  testing::CmdResult train(const std::string& out, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"train", "--config", config_, "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_gtron(args);
  }
  // A shard of `n` tokens below 60, one token replaced by `bad` when >= 0.
  std::string shard(const std::string& name, size_t n, int bad = -1) {
    std::vector<uint32_t> tokens(n);
    for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>(i * 7 % 60);
    if (bad >= 0) tokens[n / 2] = static_cast<uint32_t>(bad);
    const std::string path = dir_ + "/" + name;
    write_shard(path, tokens, kShardVersionU16);
    return path;
  }
  std::string dir_, config_;
};

// Refused before step 1: exit 2, the message names the key, no step ran, nothing was created.
void expect_refused_before_work(const testing::CmdResult& r, const std::string& key,
                                const std::string& out) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(mentions(r.output, key)) << "expected '" << key << "' in:\n" << r.output;
  EXPECT_FALSE(mentions(r.output, "step     1/")) << r.output;
  EXPECT_FALSE(fs::exists(out)) << out << " was created by a run that failed its checks";
}

TEST_F(SafeRuns, UnwritableCheckpointFolderFailsBeforeStep1) {
  // A checkpoint folder under a regular file cannot be created by anyone, root included (mkdir
  // gives ENOTDIR); chmod would not do, since the tests run as root, which ignores mode bits.
  write_text(dir_ + "/a_file", "not a folder");
  const std::string out = dir_ + "/run_ckpt";
  auto r = train(out, {"--set", "checkpoint.dir=" + dir_ + "/a_file/checkpoints"});
  expect_refused_before_work(r, "checkpoint.dir", out);
  // A run folder there fails the same way.
  const std::string nested = dir_ + "/a_file/run";
  expect_refused_before_work(train(nested), "train.out_dir", nested);
  if (::geteuid() != 0) {  // mode bits hold for everyone else
    fs::create_directories(dir_ + "/ro");
    fs::permissions(dir_ + "/ro", fs::perms::owner_read | fs::perms::owner_exec);
    const std::string ro_out = dir_ + "/run_ro";
    expect_refused_before_work(train(ro_out, {"--set", "checkpoint.dir=" + dir_ + "/ro/ck"}),
                               "checkpoint.dir", ro_out);
  }
}

TEST_F(SafeRuns, BadValidationShardFailsBeforeStep1) {
  const std::string good = shard("train_000.bin", 3000);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {shard("val_vocab.bin", 3000, 63 + 1000), "val_vocab.bin"},  // token id >= vocab
      {shard("val_short.bin", 10), "val_short.bin"},               // less than one window
      {dir_ + "/val_missing_*.bin", "val_missing_*.bin"},
  };
  for (const auto& [val, name] : bad) {
    const std::string out = dir_ + "/run_" + name.substr(0, name.find('.'));
    auto r = train(out, {"--set", "data.train=" + good, "--set", "data.val=" + val});
    expect_refused_before_work(r, "data.val", out);
    EXPECT_TRUE(mentions(r.output, name)) << r.output;
  }
  // The same shards as training data name data.train.
  const std::string out = dir_ + "/run_train_vocab";
  auto r = train(out, {"--set", "data.train=" + dir_ + "/val_vocab.bin"});
  expect_refused_before_work(r, "data.train", out);
}

TEST_F(SafeRuns, AnEarlierRunIsRefusedThenOverwrittenOrResumed) {
  const std::string out = dir_ + "/run";
  ASSERT_EQ(train(out).exit_code, 0);
  const std::string metrics = read_all(out + "/metrics.jsonl");
  ASSERT_EQ(testing::metrics_losses(out + "/metrics.jsonl").size(), 4u);

  auto again = train(out);
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_TRUE(mentions(again.output, "holds an earlier run")) << again.output;
  EXPECT_TRUE(mentions(again.output, "--resume")) << again.output;
  EXPECT_TRUE(mentions(again.output, "--overwrite")) << again.output;
  EXPECT_EQ(read_all(out + "/metrics.jsonl"), metrics) << "a refused run changed the metrics";
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_00000004"));

  auto both = train(out, {"--resume", "--overwrite"});
  EXPECT_EQ(both.exit_code, 2) << both.output;
  EXPECT_TRUE(mentions(both.output, "exclude each other")) << both.output;

  // --overwrite: the old checkpoints and metrics go, the new run starts at step 0.
  auto over = train(out, {"--overwrite", "--set", "train.steps=2"});
  ASSERT_EQ(over.exit_code, 0) << over.output;
  EXPECT_TRUE(mentions(over.output, "--overwrite: deleted")) << over.output;
  EXPECT_EQ(testing::metrics_losses(out + "/metrics.jsonl").size(), 2u);
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_00000002"));
  EXPECT_FALSE(fs::exists(out + "/checkpoints/step_00000004"));
}

TEST_F(SafeRuns, ResumeAppendsAndDropsTheRecordsAfterTheCheckpoint) {
  const std::string out = dir_ + "/run";
  ASSERT_EQ(train(out).exit_code, 0);
  const std::string full = read_all(out + "/metrics.jsonl");
  // A run that died after step 4's record but before its checkpoint: step 2's is the newest,
  // and a save interrupted at step 4 left its temporary folder.
  fs::remove_all(out + "/checkpoints/step_00000004");
  const std::string tmp = out + "/checkpoints/.tmp-step_00000004-99999";
  fs::create_directories(tmp);
  write_text(tmp + "/model.safetensors", "half");
  auto r = train(out, {"--resume"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(mentions(r.output, "removed leftover temporary checkpoint folder '" + tmp + "'"))
      << r.output;
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(mentions(r.output, "(step 2)")) << r.output;
  // One record per step, steps 1..2 kept byte for byte (appended to, not rewritten), 3..4 redone
  // with the same losses (resume is exact).
  const std::string now = read_all(out + "/metrics.jsonl");
  const size_t two = full.find('\n', full.find('\n') + 1) + 1;
  EXPECT_EQ(now.substr(0, two), full.substr(0, two));
  write_text(dir_ + "/full.jsonl", full);
  const std::vector<std::string> expected = testing::metrics_losses(dir_ + "/full.jsonl");
  ASSERT_EQ(expected.size(), 4u);
  EXPECT_EQ(testing::metrics_losses(out + "/metrics.jsonl"), expected);
}

TEST_F(SafeRuns, ResumeWithNoCheckpointStartsAtStepZero) {
  const std::string out = dir_ + "/fresh";
  auto r = train(out, {"--resume"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(mentions(r.output, "no complete checkpoint")) << r.output;
  EXPECT_TRUE(mentions(r.output, "starting from step 0")) << r.output;
  EXPECT_EQ(testing::metrics_losses(out + "/metrics.jsonl").size(), 4u);
}

TEST_F(SafeRuns, ResumeIntoAnotherModelNamesTheKey) {
  const std::string out = dir_ + "/run";
  ASSERT_EQ(train(out).exit_code, 0);
  auto r = train(out, {"--resume", "--set", "model.n_embd=32"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(mentions(r.output, "model.n_embd: checkpoint 16, config 32")) << r.output;
}

TEST_F(SafeRuns, CheckpointCommandsTakeTheCheckpointsConfig) {
  const std::string out = dir_ + "/run";
  ASSERT_EQ(train(out).exit_code, 0);
  const std::string ckpt = out + "/checkpoints/step_00000004";
  auto eval = run_gtron({"eval", "--checkpoint", ckpt});
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_TRUE(mentions(eval.output, "\"val_main_loss\": ")) << eval.output;
  auto with_config = run_gtron({"eval", "--config", config_, "--checkpoint", ckpt});
  EXPECT_EQ(with_config.exit_code, 0) << with_config.output;
  auto wrong =
      run_gtron({"eval", "--config", config_, "--set", "model.n_embd=32", "--checkpoint", ckpt});
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  EXPECT_TRUE(mentions(wrong.output, "model.n_embd: checkpoint 16, config 32")) << wrong.output;
  auto sample = run_gtron({"sample", "--checkpoint", ckpt, "--prompt-ids", "1,2,3", "--tokens", "4",
                           "--print-ids", "--seed", "5"});
  EXPECT_EQ(sample.exit_code, 0) << sample.output;
  EXPECT_EQ(sample.output.rfind("1,2,3,", 0), 0u) << sample.output;
  // A prompt that fills the context: the message says how long it may be.
  auto long_prompt = run_gtron({"sample", "--checkpoint", ckpt, "--prompt-ids",
                                "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16", "--print-ids"});
  EXPECT_EQ(long_prompt.exit_code, 2) << long_prompt.output;
  EXPECT_TRUE(mentions(long_prompt.output, "at most 15 tokens")) << long_prompt.output;
}

TEST_F(SafeRuns, GtpIsCheckedAgainstTheWorldBeforeTheBatch) {
  // World 2, G = 4: the batch cannot split over 4 ranks either, but G is the real problem.
  auto r = run_command(
      "env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 "
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 trainer/gtron train --config '" +
      config_ + "' --out '" + dir_ + "/gtp' --set parallel.gtp=4");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(mentions(r.output, "parallel.gtp = 4: must divide the world size (2)")) << r.output;
  EXPECT_FALSE(fs::exists(dir_ + "/gtp"));
}

TEST_F(SafeRuns, ScriptKeepsTheCallersDirectory) {
  // scripts/gtron with GTRON_BIN (no build inside a test): a relative --config means the
  // caller's folder, not the repository root.
  const std::string here = fs::current_path().string();
  const std::string work = temp_dir("caller");
  write_text(work + "/x.json", R"({"model": {"n_layer": 3}})");
  auto r = run_command("cd '" + work + "' && GTRON_BIN='" + here + "/trainer/gtron' '" + here +
                       "/scripts/gtron' print-config --config x.json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(mentions(r.output, "\"n_layer\": 3")) << r.output;
}

}  // namespace
}  // namespace gtron
