// gtron export / import of Qwen3-MoE (transformers Qwen3MoeForCausalLM; Note [Qwen3-MoE mapping]
// in trainer/hf_qwen3_moe.h) through the CLI:
// (a) import(export(checkpoint)) gives model.safetensors back byte for byte and the same logits
//     bit for bit (a dense first layer and an untied head with norm_topk_prob false; every layer
//     sparse, tied, MTP D=1, norm_topk_prob true); config.json, tensor names and shapes are
//     transformers';
// (b) a Qwen3-MoE directory written by this test (its own name mapping, a hand-written
//     config.json; per-expert tensors with mlp_only_layers, and transformers 5's fused expert
//     tensors with decoder_sparse_step) imports to the tensors of the gtron model it was written
//     from, bit for bit, and to its logits; those logits also agree with the numpy reference
//     (tests/trainer/llama_reference.py) within 1e-5;
// (c) configs and files gtron cannot represent exit 2 naming the field or tensor, leaving nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "tests/trainer/cli_util.h"
#include "trainer/io/safetensors.h"

namespace gtron {
namespace {

using json = nlohmann::ordered_json;
using testing::CmdResult;
using testing::expect_ok;
using testing::read_text;
using testing::run_command;
using testing::run_gtron;
using testing::temp_dir;
using testing::train_checkpoint;
using testing::write_text;

// V = 100 pads to 128; NH = 4, NKV = 2, HS = 6, C = 16, dense F = 24, E = 4 experts of Fe = 6
// (2·Fe != C, so a transposed fused tensor cannot pass for the right one), top 2.
const char kConfig[] = R"({
  "model": {"arch": "llama", "vocab_size": 100, "context_length": 16, "n_layer": 2, "n_head": 4,
            "n_kv_head": 2, "head_dim": 6, "intermediate_size": 24, "n_embd": 16,
            "qk_norm": true, "init_std": 0.2,
            "moe": {"num_experts": 4, "top_k": 2, "expert_intermediate_size": 6}},
  "data": {"synthetic": {"vocab": 100, "tokens": 20000, "val_tokens": 2000}},
  "train": {"steps": 2, "global_batch": 4, "micro_batch": 2, "seq_len": 16, "device": "cpu",
            "eval_batches": 1},
  "log": {"every": 1}
})";
constexpr int64_t V = 100, C = 16, NH = 4, NKV = 2, HS = 6, F = 24, E = 4, Fe = 6, L = 2;
const std::vector<std::string> kTokens = {"--tokens", "1,2,3,31,0,7,7,7,20,9,4,4,12,30,2,5",
                                          "--tokens", "8,6,7,5,3,0,9,1,1,2,2,3,3,4,4,5"};

struct Case {
  int first_dense;
  bool norm_topk;
  bool tied;
  int depth;
};

std::vector<std::string> case_sets(const Case& c) {
  return {"model.moe.first_dense_layers=" + std::to_string(c.first_dense),
          "model.moe.norm_topk_prob=" + std::string(c.norm_topk ? "true" : "false"),
          "model.tied_embeddings=" + std::string(c.tied ? "true" : "false"),
          "mtp.depth=" + std::to_string(c.depth)};
}

// The model.safetensors transformers' Qwen3MoeForCausalLM holds, in export's order.
std::vector<std::pair<std::string, Shape>> expected_tensors(const Case& c) {
  std::vector<std::pair<std::string, Shape>> e = {{"model.embed_tokens.weight", {V, C}}};
  for (int i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    e.insert(e.end(), {{p + "input_layernorm.weight", {C}},
                       {p + "self_attn.q_proj.weight", {NH * HS, C}},
                       {p + "self_attn.k_proj.weight", {NKV * HS, C}},
                       {p + "self_attn.v_proj.weight", {NKV * HS, C}},
                       {p + "self_attn.q_norm.weight", {HS}},
                       {p + "self_attn.k_norm.weight", {HS}},
                       {p + "self_attn.o_proj.weight", {C, NH * HS}},
                       {p + "post_attention_layernorm.weight", {C}}});
    if (i < c.first_dense) {
      e.insert(e.end(), {{p + "mlp.gate_proj.weight", {F, C}},
                         {p + "mlp.up_proj.weight", {F, C}},
                         {p + "mlp.down_proj.weight", {C, F}}});
      continue;
    }
    e.push_back({p + "mlp.gate.weight", {E, C}});
    for (int x = 0; x < E; ++x) {
      const std::string ex = p + "mlp.experts." + std::to_string(x) + ".";
      e.insert(e.end(), {{ex + "gate_proj.weight", {Fe, C}},
                         {ex + "up_proj.weight", {Fe, C}},
                         {ex + "down_proj.weight", {C, Fe}}});
    }
  }
  e.push_back({"model.norm.weight", {C}});
  if (!c.tied) e.push_back({"lm_head.weight", {V, C}});
  return e;
}

// `gtron logits` of a checkpoint over kTokens, as floats.
std::vector<double> logits_of(const std::string& ckpt, const std::string& out) {
  std::vector<std::string> args = {"logits", "--checkpoint", ckpt, "--out", out};
  args.insert(args.end(), kTokens.begin(), kTokens.end());
  expect_ok(args);
  return read_safetensors(out).tensors.at(1).tensor.to_vector();
}

std::map<std::string, Tensor> tensors_by_name(const std::string& file) {
  std::map<std::string, Tensor> out;
  for (NamedTensor& nt : read_safetensors(file).tensors) out.emplace(nt.name, nt.tensor);
  return out;
}

class Qwen3MoeRoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(Qwen3MoeRoundTrip, ImportOfExportIsByteIdenticalWithTheSameLogits) {
  const Case c = GetParam();
  const std::string dir = temp_dir("hf_qwen3_moe_" + std::to_string(c.first_dense));
  const std::string ckpt = train_checkpoint(kConfig, dir, "run", case_sets(c), 2);
  const std::string hf = dir + "/hf", back = dir + "/back";
  expect_ok({"export", "--checkpoint", ckpt, "--hf", hf});

  const SafetensorsFile file = read_safetensors(hf + "/model.safetensors");
  const std::vector<std::pair<std::string, Shape>> want = expected_tensors(c);
  ASSERT_EQ(file.tensors.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(file.tensors[i].name, want[i].first);
    EXPECT_EQ(file.tensors[i].tensor.shape(), want[i].second) << want[i].first;
  }
  EXPECT_EQ(std::filesystem::exists(hf + "/mtp.safetensors"), c.depth > 0);

  const json cfg = json::parse(read_text(hf + "/config.json"));
  EXPECT_EQ(cfg["model_type"], "qwen3_moe");
  EXPECT_EQ(cfg["architectures"], json::array({"Qwen3MoeForCausalLM"}));
  EXPECT_EQ(cfg["num_experts"], E);
  EXPECT_EQ(cfg["num_experts_per_tok"], 2);
  EXPECT_EQ(cfg["moe_intermediate_size"], Fe);
  EXPECT_EQ(cfg["intermediate_size"], F);
  EXPECT_EQ(cfg["norm_topk_prob"], c.norm_topk);
  EXPECT_EQ(cfg["decoder_sparse_step"], 1);
  EXPECT_EQ(cfg["mlp_only_layers"], c.first_dense == 1 ? json::array({0}) : json::array());
  EXPECT_EQ(cfg["head_dim"], HS);
  EXPECT_EQ(cfg["tie_word_embeddings"], c.tied);
  EXPECT_EQ(cfg["attention_bias"], false);
  EXPECT_FALSE(cfg.contains("mlp_bias"));

  expect_ok({"import", "--hf", hf, "--out", back});
  const std::string original = read_text(ckpt + "/model.safetensors");
  ASSERT_GT(original.size(), 10000u);
  EXPECT_TRUE(read_text(back + "/model.safetensors") == original) << "model.safetensors differs";
  const json state = json::parse(read_text(back + "/trainer_state.json"));
  EXPECT_EQ(state["config"]["model"]["moe"]["first_dense_layers"], c.first_dense);
  EXPECT_EQ(state["config"]["model"]["moe"]["norm_topk_prob"], c.norm_topk);

  const std::vector<double> a = logits_of(ckpt, dir + "/a.safetensors");
  const std::vector<double> b = logits_of(back, dir + "/b.safetensors");
  ASSERT_EQ(a.size(), 2u * 16 * V);
  EXPECT_EQ(a, b) << "the imported checkpoint's logits differ";
}

INSTANTIATE_TEST_SUITE_P(Shapes, Qwen3MoeRoundTrip,
                         ::testing::Values(Case{1, false, false, 0}, Case{0, true, true, 1}));

// A Qwen3-MoE directory as transformers would save one, written by this test from a gtron
// checkpoint (first_dense_layers 1, untied, MTP 0) with its own mapping of the names.
class Qwen3MoeHandWritten : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(temp_dir("hf_qwen3_moe_hand"));
    ckpt_ = new std::string(
        train_checkpoint(kConfig, *dir_, "run", case_sets({1, false, false, 0}), 2));
  }

  // Writes DIR (config.json from the checkpoint's resolved model keys plus `moe_fields`, and
  // model.safetensors, experts per expert or fused).
  static std::string write_hf(const std::string& name, const json& moe_fields, bool fused) {
    const std::string hf = *dir_ + "/" + name;
    std::filesystem::create_directories(hf);
    const json m = json::parse(read_text(*ckpt_ + "/trainer_state.json"))["config"]["model"];
    json cfg = {{"architectures", {"Qwen3MoeForCausalLM"}},
                {"model_type", "qwen3_moe"},
                {"vocab_size", V},
                {"hidden_size", C},
                {"intermediate_size", F},
                {"num_hidden_layers", L},
                {"num_attention_heads", NH},
                {"num_key_value_heads", NKV},
                {"head_dim", HS},
                {"hidden_act", "silu"},
                {"max_position_embeddings", 16},
                {"rms_norm_eps", m["rms_norm_eps"]},
                {"rope_theta", m["rope_theta"]},
                {"rope_scaling", nullptr},
                {"tie_word_embeddings", false},
                {"attention_bias", false},
                {"attention_dropout", 0.0},
                {"use_sliding_window", false},
                {"sliding_window", nullptr},
                {"max_window_layers", L},
                {"num_experts", E},
                {"num_experts_per_tok", 2},
                {"moe_intermediate_size", Fe},
                {"norm_topk_prob", false},
                {"output_router_logits", false},
                {"router_aux_loss_coef", 0.001},
                {"torch_dtype", "float32"},
                {"transformers_version", "4.51.0"}};
    for (const auto& [k, v] : moe_fields.items()) cfg[k] = v;
    write_text(hf + "/config.json", cfg.dump(2));

    std::map<std::string, Tensor> g = tensors_by_name(*ckpt_ + "/model.safetensors");
    std::map<std::string, Tensor> out;  // sorted by name, unlike gtron's order
    out["model.embed_tokens.weight"] = g.at("wte.weight").rows(0, V);
    out["lm_head.weight"] = g.at("lm_head.weight").rows(0, V);
    out["model.norm.weight"] = g.at("norm_f.weight");
    for (int i = 0; i < L; ++i) {
      const std::string b = "blocks." + std::to_string(i) + ".";
      const std::string p = "model.layers." + std::to_string(i) + ".";
      const Tensor& qkv = g.at(b + "attn.qkv.weight");
      out[p + "self_attn.q_proj.weight"] = qkv.rows(0, NH * HS);
      out[p + "self_attn.k_proj.weight"] = qkv.rows(NH * HS, (NH + NKV) * HS);
      out[p + "self_attn.v_proj.weight"] = qkv.rows((NH + NKV) * HS, (NH + 2 * NKV) * HS);
      out[p + "self_attn.q_norm.weight"] = g.at(b + "attn.q_norm.weight");
      out[p + "self_attn.k_norm.weight"] = g.at(b + "attn.k_norm.weight");
      out[p + "self_attn.o_proj.weight"] = g.at(b + "attn.proj.weight");
      out[p + "input_layernorm.weight"] = g.at(b + "attn_norm.weight");
      out[p + "post_attention_layernorm.weight"] = g.at(b + "mlp_norm.weight");
      if (i == 0) {
        out[p + "mlp.gate_proj.weight"] = g.at(b + "mlp.gate_up.weight").rows(0, F);
        out[p + "mlp.up_proj.weight"] = g.at(b + "mlp.gate_up.weight").rows(F, 2 * F);
        out[p + "mlp.down_proj.weight"] = g.at(b + "mlp.down.weight");
        continue;
      }
      out[p + "mlp.gate.weight"] = g.at(b + "mlp.router.weight");
      std::vector<double> gate_up, down;  // the fused [E, 2Fe, C] and [E, C, Fe]
      for (int x = 0; x < E; ++x) {
        const std::string ge = b + "mlp.experts." + std::to_string(x) + ".";
        const std::string he = p + "mlp.experts." + std::to_string(x) + ".";
        const Tensor& gu = g.at(ge + "gate_up.weight");
        const Tensor& dn = g.at(ge + "down.weight");
        if (!fused) {
          out[he + "gate_proj.weight"] = gu.rows(0, Fe);
          out[he + "up_proj.weight"] = gu.rows(Fe, 2 * Fe);
          out[he + "down_proj.weight"] = dn;
        }
        for (double v : gu.to_vector()) gate_up.push_back(v);
        for (double v : dn.to_vector()) down.push_back(v);
      }
      if (fused) {
        out[p + "mlp.experts.gate_up_proj"] =
            Tensor::from_vector(gate_up, {E, 2 * Fe, C}, DType::kF32);
        out[p + "mlp.experts.down_proj"] = Tensor::from_vector(down, {E, C, Fe}, DType::kF32);
      }
    }
    std::vector<NamedTensor> list;
    for (auto& [n, t] : out) list.push_back({n, t.clone()});
    write_safetensors(hf + "/model.safetensors", list, {{"format", "pt"}});
    return hf;
  }

  static void expect_import_error(const std::string& hf, const std::string& needle) {
    const std::string out = hf + "_ckpt";
    const CmdResult r = run_gtron({"import", "--hf", hf, "--out", out});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in\n"
                                                        << r.output;
    EXPECT_FALSE(std::filesystem::exists(out)) << "a failed import left " << out;
  }

  static std::string* dir_;
  static std::string* ckpt_;
};
std::string* Qwen3MoeHandWritten::dir_ = nullptr;
std::string* Qwen3MoeHandWritten::ckpt_ = nullptr;

TEST_F(Qwen3MoeHandWritten, ImportsToTheSameModelAndLogits) {
  const std::vector<double> native = logits_of(*ckpt_, *dir_ + "/native.safetensors");
  const std::map<std::string, Tensor> want = tensors_by_name(*ckpt_ + "/model.safetensors");
  struct Form {
    const char* name;
    json fields;
    bool fused;
  };
  const std::vector<Form> forms = {
      {"per_expert", {{"decoder_sparse_step", 1}, {"mlp_only_layers", {0}}}, false},
      {"fused_step2", {{"decoder_sparse_step", 2}, {"mlp_only_layers", json::array()}}, true},
      // The expert count under Mixtral's name, which transformers 5 may write instead.
      {"local_experts",
       {{"mlp_only_layers", {0}}, {"num_experts", nullptr}, {"num_local_experts", E}},
       false}};
  for (const Form& f : forms) {
    SCOPED_TRACE(f.name);
    const std::string hf = write_hf(f.name, f.fields, f.fused);
    const std::string ckpt = hf + "_ckpt";
    const CmdResult r = run_gtron({"import", "--hf", hf, "--out", ckpt});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("MoE E=4 top_k=2 first_dense_layers=1"), std::string::npos) << r.output;
    const std::map<std::string, Tensor> got = tensors_by_name(ckpt + "/model.safetensors");
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, t] : want) {
      ASSERT_EQ(got.count(name), 1u) << name;
      EXPECT_EQ(got.at(name).to_vector(), t.to_vector()) << name;
    }
    const std::string logits = hf + "_logits.safetensors";
    EXPECT_EQ(logits_of(ckpt, logits), native);
    // An implementation that shares no code with gtron (numpy, float64) reads the same logits.
    const CmdResult ref = run_command("/usr/bin/python3 tests/trainer/llama_reference.py '" + ckpt +
                                      "' '" + logits + "' --tolerance 1e-5");
    EXPECT_EQ(ref.exit_code, 0) << ref.output;
    EXPECT_NE(ref.output.find("\"shape\": [2, 16, 100]"), std::string::npos) << ref.output;
    std::printf("%s: numpy reference %s", f.name, ref.output.c_str());
  }
}

TEST_F(Qwen3MoeHandWritten, LayoutsAndFieldsGtronCannotRepresentAreRefused) {
  const json ok = {{"mlp_only_layers", {0}}};
  auto with = [&](const std::string& name, json fields) {
    for (const auto& [k, v] : ok.items())
      if (!fields.contains(k)) fields[k] = v;
    return write_hf(name, fields, false);
  };
  // Layer 0 sparse, layer 1 dense: gtron's sparse layers are the last ones.
  expect_import_error(with("dense_after", {{"mlp_only_layers", {1}}}),
                      "make layers [0] mixtures of experts and layers [1] dense");
  expect_import_error(with("step0", {{"decoder_sparse_step", 0}}),
                      "field 'decoder_sparse_step' is 0");
  expect_import_error(with("only5", {{"mlp_only_layers", {5}}}), "field 'mlp_only_layers' is [5]");
  expect_import_error(with("topk", {{"num_experts_per_tok", 5}}),
                      "field 'num_experts_per_tok' is 5, gtron's mixture of experts needs at "
                      "most num_experts = 4");
  expect_import_error(with("shared", {{"shared_expert_intermediate_size", 8}}),
                      "field 'shared_expert_intermediate_size' is 8");
  expect_import_error(with("norm", {{"norm_topk_prob", "yes"}}),
                      "field 'norm_topk_prob' is \"yes\"");
  expect_import_error(with("no_e", {{"num_experts", nullptr}}), "field 'num_experts' is missing");
  expect_import_error(with("two_e", {{"num_local_experts", 8}}),
                      "fields 'num_experts' (4) and 'num_local_experts' (8) disagree");
  expect_import_error(with("more_e", {{"num_experts", 8}}),
                      "field 'num_experts' is 8, larger than the tensor it sizes: "
                      "'model.layers.1.mlp.gate.weight'");
  expect_import_error(with("small_fe", {{"moe_intermediate_size", 4}}),
                      "tensor 'model.layers.1.mlp.experts.0.gate_proj.weight' is [6, 16] f32, the "
                      "model expects [4, 16] f32");
}

TEST_F(Qwen3MoeHandWritten, ExpertTensorsThatDoNotFitAreRefused) {
  auto spoil = [&](const std::string& name, bool fused,
                   const std::function<void(std::vector<NamedTensor>&)>& edit) {
    const std::string hf = write_hf(name, {{"mlp_only_layers", {0}}}, fused);
    SafetensorsFile f = read_safetensors(hf + "/model.safetensors");
    edit(f.tensors);
    write_safetensors(hf + "/model.safetensors", f.tensors, f.metadata);
    return hf;
  };
  const std::string fused = "model.layers.1.mlp.experts.";
  expect_import_error(spoil("transposed", true,
                            [&](std::vector<NamedTensor>& t) {
                              for (NamedTensor& n : t)
                                if (n.name == fused + "down_proj")
                                  n.tensor = Tensor::zeros({E, Fe, C}, DType::kF32);
                            }),
                      "fused expert tensor 'model.layers.1.mlp.experts.down_proj' is [4, 6, 16], "
                      "the model expects [4, 16, 6]");
  expect_import_error(
      spoil("both", false,
            [&](std::vector<NamedTensor>& t) {
              t.push_back({fused + "down_proj", Tensor::zeros({E, C, Fe}, DType::kF32)});
            }),
      "holds both 'model.layers.1.mlp.experts.down_proj'");
  expect_import_error(
      spoil("extra_expert", false,
            [&](std::vector<NamedTensor>& t) {
              t.push_back({fused + "4.down_proj.weight", Tensor::zeros({C, Fe}, DType::kF32)});
            }),
      "has tensor 'model.layers.1.mlp.experts.4.down_proj.weight'");
}

// Export refuses what Qwen3MoeForCausalLM has no place for, naming the key, before writing: a
// sigmoid router and shared experts through --set on the checkpoint (the check comes before its
// weights are read), no q/k norms from a checkpoint trained so.
TEST_F(Qwen3MoeHandWritten, ExportRefusesWhatQwen3MoeCannotHold) {
  const std::string plain = train_checkpoint(
      kConfig, *dir_, "no_qk_norm", {"model.moe.first_dense_layers=1", "model.qk_norm=false"}, 2);
  struct Refusal {
    std::string ckpt, set, needle;
  };
  const std::vector<Refusal> cases = {
      {*ckpt_, "model.moe.router=sigmoid", "model.moe.router = \"sigmoid\""},
      {*ckpt_, "model.moe.num_shared_experts=1", "model.moe.num_shared_experts = 1"},
      {plain, "", "model.qk_norm = false"}};
  int i = 0;
  for (const Refusal& c : cases) {
    const std::string out = *dir_ + "/refused_" + std::to_string(i++);
    std::vector<std::string> args = {"export", "--checkpoint", c.ckpt, "--hf", out};
    if (!c.set.empty()) args.insert(args.end(), {"--set", c.set});
    const CmdResult r = run_gtron(args);
    EXPECT_EQ(r.exit_code, 2) << c.needle << ": " << r.output;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("Qwen3MoeForCausalLM"), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(out)) << c.needle;
  }
}

}  // namespace
}  // namespace gtron
