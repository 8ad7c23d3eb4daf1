#include "trainer/hf_qwen3_moe.h"

#include <algorithm>
#include <set>
#include <vector>

#include "model/check.h"
#include "trainer/train.h"

namespace gtron {
namespace {

using json = nlohmann::ordered_json;

[[noreturn]] void moe_field_fail(const std::string& path, const std::string& field,
                                 const std::string& got, const std::string& want) {
  throw UserError(str_cat("Hugging Face config '", path, "': field '", field, "' is ", got,
                          ", gtron's mixture of experts needs ", want,
                          "; hint: gtron imports Qwen3MoeForCausalLM directories (Note [Qwen3-MoE ",
                          "mapping] in trainer/hf_qwen3_moe.h)"));
}

// j[field] as an integer >= `least` (`fallback` when absent or null).
int64_t int_field(const json& j, const std::string& path, const char* field, int64_t least,
                  int64_t fallback) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  const json& v = j[field];
  if (!v.is_number_integer() || v.get<int64_t>() < least || v.get<int64_t>() > kMaxHfConfigSize)
    moe_field_fail(path, field, v.dump(),
                   str_cat("an integer from ", least, " to ", kMaxHfConfigSize));
  return v.get<int64_t>();
}

// "[a, b, c]" of a list of layer indices.
std::string layer_list(const std::vector<int64_t>& layers) {
  std::string s = "[";
  for (size_t i = 0; i < layers.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(layers[i]);
  return s + "]";
}

// The layers transformers makes sparse (Note [Qwen3-MoE mapping]), in order.
std::vector<int64_t> sparse_layers(const json& j, const std::string& path, int64_t n_layer) {
  const int64_t step = int_field(j, path, "decoder_sparse_step", 1, 1);
  std::set<int64_t> dense_only;
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    const json& m = j["mlp_only_layers"];
    if (!m.is_array())
      moe_field_fail(path, "mlp_only_layers", m.dump(), "null or a list of layer indices");
    for (const json& l : m) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= n_layer)
        moe_field_fail(path, "mlp_only_layers", m.dump(),
                       str_cat("layer indices from 0 to num_hidden_layers - 1 = ", n_layer - 1));
      dense_only.insert(l.get<int64_t>());
    }
  }
  std::vector<int64_t> sparse;
  for (int64_t l = 0; l < n_layer; ++l)
    if (dense_only.count(l) == 0 && (l + 1) % step == 0) sparse.push_back(l);
  return sparse;
}

// "model.layers.<l>.mlp."
std::string mlp_prefix(int64_t l) { return str_cat("model.layers.", l, ".mlp."); }

}  // namespace

bool is_qwen3_moe_type(const json& model_type) { return model_type == "qwen3_moe"; }

json qwen3_moe_keys(const json& j, const std::string& path, int64_t n_layer) {
  const json none = {{"num_experts", 0}};
  // transformers 5 may store the count under Mixtral's name (Qwen3MoeConfig's attribute_map).
  const int64_t E_alias = int_field(j, path, "num_local_experts", 0, -1);
  int64_t E = int_field(j, path, "num_experts", 0, -1);
  if (E >= 0 && E_alias >= 0 && E != E_alias)
    throw UserError(str_cat("Hugging Face config '", path, "': fields 'num_experts' (", E,
                            ") and 'num_local_experts' (", E_alias,
                            ") disagree; hint: keep the one save_pretrained() wrote"));
  if (E < 0) E = E_alias;
  if (E < 0) moe_field_fail(path, "num_experts", "missing", "the number of experts");
  // Qwen2-MoE's always-on expert (with its own sigmoid gate) has no place in a Qwen3-MoE block.
  if (int_field(j, path, "shared_expert_intermediate_size", 0, 0) > 0)
    moe_field_fail(path, "shared_expert_intermediate_size",
                   j["shared_expert_intermediate_size"].dump(), "0 or no such field");
  if (E == 0) return none;
  const std::vector<int64_t> sparse = sparse_layers(j, path, n_layer);
  if (sparse.empty()) return none;
  const int64_t k = sparse.front();
  if (static_cast<int64_t>(sparse.size()) != n_layer - k) {
    std::vector<int64_t> dense;
    for (int64_t l = 0; l < n_layer; ++l)
      if (std::find(sparse.begin(), sparse.end(), l) == sparse.end()) dense.push_back(l);
    throw UserError(str_cat(
        "Hugging Face config '", path, "': fields 'decoder_sparse_step' (",
        j.value("decoder_sparse_step", json(1)).dump(), ") and 'mlp_only_layers' (",
        j.value("mlp_only_layers", json::array()).dump(), ") make layers ", layer_list(sparse),
        " mixtures of experts and layers ", layer_list(dense),
        " dense, which gtron cannot represent: its mixture-of-experts layers are the last ones ",
        "(model.moe.first_dense_layers = k: layers k .. num_hidden_layers - 1 sparse); hint: ",
        "gtron imports Qwen3-MoE models whose dense layers all come first"));
  }
  const int64_t top_k = hf_config_size(j, path, "num_experts_per_tok");
  if (top_k > E)
    moe_field_fail(path, "num_experts_per_tok", std::to_string(top_k),
                   str_cat("at most num_experts = ", E));
  const json norm = j.value("norm_topk_prob", json(false));
  if (!norm.is_boolean()) moe_field_fail(path, "norm_topk_prob", norm.dump(), "true or false");
  return {{"num_experts", E},
          {"top_k", top_k},
          {"num_shared_experts", 0},
          {"expert_intermediate_size", hf_config_size(j, path, "moe_intermediate_size")},
          {"first_dense_layers", k},
          {"router", "softmax"},
          {"norm_topk_prob", norm.get<bool>()},
          {"bias_update_rate", 0.0}};
}

void check_qwen3_moe_sizes(const json& moe, const HfHeaders& h, const std::string& path) {
  const int64_t E = moe["num_experts"].get<int64_t>();
  if (E == 0) return;
  const int64_t k = moe["first_dense_layers"].get<int64_t>();
  const int64_t Fe = moe["expert_intermediate_size"].get<int64_t>();
  const std::string mlp = mlp_prefix(k);
  check_size_against_tensor(h, path, "num_experts", E, mlp + "gate.weight", 0);
  const std::string fused = mlp + "experts.gate_up_proj";
  if (h.shapes.count(mlp + "experts.0.gate_proj.weight") == 0 && h.shapes.count(fused) != 0) {
    check_size_against_tensor(h, path, "2 × moe_intermediate_size", 2 * Fe, fused, 1);
  } else {
    check_size_against_tensor(h, path, "moe_intermediate_size", Fe,
                              mlp + "experts.0.gate_proj.weight", 0);
  }
}

void unfuse_qwen3_moe_experts(std::map<std::string, Tensor>& hf, int64_t E, int64_t Fe, int64_t C,
                              const std::string& file) {
  std::vector<std::string> fused;
  for (const auto& [name, t] : hf) {
    const size_t at = name.find(".mlp.experts.");
    if (name.rfind("model.layers.", 0) != 0 || at == std::string::npos) continue;
    const std::string what = name.substr(at + 13);
    if (what == "gate_up_proj" || what == "down_proj") fused.push_back(name);
  }
  for (const std::string& name : fused) {
    const Tensor t = hf.at(name);
    const std::string experts = name.substr(0, name.rfind('.') + 1);  // "...mlp.experts."
    const bool gate_up = name.compare(name.size() - 12, 12, "gate_up_proj") == 0;
    const Shape want = gate_up ? Shape{E, 2 * Fe, C} : Shape{E, C, Fe};
    if (t.shape() != want)
      throw UserError(str_cat(
          "safetensors file '", file, "': fused expert tensor '", name, "' is ", t.shape().str(),
          ", the model expects ", want.str(), " (num_experts, ",
          gate_up ? "2 × moe_intermediate_size, hidden_size" : "hidden_size, moe_intermediate_size",
          "); hint: check config.json against the file"));
    for (int64_t e = 0; e < E; ++e) {
      const std::string ex = experts + std::to_string(e) + ".";
      const Tensor m = t.rows(e, e + 1).view(gate_up ? Shape{2 * Fe, C} : Shape{C, Fe});
      std::vector<std::pair<std::string, Tensor>> parts;
      if (gate_up) {
        parts = {{ex + "gate_proj.weight", m.rows(0, Fe)},
                 {ex + "up_proj.weight", m.rows(Fe, 2 * Fe)}};
      } else {
        parts = {{ex + "down_proj.weight", m}};
      }
      for (auto& [n, part] : parts) {
        if (!hf.emplace(n, part).second)
          throw UserError(str_cat("safetensors file '", file, "' holds both '", name,
                                  "' (transformers 5's fused experts) and '", n,
                                  "' (one expert's tensor); hint: keep one form per layer"));
      }
    }
    hf.erase(name);
  }
}

namespace {

[[noreturn]] void export_refuse(const std::string& checkpoint_dir, const std::string& what,
                                const std::string& hint) {
  throw UserError(str_cat("export --hf: checkpoint '", checkpoint_dir,
                          "' is a mixture-of-experts model, written as transformers' ",
                          "Qwen3MoeForCausalLM, which has no place for ", what, "; hint: ", hint));
}

}  // namespace

void check_qwen3_moe_export(const Config& cfg, const std::string& checkpoint_dir) {
  const ModelConfig& m = cfg.model;
  auto refuse = [&](const std::string& what, const std::string& hint) {
    export_refuse(checkpoint_dir, what, hint);
  };
  if (m.moe.router != MoeRouterChoice::kSoftmax)
    refuse("model.moe.router = \"sigmoid\" (its router is a softmax)",
           "Qwen3-MoE checkpoints come from models trained with model.moe.router = \"softmax\"");
  if (m.moe.num_shared_experts > 0)
    refuse(str_cat("model.moe.num_shared_experts = ", m.moe.num_shared_experts,
                   " (it has no shared experts)"),
           "train with model.moe.num_shared_experts = 0");
  if (!m.qk_norm)
    refuse("model.qk_norm = false (its attention always has q/k norms)",
           "train with model.qk_norm = true");
  if (m.qkv_bias)
    refuse("model.qkv_bias = true (its attention_bias would put a bias on o_proj too)",
           "train with model.qkv_bias = false");
}

void check_qwen3_moe_bias(const GPT& model, const std::string& checkpoint_dir) {
  for (const auto& [name, bias] : model.buffers()) {
    for (double b : bias.to_vector()) {
      if (b != 0.0)
        export_refuse(
            checkpoint_dir, str_cat("the nonzero router bias '", name, "'"),
            "export a model whose router bias stayed zero (model.moe.bias_update_rate = 0)");
    }
  }
}

void add_qwen3_moe_config(const Config& cfg, json& j) {
  const MoeConfig& moe = cfg.model.moe;
  json dense = json::array();
  for (int64_t l = 0; l < moe.first_dense_layers; ++l) dense.push_back(l);
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["model_type"] = "qwen3_moe";
  j.erase("mlp_bias");                       // not a Qwen3MoeConfig field
  const int64_t Fe = gpt_config(cfg).moe.F;  // expert_intermediate_size 0: the dense width
  j["num_experts"] = moe.num_experts;
  j["num_experts_per_tok"] = moe.top_k;
  j["moe_intermediate_size"] = Fe;
  j["norm_topk_prob"] = moe.norm_topk_prob;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = dense;
  j["use_sliding_window"] = false;
  j["output_router_logits"] = false;
}

}  // namespace gtron
