// No input makes gtron abort: a table of bad flags, config values, shards, checkpoint files and
// sampling parameters, each fed to the real binary, must exit with code 2 and a message naming
// the input, and write nothing (the test folder's listing is unchanged, no run folder appears).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "tests/trainer/cli_util.h"
#include "trainer/data/shards.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;
using testing::run_gtron;
using testing::temp_dir;
using testing::write_text;

const char kConfig[] = R"({
  "model": {"vocab_size": 64, "context_length": 16, "n_layer": 1, "n_head": 2, "n_embd": 16},
  "mtp": {"depth": 1},
  "data": {"synthetic": {"tokens": 20000, "val_tokens": 2000}},
  "train": {"steps": 2, "global_batch": 4, "micro_batch": 2, "seq_len": 16, "device": "cpu"},
  "log": {"every": 1}
})";

std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    out.insert(e.path().string() +
               (e.is_regular_file() ? ":" + std::to_string(e.file_size()) : ""));
  }
  return out;
}

struct Case {
  std::string name;
  std::vector<std::string> args;  // {"@train", ...} = train --config C --out DIR/out_<name> ...
  std::string expect;             // a substring of the message: the input it names
};

class BadInputs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(temp_dir("bad_inputs"));
    write_text(*dir_ + "/c.json", kConfig);
    auto r = run_gtron({"train", "--config", *dir_ + "/c.json", "--out", *dir_ + "/run"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  void run_table(const std::vector<Case>& cases) {
    for (const Case& c : cases) {
      std::vector<std::string> args = c.args;
      const std::string out = *dir_ + "/out_" + c.name;
      if (!args.empty() && args[0] == "@train") {
        args.erase(args.begin());
        args.insert(args.begin(), {"train", "--config", *dir_ + "/c.json", "--out", out});
      }
      const std::set<std::string> before = listing(*dir_);
      auto r = run_gtron(args);
      EXPECT_EQ(r.exit_code, 2) << c.name << "\n" << r.output;
      EXPECT_NE(r.output.find(c.expect), std::string::npos)
          << c.name << ": expected '" << c.expect << "' in:\n"
          << r.output;
      EXPECT_EQ(r.output.find("fatal"), std::string::npos) << c.name << "\n" << r.output;
      EXPECT_FALSE(fs::exists(out)) << c.name << ": created " << out;
      EXPECT_EQ(listing(*dir_), before) << c.name << ": wrote or changed files";
    }
  }
  static std::string* dir_;
};
std::string* BadInputs::dir_ = nullptr;

TEST_F(BadInputs, ConfigValuesAndSizes) {
  write_text(*dir_ + "/inf.json", R"({"optimizer": {"lr": 1e999}})");
  run_table({
      {"inf_in_file", {"train", "--config", *dir_ + "/inf.json"}, "inf.json"},
      {"inf_set", {"@train", "--set", "optimizer.lr=1e999"}, "optimizer.lr"},
      {"nan_set", {"@train", "--set", "optimizer.lr=nan"}, "optimizer.lr"},
      {"negative_steps", {"@train", "--set", "train.steps=-3"}, "train.steps"},
      {"huge_embd",
       {"@train", "--set", "model.n_embd=1000000", "--set", "model.n_head=1"},
       "model.n_embd 1000000"},
      {"huge_vocab", {"@train", "--set", "model.vocab_size=100000000000"}, "model.vocab_size"},
      {"huge_layers", {"@train", "--set", "model.n_layer=9223372036854775807"}, "model.n_layer"},
      {"huge_context",
       {"@train", "--set", "model.context_length=9223372036854775807"},
       "model.context_length"},
      {"huge_micro_batch",
       {"@train", "--set", "train.micro_batch=100000000", "--set", "train.global_batch=100000000"},
       "train.micro_batch"},
      {"huge_synthetic",
       {"@train", "--set", "data.synthetic.tokens=3000000000"},
       "data.synthetic.tokens"},
      {"markov_table", {"@train", "--set", "data.synthetic.order=8"}, "data.synthetic.order"},
      {"metrics_folder",
       {"@train", "--set", "log.metrics_file=/proc/gtron_no/m.jsonl"},
       "log.metrics_file"},
      {"empty_out",
       {"train", "--config", *dir_ + "/c.json", "--set", "train.out_dir="},
       "train.out_dir"},
  });
}

TEST_F(BadInputs, FlagsShardsAndCheckpoints) {
  std::vector<uint32_t> tokens(400, 3);
  write_shard(*dir_ + "/ok.bin", tokens, kShardVersionU16);
  tokens[10] = 64;  // == vocab_size
  write_shard(*dir_ + "/vocab.bin", tokens, kShardVersionU16);
  write_text(*dir_ + "/empty.bin", "");
  const std::string ckpt = *dir_ + "/run/checkpoints/step_00000002";
  run_table({
      {"resume_overwrite", {"@train", "--resume", "--overwrite"}, "--overwrite"},
      {"init_missing", {"@train", "--init", *dir_ + "/no_ckpt"}, "no_ckpt"},
      {"init_mismatch",
       {"@train", "--init", ckpt, "--set", "model.n_layer=2"},
       "model.n_layer: checkpoint 1, config 2"},
      {"train_vocab", {"@train", "--set", "data.train=" + *dir_ + "/vocab.bin"}, "vocab.bin"},
      {"train_empty", {"@train", "--set", "data.train=" + *dir_ + "/empty.bin"}, "empty.bin"},
      {"val_vocab",
       {"@train", "--set", "data.train=" + *dir_ + "/ok.bin", "--set",
        "data.val=" + *dir_ + "/vocab.bin"},
       "data.val"},
      {"earlier_run",
       {"train", "--config", *dir_ + "/c.json", "--out", *dir_ + "/run"},
       "holds an earlier run"},
      {"eval_mismatch",
       {"eval", "--checkpoint", ckpt, "--set", "model.n_embd=32"},
       "model.n_embd: checkpoint 16, config 32"},
      {"eval_val",
       {"eval", "--checkpoint", ckpt, "--set", "data.val=" + *dir_ + "/vocab.bin"},
       "vocab.bin"},
      {"logits_id",
       {"logits", "--checkpoint", ckpt, "--tokens", "1,64", "--out", *dir_ + "/l"},
       "'64' is not a token id"},
      {"logits_long",
       {"logits", "--checkpoint", ckpt, "--tokens", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17",
        "--out", *dir_ + "/l"},
       "model.context_length = 16"},
  });
}

TEST_F(BadInputs, SamplingParameters) {
  const std::string ckpt = *dir_ + "/run/checkpoints/step_00000002";
  const std::vector<std::string> s = {"sample",      "--checkpoint", ckpt,
                                      "--print-ids", "--tokens",     "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = s;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  run_table({
      {"temperature_nan", with({"--prompt-ids", "1", "--temperature", "nan"}), "--temperature"},
      {"temperature_neg", with({"--prompt-ids", "1", "--temperature", "-1"}), "--temperature"},
      {"top_p_nan", with({"--prompt-ids", "1", "--top-p", "nan"}), "--top-p"},
      {"top_p_zero", with({"--prompt-ids", "1", "--top-p", "0"}), "--top-p"},
      {"top_k_negative", with({"--prompt-ids", "1", "--top-k", "-1"}), "--top-k"},
      {"tokens_zero", with({"--prompt-ids", "1", "--tokens", "0"}), "--tokens"},
      {"tokens_huge", with({"--prompt-ids", "1", "--tokens", "99999999999"}), "--tokens"},
      {"batch_huge", with({"--prompt-ids", "1", "--batch", "100000000"}), "--batch"},
      {"id_range", with({"--prompt-ids", "1,99"}), "--prompt-ids"},
      {"id_overflow", with({"--prompt-ids", "99999999999999999999"}), "--prompt-ids"},
      {"id_syntax", with({"--prompt-ids", "1,,2"}), "--prompt-ids"},
      {"prompt_long", with({"--prompt-ids", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16"}),
       "at most 15 tokens"},
      {"text_prompt", with({"--prompt", "hello"}), "vocab_size"},
      {"speculative_recompute", with({"--prompt-ids", "1", "--speculative", "--recompute"}),
       "--recompute"},
      {"device", with({"--prompt-ids", "1", "--device", "tpu"}), "--device"},
  });
}

}  // namespace
}  // namespace gtron
