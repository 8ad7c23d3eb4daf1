// gtron export / import (transformers GPT-2 directories) and train --init, through the CLI:
// import(export(checkpoint)) gives model.safetensors back bit for bit (tied and untied, MTP D=0
// and D=2); the exported names and shapes are GPT-2's (checked by the independent stdlib reader);
// --init from the round-tripped checkpoint gives the first-step loss of --init from the original;
// bad directories are clear errors with exit code 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "tests/trainer/cli_util.h"
#include "trainer/io/safetensors.h"

namespace gtron {
namespace {

using testing::CmdResult;
using testing::expect_ok;
using testing::metrics_loss_values;
using testing::metrics_losses;
using testing::read_text;
using testing::run_command;
using testing::run_gtron;
using testing::run_launcher;
using testing::temp_dir;
using testing::train_checkpoint;
using testing::write_text;

// V = 100 pads to Vp = 128, so export cuts rows and import pads them back.
const char kConfig[] = R"({
  "model": {"vocab_size": 100, "context_length": 16, "n_layer": 2, "n_head": 2, "n_embd": 16},
  "data": {"synthetic": {"vocab": 100, "tokens": 20000, "val_tokens": 2000}},
  "train": {"steps": 2, "global_batch": 4, "micro_batch": 2, "seq_len": 16, "device": "cpu",
            "eval_batches": 1},
  "log": {"every": 1}
})";
constexpr int C = 16, V = 100, Tmax = 16;

bool exists(const std::string& path) { return std::ifstream(path).good(); }

void expect_user_error(const std::vector<std::string>& args, const std::string& needle) {
  const CmdResult r = run_gtron(args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in\n"
                                                      << r.output;
}

// GPT-2's names and shapes for kConfig, as "name=F32:AxB" for check_safetensors.py.
std::vector<std::string> gpt2_expectations(bool tied) {
  auto s = [](const std::string& n, const std::string& dims) { return n + "=F32:" + dims; };
  const std::string c = std::to_string(C);
  std::vector<std::string> e = {s("transformer.wte.weight", std::to_string(V) + "x" + c),
                                s("transformer.wpe.weight", std::to_string(Tmax) + "x" + c),
                                s("transformer.ln_f.weight", c), s("transformer.ln_f.bias", c)};
  for (int i = 0; i < 2; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    for (const char* ln : {"ln_1", "ln_2"}) {
      e.push_back(s(h + ln + ".weight", c));
      e.push_back(s(h + ln + ".bias", c));
    }
    e.push_back(s(h + "attn.c_attn.weight", c + "x" + std::to_string(3 * C)));
    e.push_back(s(h + "attn.c_attn.bias", std::to_string(3 * C)));
    e.push_back(s(h + "attn.c_proj.weight", c + "x" + c));
    e.push_back(s(h + "attn.c_proj.bias", c));
    e.push_back(s(h + "mlp.c_fc.weight", c + "x" + std::to_string(4 * C)));
    e.push_back(s(h + "mlp.c_fc.bias", std::to_string(4 * C)));
    e.push_back(s(h + "mlp.c_proj.weight", std::to_string(4 * C) + "x" + c));
    e.push_back(s(h + "mlp.c_proj.bias", c));
  }
  if (!tied) e.push_back(s("lm_head.weight", std::to_string(V) + "x" + c));
  return e;
}

// Runs the stdlib checker with every expectation; also checks that the file holds nothing else.
void check_gpt2_names(const std::string& file, bool tied) {
  const std::vector<std::string> want = gpt2_expectations(tied);
  std::string cmd = "/usr/bin/python3 tests/trainer/check_safetensors.py '" + file + "'";
  for (const std::string& e : want) cmd += " --expect " + e;
  const CmdResult r = run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  size_t tensors = 0;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("metadata ", 0) != 0 && !line.empty()) ++tensors;
  EXPECT_EQ(tensors, want.size()) << r.output;
  EXPECT_NE(r.output.find("metadata format=pt"), std::string::npos) << r.output;
}

struct Case {
  bool tied;
  int depth;
};

class RoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(RoundTrip, ImportOfExportIsBitExact) {
  const Case c = GetParam();
  const std::string dir =
      temp_dir("hf_roundtrip_" + std::to_string(c.tied) + std::to_string(c.depth));
  const std::string ckpt =
      train_checkpoint(kConfig, dir, "run",
                       {"model.tied_embeddings=" + std::string(c.tied ? "true" : "false"),
                        "mtp.depth=" + std::to_string(c.depth)},
                       2);
  write_text(ckpt + "/tokenizer.json", "{\"model\": {\"type\": \"BPE\"}}\n");  // rides along
  const std::string hf = dir + "/hf", back = dir + "/back";
  expect_ok({"export", "--checkpoint", ckpt, "--hf", hf});
  check_gpt2_names(hf + "/model.safetensors", c.tied);
  const std::string config = read_text(hf + "/config.json");
  EXPECT_NE(config.find("\"model_type\": \"gpt2\""), std::string::npos) << config;
  EXPECT_NE(config.find("\"activation_function\": \"gelu_new\""), std::string::npos) << config;
  EXPECT_NE(config.find("\"vocab_size\": 100"), std::string::npos) << config;
  EXPECT_NE(config.find(std::string("\"tie_word_embeddings\": ") + (c.tied ? "true" : "false")),
            std::string::npos)
      << config;
  EXPECT_EQ(exists(hf + "/mtp.safetensors"), c.depth > 0);
  if (c.depth > 0) {
    const SafetensorsFile mtp = read_safetensors(hf + "/mtp.safetensors");
    EXPECT_EQ(mtp.tensors.front().name, "mtp.1.hnorm.weight");
    EXPECT_EQ(mtp.tensors.back().name, "mtp.2.block.mlp.proj.bias");
  }
  EXPECT_EQ(read_text(hf + "/tokenizer.json"), read_text(ckpt + "/tokenizer.json"));

  expect_ok({"import", "--hf", hf, "--out", back});
  const std::string original = read_text(ckpt + "/model.safetensors");
  ASSERT_GT(original.size(), 1000u);
  EXPECT_TRUE(read_text(back + "/model.safetensors") == original) << "model.safetensors differs";
  EXPECT_EQ(read_text(back + "/tokenizer.json"), read_text(ckpt + "/tokenizer.json"));
  EXPECT_FALSE(exists(back + "/optimizer.safetensors"));
  EXPECT_TRUE(exists(back + "/MANIFEST.json"));

  // The logits of the two checkpoints agree bit for bit as well, and a second GPT-2 (numpy, over
  // the exported directory, read as transformers reads it) computes the same ones.
  const std::string row1 = "1,2,3,99,0,42,17,63,5,5,5,80,12,7,99,31", row2 = "5 6 7 8";
  expect_ok({"logits", "--checkpoint", ckpt, "--tokens", row1, "--out", dir + "/ref.safetensors"});
  const CmdResult ref = run_command("/usr/bin/python3 tests/trainer/gpt2_reference.py '" + hf +
                                    "' '" + dir + "/ref.safetensors'");
  EXPECT_EQ(ref.exit_code, 0) << ref.output;
  EXPECT_NE(ref.output.find("\"shape\": [1, 16, 100]"), std::string::npos) << ref.output;
  expect_ok({"logits", "--checkpoint", ckpt, "--tokens", "1,2,3,99", "--tokens", row2, "--out",
             dir + "/a.safetensors"});
  expect_ok({"logits", "--checkpoint", back, "--tokens", "1,2,3,99", "--tokens", row2, "--out",
             dir + "/b.safetensors"});
  const SafetensorsFile la = read_safetensors(dir + "/a.safetensors");
  const SafetensorsFile lb = read_safetensors(dir + "/b.safetensors");
  ASSERT_EQ(la.tensors.size(), 2u);
  EXPECT_EQ(la.tensors[1].name, "logits");
  EXPECT_EQ(la.tensors[1].tensor.shape(), Shape({2, 4, V}));
  EXPECT_EQ(la.tensors[1].tensor.to_vector(), lb.tensors[1].tensor.to_vector());
  EXPECT_EQ(la.tensors[0].tensor.to_vector(), std::vector<double>({1, 2, 3, 99, 5, 6, 7, 8}));
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, RoundTrip,
                         ::testing::Values(Case{true, 0}, Case{false, 2}, Case{false, 0},
                                           Case{true, 2}));

TEST(Init, RoundTrippedCheckpointGivesTheSameFirstStepLoss) {
  const std::string dir = temp_dir("hf_init");
  const std::string ckpt = train_checkpoint(kConfig, dir, "run", {"mtp.depth=2"}, 2);
  expect_ok({"export", "--checkpoint", ckpt, "--hf", dir + "/hf"});
  expect_ok({"import", "--hf", dir + "/hf", "--out", dir + "/back"});
  auto first_loss = [&](const std::string& out, const std::string& init) {
    std::vector<std::string> args = {"train",       "--config",      dir + "/c.json",
                                     "--out",       dir + "/" + out, "--set",
                                     "mtp.depth=2", "--set",         "train.seed=7"};
    if (!init.empty()) args.insert(args.end(), {"--init", init});
    const CmdResult r = run_gtron(args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (!init.empty()) {
      EXPECT_NE(r.output.find("initialized weights from"), std::string::npos) << r.output;
    }
    const std::vector<std::string> losses = metrics_losses(dir + "/" + out + "/metrics.jsonl");
    return losses.empty() ? std::string("none") : losses.front();
  };
  const std::string from_original = first_loss("a", ckpt);
  const std::string from_round_trip = first_loss("b", dir + "/back");
  const std::string fresh = first_loss("c", "");
  EXPECT_EQ(from_original, from_round_trip);
  EXPECT_NE(from_original, fresh) << "--init had no effect";
  EXPECT_NE(from_original, "none");

  // With --resume, --init applies only when there is nothing to resume.
  const CmdResult again =
      run_gtron({"train", "--config", dir + "/c.json", "--out", dir + "/a", "--set", "mtp.depth=2",
                 "--set", "train.seed=7", "--set", "train.steps=3", "--resume", "--init", ckpt});
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("resumed from"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("initialized weights"), std::string::npos) << again.output;

  // Two GTP ranks shard the imported weights as they shard their own: the same first step.
  const CmdResult r = run_launcher(
      {"--nproc-per-node", "2"},
      {"train", "--config", dir + "/c.json", "--out", dir + "/gtp", "--set", "mtp.depth=2", "--set",
       "train.seed=7", "--set", "parallel.gtp=2", "--init", dir + "/back"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> gtp = metrics_loss_values(dir + "/gtp/metrics.jsonl");
  ASSERT_FALSE(gtp.empty());
  EXPECT_NEAR(gtp.front(), std::stod(from_original), 1e-5 * std::stod(from_original));
}

// Rewrites a safetensors file through `edit` (name -> tensor; erase, replace or add).
void rewrite(const std::string& path, const std::function<void(std::vector<NamedTensor>&)>& edit) {
  SafetensorsFile f = read_safetensors(path);
  edit(f.tensors);
  write_safetensors(path, f.tensors, f.metadata);
}

class ImportErrors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(temp_dir("hf_errors"));
    ckpt_ = new std::string(train_checkpoint(kConfig, *dir_, "run", {"mtp.depth=2"}, 2));
    const CmdResult r = run_gtron({"export", "--checkpoint", *ckpt_, "--hf", *dir_ + "/hf"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  // A fresh copy of the export to spoil.
  std::string copy(const std::string& name) {
    const std::string to = *dir_ + "/" + name;
    run_command("rm -rf '" + to + "' && cp -r '" + *dir_ + "/hf' '" + to + "'");
    return to;
  }
  void expect_import_error(const std::string& hf, const std::string& needle,
                           std::vector<std::string> extra = {}) {
    const std::string out = hf + "_ckpt";
    std::vector<std::string> args = {"import", "--hf", hf, "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    expect_user_error(args, needle);
    EXPECT_FALSE(exists(out + "/MANIFEST.json")) << "an import that failed wrote " << out;
  }
  static std::string* dir_;
  static std::string* ckpt_;
};
std::string* ImportErrors::dir_ = nullptr;
std::string* ImportErrors::ckpt_ = nullptr;

TEST_F(ImportErrors, WrongArchitectureNamesTheField) {
  const std::vector<std::pair<std::string, std::string>> edits = {
      {"\"model_type\": \"gpt2\"", "\"model_type\": \"mistral\""},
      {"\"activation_function\": \"gelu_new\"", "\"activation_function\": \"relu\""},
      {"\"layer_norm_epsilon\": 1e-05", "\"layer_norm_epsilon\": 1e-06"},
      {"\"n_inner\": null", "\"n_inner\": 20"},
      {"\"scale_attn_by_inverse_layer_idx\": false", "\"scale_attn_by_inverse_layer_idx\": true"},
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    const std::string hf = copy("arch" + std::to_string(i));
    std::string config = read_text(hf + "/config.json");
    const size_t at = config.find(edits[i].first);
    ASSERT_NE(at, std::string::npos) << edits[i].first;
    config.replace(at, edits[i].first.size(), edits[i].second);
    write_text(hf + "/config.json", config);
    const std::string field = edits[i].first.substr(1, edits[i].first.find('"', 1) - 1);
    expect_import_error(hf, "field '" + field + "'");
  }
}

TEST_F(ImportErrors, MissingExtraAndMisShapedTensors) {
  std::string hf = copy("missing");
  rewrite(hf + "/model.safetensors", [](std::vector<NamedTensor>& t) {
    t.erase(std::find_if(t.begin(), t.end(), [](const NamedTensor& n) {
      return n.name == "transformer.h.1.ln_1.bias";
    }));
  });
  expect_import_error(hf, "no tensor 'h.1.ln_1.bias'");

  hf = copy("shape");
  rewrite(hf + "/model.safetensors", [](std::vector<NamedTensor>& t) {
    for (NamedTensor& n : t)  // gtron's own [out, in] layout where GPT-2 wants [in, out]
      if (n.name == "transformer.h.0.attn.c_attn.weight")
        n.tensor = Tensor::zeros({3 * C, C}, DType::kF32);
  });
  expect_import_error(hf,
                      "tensor 'h.0.attn.c_attn.weight' is [48, 16] f32, the model expects "
                      "[16, 48] f32");

  hf = copy("extra");
  rewrite(hf + "/model.safetensors", [](std::vector<NamedTensor>& t) {
    t.push_back({"transformer.h.0.attn.q_norm.weight", Tensor::zeros({C}, DType::kF32)});
  });
  expect_import_error(hf, "'h.0.attn.q_norm.weight' [16], which a GPT-2");

  hf = copy("untied_head_missing");  // config says untied, the file has no lm_head
  std::string config = read_text(hf + "/config.json");
  const std::string tied = "\"tie_word_embeddings\": true";
  ASSERT_NE(config.find(tied), std::string::npos) << config;
  config.replace(config.find(tied), tied.size(), "\"tie_word_embeddings\": false");
  write_text(hf + "/config.json", config);
  expect_import_error(hf, "no tensor 'lm_head.weight'");

  // Depths in mtp.safetensors that the config does not ask for are refused, not dropped.
  expect_import_error(copy("depth"), "has tensor 'mtp.2.", {"--set", "mtp.depth=1"});
}

TEST_F(ImportErrors, CorruptFilesAndExistingOutputs) {
  std::string hf = copy("truncated");
  const std::string bytes = read_text(hf + "/model.safetensors");
  write_text(hf + "/model.safetensors", bytes.substr(0, bytes.size() - 64));
  expect_import_error(hf, "model.safetensors");

  hf = copy("flipped");
  std::string flipped = bytes;
  flipped[flipped.size() - 10] ^= 0x40;
  write_text(hf + "/model.safetensors", flipped);
  expect_import_error(hf, "CRC mismatch");

  hf = copy("bad_json");
  write_text(hf + "/config.json", "{\"model_type\": \"gpt2\", ");
  expect_import_error(hf, "config.json' is not valid JSON");

  hf = copy("no_weights");
  run_command("rm '" + hf + "/model.safetensors'");
  expect_import_error(hf, "has no model.safetensors");

  expect_user_error({"import", "--hf", *dir_ + "/hf", "--out", *ckpt_}, "already exists");
  expect_user_error({"export", "--checkpoint", *ckpt_, "--hf", *dir_ + "/hf"}, "already exists");
  // A corrupt checkpoint is not exported.
  const std::string bad = *dir_ + "/bad_ckpt";
  run_command("rm -rf '" + bad + "' && cp -r '" + *ckpt_ + "' '" + bad + "'");
  write_text(bad + "/model.safetensors", "garbage");
  expect_user_error({"export", "--checkpoint", bad, "--hf", *dir_ + "/hf_bad"}, "corrupt");
  EXPECT_FALSE(exists(*dir_ + "/hf_bad/config.json"));
}

TEST_F(ImportErrors, OpenAiNamesAndMaskBuffersImportAsWell) {
  // The Hub's original GPT-2 files have no "transformer." prefix and carry the causal-mask
  // buffers; without gtron.json and mtp.safetensors, the MTP depths start fresh.
  const std::string hf = copy("openai");
  run_command("rm '" + hf + "/gtron.json' '" + hf + "/mtp.safetensors'");
  rewrite(hf + "/model.safetensors", [](std::vector<NamedTensor>& t) {
    for (NamedTensor& n : t)
      if (n.name.rfind("transformer.", 0) == 0) n.name = n.name.substr(12);
    t.push_back({"h.0.attn.bias", Tensor::zeros({1, 1, Tmax, Tmax}, DType::kF32)});
    t.push_back({"h.0.attn.masked_bias", Tensor::zeros(Shape{}, DType::kF32)});
  });
  const std::string out = hf + "_ckpt";
  const CmdResult r = run_gtron(
      {"import", "--hf", hf, "--out", out, "--config", *dir_ + "/c.json", "--set", "mtp.depth=1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("MTP D=1"), std::string::npos) << r.output;
  std::map<std::string, Tensor> original;
  for (NamedTensor& n : read_safetensors(*ckpt_ + "/model.safetensors").tensors)
    original[n.name] = n.tensor;
  int compared = 0;
  for (const NamedTensor& n : read_safetensors(out + "/model.safetensors").tensors) {
    if (n.name.rfind("mtp.", 0) == 0) continue;
    ASSERT_EQ(original.count(n.name), 1u) << n.name;
    EXPECT_EQ(n.tensor.to_vector(), original[n.name].to_vector()) << n.name;
    ++compared;
  }
  EXPECT_EQ(compared, 4 + 2 * 12);
}

TEST_F(ImportErrors, InitChecksShapesAndNames) {
  const std::string c = *dir_ + "/c.json";
  expect_user_error({"train", "--config", c, "--out", *dir_ + "/i1", "--init", *ckpt_, "--set",
                     "model.n_embd=32", "--set", "mtp.depth=2"},
                    "model.n_embd: checkpoint 16, config 32");
  // The checkpoint's config names the key that differs before any tensor is read.
  expect_user_error({"train", "--config", c, "--out", *dir_ + "/i2", "--init", *ckpt_},
                    "mtp.depth: checkpoint 2, config 0");
  expect_user_error({"train", "--config", c, "--out", *dir_ + "/i3", "--init", *dir_ + "/hf"},
                    "MANIFEST.json");
  EXPECT_FALSE(exists(*dir_ + "/i1/metrics.jsonl"));
  EXPECT_FALSE(exists(*dir_ + "/i1"));  // nothing created (Note [preflight])
}

TEST_F(ImportErrors, LogitsRejectsBadTokens) {
  const std::string out = *dir_ + "/l.safetensors";
  expect_user_error({"logits", "--checkpoint", *ckpt_, "--tokens", "1,100", "--out", out},
                    "'100' is not a token id in [0, 100)");
  expect_user_error(
      {"logits", "--checkpoint", *ckpt_, "--tokens", "1,2", "--tokens", "3", "--out", out},
      "same length");
  EXPECT_FALSE(exists(out));
}

}  // namespace
}  // namespace gtron
