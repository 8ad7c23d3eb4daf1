// The gtron CLI as a user meets it: bad configs, flags and files each exit with code 2 and a
// message naming the key or file, before anything is written.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/trainer/cli_util.h"
#include "trainer/data/shards.h"

namespace gtron {
namespace {

using testing::run_gtron;
using testing::sample_text_of;
using testing::temp_dir;
using testing::write_text;

const char kTinyConfig[] = R"({
  "model": {"vocab_size": 64, "context_length": 16, "n_layer": 1, "n_head": 2, "n_embd": 16},
  "mtp": {"depth": 1},
  "data": {"synthetic": {"tokens": 20000, "val_tokens": 2000}},
  "train": {"steps": 4, "global_batch": 4, "micro_batch": 2, "seq_len": 16, "device": "cpu"},
  "log": {"every": 1}
})";

struct BadCase {
  std::string name;
  std::vector<std::string> args;  // after "train --config <tiny> --out <dir>" unless raw
  std::string expect;             // substring of the message
  bool raw = false;               // args are the whole command line
};

bool exists(const std::string& path) { return std::ifstream(path).good(); }

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir("bad_input");
    config_ = dir_ + "/tiny.json";
    write_text(config_, kTinyConfig);
  }
  void expect_user_error(const BadCase& c) {
    const std::string out = dir_ + "/run_" + c.name;
    std::vector<std::string> args = c.args;
    if (!c.raw) {
      args = {"train", "--config", config_, "--out", out};
      args.insert(args.end(), c.args.begin(), c.args.end());
    }
    auto r = run_gtron(args);
    EXPECT_EQ(r.exit_code, 2) << c.name << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos)
        << c.name << ": expected '" << c.expect << "' in:\n"
        << r.output;
    if (!c.raw) {
      EXPECT_FALSE(exists(out + "/metrics.jsonl")) << c.name << ": wrote metrics";
    }
  }
  std::string dir_, config_;
};

TEST_F(BadInput, ConfigsAndFlags) {
  const std::vector<BadCase> cases = {
      {"unknown_key", {"--set", "model.n_layers=2"}, "model.n_layers"},
      {"wrong_type", {"--set", "model.n_layer=\"two\""}, "model.n_layer"},
      {"float_for_int", {"--set", "model.n_layer=1.5"}, "model.n_layer"},
      {"negative_lr", {"--set", "optimizer.lr=-1"}, "optimizer.lr"},
      {"bad_enum", {"--set", "train.device=tpu"}, "train.device"},
      {"heads", {"--set", "model.n_head=3"}, "model.n_head"},
      {"seq_len", {"--set", "train.seq_len=32"}, "train.seq_len"},
      {"batch", {"--set", "train.global_batch=5"}, "train.global_batch"},
      {"mtp_depth", {"--set", "mtp.depth=-1"}, "mtp.depth"},
      {"set_syntax", {"--set", "model.n_layer"}, "model.n_layer"},
      {"warmup", {"--set", "schedule.warmup_steps=10"}, "schedule.warmup_steps"},
      {"keep", {"--set", "checkpoint.keep=0"}, "checkpoint.keep"},
      {"cuda", {"--set", "train.device=cuda"}, "train.device"},
      {"graphs_scope", {"--set", "graphs.scope=all"}, "graphs.scope"},
      {"graphs_warmup", {"--set", "graphs.warmup=1"}, "graphs.warmup"},
      {"no_shards", {"--set", "data.train=" + dir_ + "/nothing_*.bin"}, "nothing_*.bin"},
      {"unknown_flag", {"train", "--config", "x.json", "--bogus"}, "--bogus", true},
      {"no_config", {"train"}, "--config", true},
      {"missing_file",
       {"train", "--config", "/nonexistent/cfg.json"},
       "/nonexistent/cfg.json",
       true},
      {"unknown_subcommand", {"trian"}, "trian", true},
  };
  for (const BadCase& c : cases) expect_user_error(c);
}

TEST_F(BadInput, MalformedJson) {
  write_text(dir_ + "/broken.json", "{\"model\": {\"n_layer\": 2,,}");
  expect_user_error(
      {"malformed", {"train", "--config", dir_ + "/broken.json"}, "broken.json", true});
}

TEST_F(BadInput, CorruptShards) {
  // A good shard, then three ways to break one: bad magic, truncation, a token beyond the vocab.
  std::vector<uint32_t> tokens(500);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i % 60);
  const std::string good = dir_ + "/good.bin";
  write_shard(good, tokens, kShardVersionU16);
  std::string bytes;
  {
    std::ifstream f(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  std::string magic = bytes;
  magic[0] ^= 0x5a;
  write_text(dir_ + "/magic.bin", magic);
  write_text(dir_ + "/short.bin", bytes.substr(0, bytes.size() - 10));
  tokens[7] = 999;
  write_shard(dir_ + "/vocab.bin", tokens, kShardVersionU16);
  for (const char* name : {"magic.bin", "short.bin", "vocab.bin"}) {
    expect_user_error({std::string("shard_") + name,
                       {"--set", "data.train=" + dir_ + "/" + name, "--set", "data.val=" + good},
                       name});
  }
}

TEST_F(BadInput, EvalSamplePrepare) {
  expect_user_error({"eval_missing",
                     {"eval", "--config", config_, "--checkpoint", dir_ + "/no_such_ckpt"},
                     "no_such_ckpt",
                     true});
  expect_user_error({"sample_missing",
                     {"sample", "--checkpoint", dir_ + "/nope", "--prompt", "hi"},
                     "nope",
                     true});
  expect_user_error({"prepare_missing_text",
                     {"prepare", "--text", dir_ + "/missing.txt", "--out", dir_ + "/p1"},
                     "missing.txt",
                     true});
  write_text(dir_ + "/some.txt", "hello world");
  expect_user_error(
      {"prepare_fraction",
       {"prepare", "--text", dir_ + "/some.txt", "--out", dir_ + "/p2", "--val-fraction", "1.5"},
       "val",
       true});
  expect_user_error(
      {"prepare_source", {"prepare", "--synthetic", "zipf", "--out", dir_ + "/p3"}, "zipf", true});
}

TEST_F(BadInput, CorruptCheckpointAndWrongVocabSample) {
  const std::string out = dir_ + "/ok";
  auto r = run_gtron({"train", "--config", config_, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string ckpt = out + "/checkpoints/step_00000004";
  // Sampling needs a byte-level model (vocab >= 256); this one has 64.
  expect_user_error(
      {"sample_vocab", {"sample", "--checkpoint", ckpt, "--prompt", "a"}, "vocab_size", true});
  // Truncate the weights: eval must refuse, naming the file.
  const std::string model = ckpt + "/model.safetensors";
  std::string bytes;
  {
    std::ifstream f(model, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  write_text(model, bytes.substr(0, bytes.size() / 2));
  expect_user_error({"eval_corrupt",
                     {"eval", "--config", config_, "--checkpoint", ckpt},
                     "model.safetensors",
                     true});
}

TEST_F(BadInput, CheckpointHoldsTheDocumentedNamesAndShapes) {
  // The independent stdlib-only checker reads the model file of a real checkpoint: every
  // documented name (docs/checkpoints-and-interop.md) with its [out, in] shape. V=64 (padded 64),
  // C=16, T=16.
  const std::string out = dir_ + "/names";
  auto r = run_gtron(
      {"train", "--config", config_, "--out", out, "--set", "model.tied_embeddings=false"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string file = out + "/checkpoints/step_00000004/model.safetensors";
  std::string cmd = "/usr/bin/python3 tests/trainer/check_safetensors.py " + file;
  for (const char* e : {"wte.weight=F32:64x16",
                        "wpe.weight=F32:16x16",
                        "blocks.0.ln1.weight=F32:16",
                        "blocks.0.ln1.bias=F32:16",
                        "blocks.0.attn.qkv.weight=F32:48x16",
                        "blocks.0.attn.qkv.bias=F32:48",
                        "blocks.0.attn.proj.weight=F32:16x16",
                        "blocks.0.attn.proj.bias=F32:16",
                        "blocks.0.ln2.weight=F32:16",
                        "blocks.0.mlp.fc.weight=F32:64x16",
                        "blocks.0.mlp.fc.bias=F32:64",
                        "blocks.0.mlp.proj.weight=F32:16x64",
                        "blocks.0.mlp.proj.bias=F32:16",
                        "ln_f.weight=F32:16",
                        "ln_f.bias=F32:16",
                        "lm_head.weight=F32:64x16",
                        "mtp.1.hnorm.weight=F32:16",
                        "mtp.1.enorm.weight=F32:16",
                        "mtp.1.proj.weight=F32:16x32",
                        "mtp.1.block.attn.qkv.weight=F32:48x16",
                        "mtp.1.block.mlp.proj.weight=F32:16x64"}) {
    cmd += std::string(" --expect ") + e;
  }
  auto check = testing::run_command(cmd);
  EXPECT_EQ(check.exit_code, 0) << check.output;
  // And it fails on a wrong expectation (the checker can fail).
  auto wrong = testing::run_command("/usr/bin/python3 tests/trainer/check_safetensors.py " + file +
                                    " --expect wte.weight=F32:16x64");
  EXPECT_NE(wrong.exit_code, 0) << wrong.output;
}

TEST_F(BadInput, PrepareTextTrainEvalAndSampleEndToEnd) {
  // The happy path of the other subcommands: byte-level shards from a text file, a few steps of a
  // byte-level model, eval of its checkpoint, and sampling from it.
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  write_text(dir_ + "/corpus.txt", text);
  const std::string data = dir_ + "/bytes";
  auto prep = run_gtron({"prepare", "--text", dir_ + "/corpus.txt", "--out", data});
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
  const std::string out = dir_ + "/bytes_run";
  const std::vector<std::string> sets = {"--set", "model.vocab_size=256",
                                         "--set", "data.train=" + data + "/train_*.bin",
                                         "--set", "data.val=" + data + "/val_*.bin",
                                         "--set", "mtp.depth=0"};
  std::vector<std::string> args = {"train", "--config", config_, "--out", out};
  args.insert(args.end(), sets.begin(), sets.end());
  auto train = run_gtron(args);
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const std::string ckpt = out + "/checkpoints/step_00000004";
  std::vector<std::string> eval_args = {"eval", "--config", config_, "--checkpoint", ckpt};
  eval_args.insert(eval_args.end(), sets.begin(), sets.end());
  auto eval = run_gtron(eval_args);
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find("\"val_main_loss\": "), std::string::npos) << eval.output;
  auto sample = run_gtron(
      {"sample", "--checkpoint", ckpt, "--prompt", "the quick", "--tokens", "7", "--seed", "3"});
  ASSERT_EQ(sample.exit_code, 0) << sample.output;
  EXPECT_EQ(sample.output.rfind("the quick", 0), 0u) << sample.output;
  // 9 prompt bytes + 7 new ones fill the context of 16 (sampling stops there, never truncates).
  EXPECT_GE(sample.output.size(), std::string("the quick").size() + 7) << sample.output;
  auto again = run_gtron(
      {"sample", "--checkpoint", ckpt, "--prompt", "the quick", "--tokens", "7", "--seed", "3"});
  EXPECT_NE(sample.output.find("{\"tokens\": 7, "), std::string::npos) << sample.output;
  EXPECT_EQ(sample_text_of(again.output), sample_text_of(sample.output))
      << "sampling with one seed is deterministic";
}

}  // namespace
}  // namespace gtron
