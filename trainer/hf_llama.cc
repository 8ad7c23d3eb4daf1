#include "trainer/hf_llama.h"

#include <cmath>
#include <set>

#include "trainer/hf_qwen3_moe.h"
#include "trainer/hf_weights.h"
#include "trainer/io/checkpoint.h"
#include "trainer/train.h"

namespace gtron {
namespace {

using json = nlohmann::ordered_json;

constexpr char kPrefix[] = "model.";

// One Hugging Face tensor cut from rows [begin, end) of a gtron tensor.
struct Piece {
  std::string name;  // as stored in model.safetensors
  int64_t begin = 0, end = 0;
};

struct LlamaSlot {
  std::vector<Piece> pieces;  // empty: an mtp.* parameter (mtp.safetensors, gtron's name)
  bool vocab = false;         // a [Vp, C] table: rows < V (Note [llama names])
};

// The Hugging Face tensors of gtron parameter `p` (Note [llama names]).
LlamaSlot llama_slot(const Parameter& p, const LlamaDims& d) {
  const std::string& name = p.name;
  const int64_t rows = p.data.dim(0);
  if (name.rfind("mtp.", 0) == 0) return {};
  if (name == "wte.weight") return {{{"model.embed_tokens.weight", 0, rows}}, true};
  if (name == "lm_head.weight") return {{{"lm_head.weight", 0, rows}}, true};
  if (name == "norm_f.weight") return {{{"model.norm.weight", 0, rows}}};
  const size_t dot = name.find('.', 7);  // after "blocks."
  GTRON_CHECK(name.rfind("blocks.", 0) == 0 && dot != std::string::npos,
              "no Hugging Face name for parameter ", name);
  const std::string layer = kPrefix + ("layers." + name.substr(7, dot - 7)) + ".";
  const std::string rest = name.substr(dot + 1);
  const int64_t q = d.NH * d.HS, kv = d.NKV * d.HS;
  if (rest == "attn.qkv.weight" || rest == "attn.qkv.bias") {
    const std::string kind = rest.substr(rest.rfind('.'));  // ".weight" or ".bias"
    const std::string a = layer + "self_attn.";
    return {{{a + "q_proj" + kind, 0, q},
             {a + "k_proj" + kind, q, q + kv},
             {a + "v_proj" + kind, q + kv, q + 2 * kv}}};
  }
  if (rest == "mlp.gate_up.weight")
    return {
        {{layer + "mlp.gate_proj.weight", 0, d.F}, {layer + "mlp.up_proj.weight", d.F, 2 * d.F}}};
  // A mixture-of-experts MLP (Note [Qwen3-MoE mapping] in trainer/hf_qwen3_moe.h).
  if (rest == "mlp.router.weight") return {{{layer + "mlp.gate.weight", 0, rows}}};
  const std::string experts = "mlp.experts.";
  const size_t edot = rest.find('.', experts.size());
  if (rest.rfind(experts, 0) == 0 && edot != std::string::npos) {
    const std::string ex = layer + rest.substr(0, edot + 1);  // "model.layers.i.mlp.experts.e."
    const std::string what = rest.substr(edot + 1);
    if (what == "gate_up.weight")  // [2·Fe, C]: gate's rows, then up's
      return {{{ex + "gate_proj.weight", 0, rows / 2}, {ex + "up_proj.weight", rows / 2, rows}}};
    if (what == "down.weight") return {{{ex + "down_proj.weight", 0, rows}}};
  }
  static const std::map<std::string, std::string> kWhole = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn.q_norm.weight", "self_attn.q_norm.weight"},
      {"attn.k_norm.weight", "self_attn.k_norm.weight"},
      {"attn.proj.weight", "self_attn.o_proj.weight"},
      {"mlp_norm.weight", "post_attention_layernorm.weight"},
      {"mlp.down.weight", "mlp.down_proj.weight"},
  };
  auto it = kWhole.find(rest);
  GTRON_CHECK(it != kWhole.end(), "no Hugging Face name for parameter ", name);
  return {{{layer + it->second, 0, rows}}};
}

Shape with_rows(const Shape& shape, int64_t rows) {
  std::vector<int64_t> dims = shape.vec();
  dims[0] = rows;
  return Shape(dims);
}

[[noreturn]] void field_fail(const std::string& path, const std::string& field,
                             const std::string& got, const std::string& want) {
  throw UserError(str_cat("Hugging Face config '", path, "': field '", field, "' is ", got,
                          ", gtron's llama family needs ", want,
                          "; hint: gtron imports LlamaForCausalLM, Qwen2ForCausalLM, "
                          "Qwen3ForCausalLM and Qwen3MoeForCausalLM directories (and GPT-2's)"));
}

// j[key] (config.json's field `prefix` + `key`) as a positive number, `fallback` when absent or
// null.
double positive_number(const json& j, const std::string& path, const std::string& key,
                       double fallback, const std::string& prefix = "") {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  if (!v.is_number() || !(v.get<double>() > 0))
    field_fail(path, prefix + key, v.dump(), "a positive number");
  return v.get<double>();
}

bool flag(const json& j, const std::string& path, const char* field, bool fallback) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  if (!j[field].is_boolean()) field_fail(path, field, j[field].dump(), "true or false");
  return j[field].get<bool>();
}

// gtron's model.rope_scaling keys from the RoPE object `r`, config.json's field `field`
// ("rope_scaling" or "rope_parameters"): rope_type (or the older key type) "default" is none,
// "llama3" takes its four fields (Note [llama RoPE fields]).
json rope_type_keys(const json& r, const std::string& path, const std::string& field) {
  const std::string type_field = r.contains("rope_type") ? "rope_type" : "type";
  if (!r.contains(type_field))
    field_fail(path, field + ".rope_type", "missing", "\"default\" or \"llama3\"");
  const json& type = r[type_field];
  if (type == "default") return {{"type", "none"}};
  if (type != "llama3")
    field_fail(path, field + "." + type_field, type.dump(), "\"default\" or \"llama3\"");
  json keys = {{"type", "llama3"}};
  for (const char* f : {"factor", "low_freq_factor", "high_freq_factor"}) {
    if (!r.contains(f) || r[f].is_null())
      field_fail(path, field + "." + f, "missing", "a positive number");
    keys[f] = positive_number(r, path, f, 0, field + ".");
  }
  const char* omax = "original_max_position_embeddings";
  if (!r.contains(omax) || !r[omax].is_number_integer() || r[omax].get<int64_t>() <= 0)
    field_fail(path, field + "." + omax, r.value(omax, json("missing")).dump(),
               "a positive integer");
  keys[omax] = r[omax];
  return keys;
}

struct RopeKeys {
  double theta;
  json scaling;  // gtron's model.rope_scaling
};

[[noreturn]] void rope_disagree(const std::string& path, const std::string& a, const std::string& b,
                                const std::string& a_says, const std::string& b_says) {
  throw UserError(str_cat("Hugging Face config '", path, "': fields '", a, "' and '", b,
                          "' disagree (", a, " gives ", a_says, ", ", b, " gives ", b_says,
                          "); hint: transformers 5 reads rope_parameters: make '", a,
                          "' match it or remove '", a, "'"));
}

// Note [llama RoPE fields]: the older form is rope_theta (default 10000) plus rope_scaling (null,
// or an object as rope_type_keys reads it); transformers 5 writes rope_parameters, one object
// holding rope_type, rope_theta and the scaling fields. Either form is read; a config holding
// both must say the same in both (rope_theta against rope_parameters.rope_theta when both are
// given, rope_scaling, null included, against rope_parameters' type and fields), else it is
// refused naming the two fields. rope_parameters without rope_theta takes the top-level
// rope_theta, as transformers does.
RopeKeys rope_keys(const json& j, const std::string& path) {
  const bool old_theta = j.contains("rope_theta") && !j["rope_theta"].is_null();
  RopeKeys old{positive_number(j, path, "rope_theta", 10000.0), json{{"type", "none"}}};
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    if (!j["rope_scaling"].is_object())
      field_fail(path, "rope_scaling", j["rope_scaling"].dump(), "null or a JSON object");
    old.scaling = rope_type_keys(j["rope_scaling"], path, "rope_scaling");
  }
  if (!j.contains("rope_parameters") || j["rope_parameters"].is_null()) return old;
  const json& r = j["rope_parameters"];
  if (!r.is_object()) field_fail(path, "rope_parameters", r.dump(), "null or a JSON object");
  RopeKeys now{positive_number(r, path, "rope_theta", old.theta, "rope_parameters."),
               rope_type_keys(r, path, "rope_parameters")};
  const json partial = r.value("partial_rotary_factor", json(1.0));
  if (!partial.is_null() && partial != 1.0)
    field_fail(path, "rope_parameters.partial_rotary_factor", partial.dump(),
               "1 (RoPE on the whole head)");
  if (old_theta && r.contains("rope_theta") && now.theta != old.theta)
    rope_disagree(path, "rope_theta", "rope_parameters.rope_theta", j["rope_theta"].dump(),
                  r["rope_theta"].dump());
  if (j.contains("rope_scaling") && now.scaling != old.scaling)
    rope_disagree(path, "rope_scaling", "rope_parameters", old.scaling.dump(), now.scaling.dump());
  return now;
}

}  // namespace

Tensor vocab_rows_to_hf(const std::string& name, const Tensor& t, int64_t V) {
  const Tensor pad = t.rows(V, t.dim(0));
  const float* p = pad.data<float>();
  for (int64_t i = 0; i < pad.numel(); ++i) {
    if (p[i] != 0.0f)  // gtron keeps them zero: a nonzero one would be lost by the export
      throw UserError(str_cat("checkpoint tensor '", name,
                              "' has a nonzero padded row (rows >= model.vocab_size = ", V,
                              " must be zero); it cannot be exported bit-exactly"));
  }
  return t.rows(0, V).clone();
}

void vocab_rows_from_hf(const Tensor& hf, Tensor& dst) {
  dst.zero_();
  Tensor head = dst.rows(0, hf.dim(0));
  head.copy_from(hf);
}

std::vector<NamedTensor> llama_hf_tensors(GPT& model, int64_t V) {
  const LlamaDims d = model.config().llama_dims();
  std::vector<NamedTensor> out;
  for (Parameter* p : model.parameters()) {
    const LlamaSlot s = llama_slot(*p, d);
    if (s.vocab) {
      out.push_back({s.pieces[0].name, vocab_rows_to_hf(p->name, p->data, V)});
      continue;
    }
    for (const Piece& pc : s.pieces)
      out.push_back({pc.name, p->data.rows(pc.begin, pc.end).clone()});
  }
  return out;
}

json llama_hf_config(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  const LlamaDims d = gpt_config(cfg).llama_dims();
  const char* type = m.qk_norm ? "qwen3" : m.qkv_bias ? "qwen2" : "llama";
  const char* cls = m.qk_norm    ? "Qwen3ForCausalLM"
                    : m.qkv_bias ? "Qwen2ForCausalLM"
                                 : "LlamaForCausalLM";
  json rope = nullptr;
  if (m.rope_scaling.type == RopeScalingType::kLlama3)
    rope = {{"rope_type", "llama3"},
            {"factor", m.rope_scaling.factor},
            {"low_freq_factor", m.rope_scaling.low_freq_factor},
            {"high_freq_factor", m.rope_scaling.high_freq_factor},
            {"original_max_position_embeddings", m.rope_scaling.original_max_position_embeddings}};
  json j = {{"architectures", {cls}},
            {"model_type", type},
            {"vocab_size", m.vocab_size},
            {"max_position_embeddings", m.context_length},
            {"hidden_size", m.n_embd},
            {"intermediate_size", d.F},
            {"num_hidden_layers", m.n_layer},
            {"num_attention_heads", m.n_head},
            {"num_key_value_heads", d.NKV},
            {"head_dim", d.HS},
            {"hidden_act", "silu"},
            {"rms_norm_eps", m.rms_norm_eps},
            {"rope_theta", m.rope_theta},
            {"rope_scaling", rope},
            {"attention_bias", m.qkv_bias},
            {"mlp_bias", false},
            {"initializer_range", m.init_std},
            {"tie_word_embeddings", m.tied_embeddings},
            {"torch_dtype", "float32"}};
  if (m.moe.num_experts > 0) add_qwen3_moe_config(cfg, j);
  return j;
}

bool is_llama_model_type(const json& model_type) {
  return model_type == "llama" || model_type == "qwen2" || model_type == "qwen3" ||
         is_qwen3_moe_type(model_type);
}

json llama_model_keys(const json& j, const std::string& path) {
  const json type = j.value("model_type", json());
  if (!is_llama_model_type(type))
    field_fail(path, "model_type", type.dump(), "\"llama\", \"qwen2\", \"qwen3\" or \"qwen3_moe\"");
  const int64_t C = hf_config_size(j, path, "hidden_size");
  const int64_t NH = hf_config_size(j, path, "num_attention_heads");
  const int64_t NKV = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                          ? hf_config_size(j, path, "num_key_value_heads")
                          : NH;
  if (NH % NKV != 0)
    field_fail(path, "num_key_value_heads", std::to_string(NKV),
               str_cat("a divisor of num_attention_heads = ", NH));
  int64_t HS = 0;
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    HS = hf_config_size(j, path, "head_dim");
  } else if (C % NH != 0) {
    field_fail(path, "head_dim", "missing",
               str_cat("a head size (hidden_size = ", C,
                       " is not a multiple of num_attention_heads = ", NH, ")"));
  }
  const json act = j.value("hidden_act", json("silu"));
  if (act != "silu") field_fail(path, "hidden_act", act.dump(), "\"silu\"");
  if (flag(j, path, "mlp_bias", false)) field_fail(path, "mlp_bias", "true", "false");
  // Qwen2/Qwen3's sliding-window attention would change which keys a query sees.
  if (flag(j, path, "use_sliding_window", false))
    field_fail(path, "use_sliding_window", "true", "false (gtron's attention is full causal)");
  // Qwen2 always has q/k/v biases; Llama's attention_bias would also put one on o_proj.
  const bool qkv_bias = type == "qwen2";
  if (!qkv_bias && flag(j, path, "attention_bias", false))
    field_fail(path, "attention_bias", "true", "false (gtron has no o_proj bias)");
  const RopeKeys rope = rope_keys(j, path);
  const bool moe = is_qwen3_moe_type(type);
  const int64_t L = hf_config_size(j, path, "num_hidden_layers");
  // A dense type sets num_experts 0 too: a base config's MoE keys must not make its blocks sparse.
  return {{"arch", "llama"},
          {"vocab_size", hf_config_size(j, path, "vocab_size")},
          {"context_length", hf_config_size(j, path, "max_position_embeddings")},
          {"n_layer", L},
          {"n_head", NH},
          {"n_embd", C},
          {"n_kv_head", NKV},
          {"head_dim", HS},
          {"intermediate_size", hf_config_size(j, path, "intermediate_size")},
          {"rope_theta", rope.theta},
          {"rope_scaling", rope.scaling},
          {"rms_norm_eps", positive_number(j, path, "rms_norm_eps", 1e-6)},
          {"qk_norm", type == "qwen3" || moe},
          {"qkv_bias", qkv_bias},
          {"tied_embeddings", flag(j, path, "tie_word_embeddings", false)},
          {"moe", moe ? qwen3_moe_keys(j, path, L) : json{{"num_experts", 0}}}};
}

void check_llama_sizes(const json& keys, const HfHeaders& h, const std::string& path) {
  const auto key = [&](const char* k) { return keys[k].get<int64_t>(); };
  const int64_t C = key("n_embd"), NH = key("n_head"), NKV = key("n_kv_head");
  const int64_t HS = key("head_dim") > 0 ? key("head_dim") : C / NH;  // each <= 2^31: no overflow
  const std::string layer0 = std::string(kPrefix) + "layers.0.";
  check_size_against_tensor(h, path, "vocab_size", key("vocab_size"), "model.embed_tokens.weight",
                            0);
  check_size_against_tensor(h, path, "hidden_size", C, "model.embed_tokens.weight", 1);
  check_layers_against_tensors(h, path, "num_hidden_layers", key("n_layer"),
                               {std::string(kPrefix) + "layers."});
  check_size_against_tensor(h, path, "num_attention_heads × head_dim", NH * HS,
                            layer0 + "self_attn.q_proj.weight", 0);
  check_size_against_tensor(h, path, "num_key_value_heads × head_dim", NKV * HS,
                            layer0 + "self_attn.k_proj.weight", 0);
  // The dense width sizes layer 0's MLP unless every layer is a mixture of experts (then no
  // tensor holds it: the bound only).
  const json& moe = keys["moe"];
  if (moe["num_experts"].get<int64_t>() == 0 || moe["first_dense_layers"].get<int64_t>() > 0)
    check_size_against_tensor(h, path, "intermediate_size", key("intermediate_size"),
                              layer0 + "mlp.gate_proj.weight", 0);
  check_qwen3_moe_sizes(moe, h, path);
}

void fill_llama_model(GPT& model, std::map<std::string, Tensor> hf, const std::string& file) {
  const LlamaDims d = model.config().llama_dims();
  const MoeDims& moe = model.config().moe;
  if (moe.E > 0) unfuse_qwen3_moe_experts(hf, moe.E, moe.F, d.C, file);
  const int64_t V = model.config().vocab_size;
  std::set<std::string> used;
  for (Parameter* p : model.parameters()) {
    const LlamaSlot s = llama_slot(*p, d);
    if (s.vocab) {
      const std::string& n = s.pieces[0].name;
      vocab_rows_from_hf(checked_tensor(hf, n, with_rows(p->data.shape(), V), file), p->data);
      used.insert(n);
      continue;
    }
    for (const Piece& pc : s.pieces) {
      Tensor rows = p->data.rows(pc.begin, pc.end);
      rows.copy_from(checked_tensor(hf, pc.name, rows.shape(), file));
      used.insert(pc.name);
    }
  }
  for (const auto& [name, t] : hf) {
    if (used.count(name) == 0 && !(name == "lm_head.weight" && model.config().tied_embeddings))
      throw UserError(
          str_cat("safetensors file '", file, "' has tensor '", name, "' ", t.shape().str(),
                  ", which a llama-family model of this config.json ",
                  "has no place for; hint: check config.json's model_type, ",
                  "attention_bias, tie_word_embeddings (and a mixture of experts' ",
                  "num_experts, decoder_sparse_step, mlp_only_layers) against the file"));
  }
}

}  // namespace gtron
