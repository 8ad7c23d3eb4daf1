// gtron export / import of the llama family (transformers LlamaForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM; Note [llama names]) through the CLI: import(export(checkpoint)) gives
// model.safetensors back byte for byte (tied and untied, MTP D=0 and D=2, Qwen3's q/k norms with
// head_dim != C / NH, Qwen2's q/k/v biases with llama3 RoPE scaling); config.json and the tensor
// names and shapes are transformers'; train --init accepts the import; malformed directories exit
// 2 naming the problem and leave no output directory.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/trainer/cli_util.h"
#include "trainer/io/safetensors.h"

namespace gtron {
namespace {

using json = nlohmann::json;
using testing::CmdResult;
using testing::expect_ok;
using testing::read_text;
using testing::run_command;
using testing::run_gtron;
using testing::temp_dir;
using testing::train_checkpoint;
using testing::write_text;

// V = 100 pads to Vp = 128. NH = 4, NKV = 2, F = 24, C = 16; head_dim is set per case.
const char kConfig[] = R"({
  "model": {"arch": "llama", "vocab_size": 100, "context_length": 16, "n_layer": 2, "n_head": 4,
            "n_kv_head": 2, "intermediate_size": 24, "n_embd": 16},
  "data": {"synthetic": {"vocab": 100, "tokens": 20000, "val_tokens": 2000}},
  "train": {"steps": 2, "global_batch": 4, "micro_batch": 2, "seq_len": 16, "device": "cpu",
            "eval_batches": 1},
  "log": {"every": 1}
})";
constexpr int64_t C = 16, V = 100, NH = 4, NKV = 2, F = 24, L = 2;

struct Case {
  const char* style;  // "llama", "qwen2" (q/k/v biases, llama3 RoPE scaling), "qwen3" (q/k norms)
  bool tied;
  int depth;
  int64_t HS;
};

std::vector<std::string> case_sets(const Case& c) {
  std::vector<std::string> s = {"model.tied_embeddings=" + std::string(c.tied ? "true" : "false"),
                                "mtp.depth=" + std::to_string(c.depth),
                                "model.head_dim=" + std::to_string(c.HS)};
  if (std::string(c.style) == "qwen3") s.push_back("model.qk_norm=true");
  if (std::string(c.style) == "qwen2") {
    s.insert(s.end(), {"model.qkv_bias=true", "model.rope_scaling.type=llama3",
                       "model.rope_scaling.original_max_position_embeddings=8"});
  }
  return s;
}

// The names and shapes transformers expects of model.safetensors, in the file's order.
std::vector<std::pair<std::string, Shape>> expected_tensors(const Case& c) {
  const std::string style = c.style;
  std::vector<std::pair<std::string, Shape>> e = {{"model.embed_tokens.weight", {V, C}}};
  for (int i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    e.push_back({p + "input_layernorm.weight", {C}});
    e.push_back({p + "self_attn.q_proj.weight", {NH * c.HS, C}});
    e.push_back({p + "self_attn.k_proj.weight", {NKV * c.HS, C}});
    e.push_back({p + "self_attn.v_proj.weight", {NKV * c.HS, C}});
    if (style == "qwen2") {
      e.push_back({p + "self_attn.q_proj.bias", {NH * c.HS}});
      e.push_back({p + "self_attn.k_proj.bias", {NKV * c.HS}});
      e.push_back({p + "self_attn.v_proj.bias", {NKV * c.HS}});
    }
    if (style == "qwen3") {
      e.push_back({p + "self_attn.q_norm.weight", {c.HS}});
      e.push_back({p + "self_attn.k_norm.weight", {c.HS}});
    }
    e.push_back({p + "self_attn.o_proj.weight", {C, NH * c.HS}});
    e.push_back({p + "post_attention_layernorm.weight", {C}});
    e.push_back({p + "mlp.gate_proj.weight", {F, C}});
    e.push_back({p + "mlp.up_proj.weight", {F, C}});
    e.push_back({p + "mlp.down_proj.weight", {C, F}});
  }
  e.push_back({"model.norm.weight", {C}});
  if (!c.tied) e.push_back({"lm_head.weight", {V, C}});
  return e;
}

class LlamaRoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaRoundTrip, ImportOfExportIsByteIdentical) {
  const Case c = GetParam();
  const std::string dir = temp_dir(std::string("hf_llama_") + c.style + std::to_string(c.tied) +
                                   std::to_string(c.depth));
  const std::string ckpt = train_checkpoint(kConfig, dir, "run", case_sets(c), 2);
  const std::string hf = dir + "/hf", back = dir + "/back";
  expect_ok({"export", "--checkpoint", ckpt, "--hf", hf});

  const SafetensorsFile file = read_safetensors(hf + "/model.safetensors");
  const std::vector<std::pair<std::string, Shape>> want = expected_tensors(c);
  ASSERT_EQ(file.tensors.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(file.tensors[i].name, want[i].first);
    EXPECT_EQ(file.tensors[i].tensor.shape(), want[i].second) << want[i].first;
    EXPECT_EQ(file.tensors[i].tensor.dtype(), DType::kF32) << want[i].first;
  }
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_EQ(std::filesystem::exists(hf + "/mtp.safetensors"), c.depth > 0);
  EXPECT_TRUE(std::filesystem::exists(hf + "/gtron.json"));

  const json cfg = json::parse(read_text(hf + "/config.json"));
  const std::string style = c.style;
  const std::string cls = style == "qwen3"   ? "Qwen3ForCausalLM"
                          : style == "qwen2" ? "Qwen2ForCausalLM"
                                             : "LlamaForCausalLM";
  EXPECT_EQ(cfg["model_type"], style);
  EXPECT_EQ(cfg["architectures"], json::array({cls}));
  EXPECT_EQ(cfg["hidden_size"], C);
  EXPECT_EQ(cfg["intermediate_size"], F);
  EXPECT_EQ(cfg["num_hidden_layers"], L);
  EXPECT_EQ(cfg["num_attention_heads"], NH);
  EXPECT_EQ(cfg["num_key_value_heads"], NKV);
  EXPECT_EQ(cfg["head_dim"], c.HS);
  EXPECT_EQ(cfg["rms_norm_eps"], 1e-5);
  EXPECT_EQ(cfg["rope_theta"], 500000.0);
  EXPECT_EQ(cfg["max_position_embeddings"], 16);
  EXPECT_EQ(cfg["vocab_size"], V);
  EXPECT_EQ(cfg["tie_word_embeddings"], c.tied);
  EXPECT_EQ(cfg["attention_bias"], style == "qwen2");
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  if (style == "qwen2") {
    EXPECT_EQ(cfg["rope_scaling"], json::parse(R"({"rope_type": "llama3", "factor": 8.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8})"));
  } else {
    EXPECT_TRUE(cfg["rope_scaling"].is_null());
  }

  expect_ok({"import", "--hf", hf, "--out", back});
  const std::string original = read_text(ckpt + "/model.safetensors");
  ASSERT_GT(original.size(), 1000u);
  EXPECT_TRUE(read_text(back + "/model.safetensors") == original) << "model.safetensors differs";
  EXPECT_FALSE(std::filesystem::exists(back + "/optimizer.safetensors"));

  // train --init accepts the import.
  std::vector<std::string> args = {"train", "--config",    dir + "/c.json",
                                   "--out", dir + "/init", "--init",
                                   back,    "--set",       "train.steps=1"};
  for (const std::string& s : case_sets(c)) args.insert(args.end(), {"--set", s});
  const CmdResult r = run_gtron(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Styles, LlamaRoundTrip,
                         ::testing::Values(Case{"llama", false, 0, 4}, Case{"llama", true, 2, 4},
                                           Case{"qwen3", false, 2, 6}, Case{"qwen3", true, 0, 6},
                                           Case{"qwen2", true, 0, 4}));

// Rewrites a safetensors file through `edit` (erase, replace or add tensors).
void rewrite(const std::string& path, const std::function<void(std::vector<NamedTensor>&)>& edit) {
  SafetensorsFile f = read_safetensors(path);
  edit(f.tensors);
  write_safetensors(path, f.tensors, f.metadata);
}

class LlamaImportErrors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(temp_dir("hf_llama_errors"));
    const std::string ckpt = train_checkpoint(kConfig, *dir_, "run", {"model.head_dim=6"}, 2);
    const CmdResult r = run_gtron({"export", "--checkpoint", ckpt, "--hf", *dir_ + "/hf"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  // A fresh copy of the export to spoil.
  std::string copy(const std::string& name) {
    const std::string to = *dir_ + "/" + name;
    run_command("rm -rf '" + to + "' && cp -r '" + *dir_ + "/hf' '" + to + "'");
    return to;
  }
  // A copy whose config.json has `field` set to the JSON `value` (null erases it).
  std::string with_field(const std::string& name, const std::string& field,
                         const std::string& value) {
    const std::string hf = copy(name);
    json cfg = json::parse(read_text(hf + "/config.json"));
    const json v = json::parse(value);
    if (v.is_null()) {
      cfg.erase(field);
    } else {
      cfg[field] = v;
    }
    write_text(hf + "/config.json", cfg.dump(2));
    return hf;
  }
  void expect_import_error(const std::string& hf, const std::string& needle) {
    const std::string out = hf + "_ckpt";
    const CmdResult r = run_gtron({"import", "--hf", hf, "--out", out});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in\n"
                                                        << r.output;
    EXPECT_FALSE(std::filesystem::exists(out)) << "an import that failed left " << out;
  }
  static std::string* dir_;
};
std::string* LlamaImportErrors::dir_ = nullptr;

TEST_F(LlamaImportErrors, ConfigFieldsAreNamed) {
  expect_import_error(with_field("type", "model_type", R"("mistral")"),
                      "field 'model_type' is \"mistral\"");
  expect_import_error(with_field("heads", "num_key_value_heads", "3"),
                      "field 'num_key_value_heads' is 3, gtron's llama family needs a divisor of "
                      "num_attention_heads = 4");
  expect_import_error(with_field("hidden", "hidden_size", "null"),
                      "field 'hidden_size' is missing");
  expect_import_error(with_field("window", "use_sliding_window", "true"),
                      "field 'use_sliding_window' is true");
  expect_import_error(with_field("yarn", "rope_scaling", R"({"rope_type": "yarn", "factor": 4})"),
                      "field 'rope_scaling.rope_type' is \"yarn\"");
  expect_import_error(with_field("nofactor", "rope_scaling",
                                 R"({"type": "llama3", "low_freq_factor": 1, "high_freq_factor": 4,
                     "original_max_position_embeddings": 8})"),
                      "field 'rope_scaling.factor' is missing");
  expect_import_error(with_field("badomax", "rope_scaling",
                                 R"({"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
                     "high_freq_factor": 4, "original_max_position_embeddings": 0})"),
                      "field 'rope_scaling.original_max_position_embeddings' is 0");
}

TEST_F(LlamaImportErrors, LegacyRopeScalingTypeKeyImports) {
  const std::string hf =
      with_field("legacy", "rope_scaling",
                 R"({"type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
                     "original_max_position_embeddings": 8})");
  const CmdResult r = run_gtron({"import", "--hf", hf, "--out", hf + "_ckpt"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json state = json::parse(read_text(hf + "_ckpt/trainer_state.json"));
  const std::string config = state.dump();
  EXPECT_NE(config.find("llama3"), std::string::npos) << config;
}

TEST_F(LlamaImportErrors, MissingExtraAndMisShapedTensors) {
  std::string hf = copy("missing");
  rewrite(hf + "/model.safetensors", [](std::vector<NamedTensor>& t) {
    t.erase(std::find_if(t.begin(), t.end(), [](const NamedTensor& n) {
      return n.name == "model.layers.1.mlp.up_proj.weight";
    }));
  });
  expect_import_error(hf, "no tensor 'model.layers.1.mlp.up_proj.weight'");

  hf = copy("shape");  // k_proj with the query heads' rows
  rewrite(hf + "/model.safetensors", [](std::vector<NamedTensor>& t) {
    for (NamedTensor& n : t)
      if (n.name == "model.layers.0.self_attn.k_proj.weight")
        n.tensor = Tensor::zeros({NH * 6, C}, DType::kF32);
  });
  expect_import_error(hf,
                      "tensor 'model.layers.0.self_attn.k_proj.weight' is [24, 16] f32, the model "
                      "expects [12, 16] f32");

  hf = copy("extra");  // Llama's attention_bias puts a bias on o_proj too; gtron has none
  rewrite(hf + "/model.safetensors", [](std::vector<NamedTensor>& t) {
    t.push_back({"model.layers.0.self_attn.o_proj.bias", Tensor::zeros({C}, DType::kF32)});
  });
  expect_import_error(hf,
                      "has tensor 'model.layers.0.self_attn.o_proj.bias' [16], which a "
                      "llama-family model");
}

}  // namespace
}  // namespace gtron
