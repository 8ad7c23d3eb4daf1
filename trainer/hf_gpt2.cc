#include "trainer/hf_gpt2.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "model/gpt.h"
#include "model/ops/norm.h"
#include "trainer/config.h"
#include "trainer/hf_llama.h"
#include "trainer/hf_qwen3_moe.h"
#include "trainer/hf_weights.h"
#include "trainer/io/checkpoint.h"
#include "trainer/io/checkpoint_io.h"
#include "trainer/io/safetensors.h"
#include "trainer/preflight.h"
#include "trainer/train.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr char kHfConfig[] = "config.json";
constexpr char kHfModel[] = "model.safetensors";
constexpr char kMtpFile[] = "mtp.safetensors";
constexpr char kGtronFile[] = "gtron.json";
constexpr char kTokenizer[] = "tokenizer.json";
constexpr char kGtronFormat[] = "gtron-hf";
constexpr char kPrefix[] = "transformer.";

// How a gtron tensor becomes its GPT-2 twin (Note [GPT-2 names]).
enum class Conv { kCopy, kTranspose, kVocabRows };

struct Slot {
  std::string name;  // GPT-2 name without "transformer." (or the gtron name of an MTP tensor)
  Conv conv = Conv::kCopy;
  bool mtp = false;  // lives in mtp.safetensors under its gtron name
};

// The GPT-2 slot of a gtron parameter name.
Slot slot_of(const std::string& name) {
  if (name.rfind("mtp.", 0) == 0) return {name, Conv::kCopy, true};
  if (name == "wte.weight") return {"wte.weight", Conv::kVocabRows};
  if (name == "lm_head.weight") return {"lm_head.weight", Conv::kVocabRows};
  if (name == "wpe.weight" || name.rfind("ln_f.", 0) == 0) return {name, Conv::kCopy};
  static const std::map<std::string, Slot> kBlock = {
      {"ln1.weight", {"ln_1.weight", Conv::kCopy}},
      {"ln1.bias", {"ln_1.bias", Conv::kCopy}},
      {"attn.qkv.weight", {"attn.c_attn.weight", Conv::kTranspose}},
      {"attn.qkv.bias", {"attn.c_attn.bias", Conv::kCopy}},
      {"attn.proj.weight", {"attn.c_proj.weight", Conv::kTranspose}},
      {"attn.proj.bias", {"attn.c_proj.bias", Conv::kCopy}},
      {"ln2.weight", {"ln_2.weight", Conv::kCopy}},
      {"ln2.bias", {"ln_2.bias", Conv::kCopy}},
      {"mlp.fc.weight", {"mlp.c_fc.weight", Conv::kTranspose}},
      {"mlp.fc.bias", {"mlp.c_fc.bias", Conv::kCopy}},
      {"mlp.proj.weight", {"mlp.c_proj.weight", Conv::kTranspose}},
      {"mlp.proj.bias", {"mlp.c_proj.bias", Conv::kCopy}},
  };
  const size_t dot = name.find('.', 7);  // after "blocks."
  GTRON_CHECK(name.rfind("blocks.", 0) == 0 && dot != std::string::npos,
              "no GPT-2 name for parameter ", name);
  auto it = kBlock.find(name.substr(dot + 1));
  GTRON_CHECK(it != kBlock.end(), "no GPT-2 name for parameter ", name);
  return {"h." + name.substr(7, dot - 7) + "." + it->second.name, it->second.conv};
}

// The name model.safetensors stores: "transformer." + slot, except the head.
std::string file_name(const Slot& s) {
  return s.name == "lm_head.weight" ? s.name : kPrefix + s.name;
}

Tensor transposed(const Tensor& t) {
  const int64_t R = t.dim(0), C = t.dim(1);
  Tensor out = Tensor::empty({C, R}, DType::kF32);
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) dst[c * R + r] = src[r * C + c];
  return out;
}

// The GPT-2 shape of a gtron tensor of `shape` (V = real vocabulary).
Shape hf_shape(const Shape& shape, Conv conv, int64_t V) {
  if (conv == Conv::kTranspose) return {shape[1], shape[0]};
  if (conv == Conv::kVocabRows) return {V, shape[1]};
  return shape;
}

Tensor to_hf(const std::string& name, const Tensor& t, Conv conv, int64_t V) {
  if (conv == Conv::kTranspose) return transposed(t);
  if (conv == Conv::kVocabRows) return vocab_rows_to_hf(name, t, V);
  return t;
}

void from_hf(const Tensor& hf, Conv conv, Tensor& dst) {
  if (conv == Conv::kTranspose) {
    dst.copy_from(transposed(hf));
  } else if (conv == Conv::kVocabRows) {
    vocab_rows_from_hf(hf, dst);
  } else {
    dst.copy_from(hf);
  }
}

void copy_file_if_present(const std::string& from_dir, const std::string& to_dir,
                          const char* name) {
  const std::string src = from_dir + "/" + name;
  std::error_code ec;
  if (fs::is_regular_file(src, ec)) write_file_atomic_in_dir(to_dir, name, read_file(src));
}

json parse_json_file(const std::string& path, const char* what) {
  try {
    return json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw UserError(str_cat(what, " '", path, "' is not valid JSON: ", e.what(),
                            "; hint: re-create it, or restore it from the source directory"));
  }
}

json hf_config(const Config& cfg) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", cfg.model.vocab_size},
          {"n_positions", cfg.model.context_length},
          {"n_embd", cfg.model.n_embd},
          {"n_layer", cfg.model.n_layer},
          {"n_head", cfg.model.n_head},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", kLayerNormEps},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", cfg.model.init_std},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"tie_word_embeddings", cfg.model.tied_embeddings},
          {"bos_token_id", nullptr},
          {"eos_token_id", nullptr},
          {"torch_dtype", "float32"}};
}

// ---- import ----

struct HfArch {
  int64_t vocab_size, n_positions, n_embd, n_layer, n_head;
  bool tied;
};

[[noreturn]] void arch_fail(const std::string& path, const std::string& field,
                            const std::string& got, const std::string& want) {
  throw UserError(str_cat(
      "Hugging Face config '", path, "': field '", field, "' is ", got, ", gtron's GPT-2 needs ",
      want, "; hint: gtron imports GPT-2 (GPT2LMHeadModel) and llama-family directories only"));
}

// `field` as given, or `fallback` (GPT2Config's default) when config.json omits it.
json field_or(const json& j, const char* field, const json& fallback) {
  return j.contains(field) ? j[field] : fallback;
}

HfArch check_gpt2_config(const json& j, const std::string& path) {
  if (!j.is_object()) arch_fail(path, "(top level)", j.type_name(), "a JSON object");
  const json type = field_or(j, "model_type", nullptr);
  if (type != "gpt2")
    arch_fail(path, "model_type", type.dump(),
              "\"gpt2\" (or the llama family's \"llama\", \"qwen2\", \"qwen3\", \"qwen3_moe\")");
  HfArch a{};
  a.vocab_size = hf_config_size(j, path, "vocab_size");
  a.n_positions = hf_config_size(j, path, "n_positions");
  a.n_embd = hf_config_size(j, path, "n_embd");
  a.n_layer = hf_config_size(j, path, "n_layer");
  a.n_head = hf_config_size(j, path, "n_head");
  const json act = field_or(j, "activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    arch_fail(path, "activation_function", act.dump(),
              "\"gelu_new\" (or \"gelu_pytorch_tanh\", the same function)");
  const json eps = field_or(j, "layer_norm_epsilon", kLayerNormEps);
  if (!eps.is_number() || std::fabs(eps.get<double>() - kLayerNormEps) > 1e-12)
    arch_fail(path, "layer_norm_epsilon", eps.dump(), "1e-05");
  const json inner = field_or(j, "n_inner", nullptr);
  if (!inner.is_null() && inner != 4 * a.n_embd)
    arch_fail(path, "n_inner", inner.dump(), str_cat("null or 4 * n_embd = ", 4 * a.n_embd));
  for (const auto& [field, want] : {std::pair<const char*, bool>{"scale_attn_weights", true},
                                    {"scale_attn_by_inverse_layer_idx", false},
                                    {"add_cross_attention", false}}) {
    const json v = field_or(j, field, want);
    if (v != want) arch_fail(path, field, v.dump(), want ? "true" : "false");
  }
  const json tied = field_or(j, "tie_word_embeddings", true);
  if (!tied.is_boolean()) arch_fail(path, "tie_word_embeddings", tied.dump(), "true or false");
  a.tied = tied.get<bool>();
  return a;
}

// The name `h` stores GPT-2 tensor `name` (no "transformer.") under: with the prefix or without.
std::string stored_name(const HfHeaders& h, const std::string& name) {
  const std::string prefixed = kPrefix + name;
  return h.shapes.count(prefixed) != 0 ? prefixed : name;
}

// Note [config.json sizes against the tensors]: vocab_size and n_embd against wte.weight [V, C],
// n_positions against wpe.weight [Tmax, C], n_layer against the blocks h.{i}; n_head, which no
// tensor holds, must divide n_embd. The rest of the model's shapes follow from these.
void check_gpt2_sizes(const HfArch& a, const HfHeaders& h, const std::string& path) {
  const std::string wte = stored_name(h, "wte.weight"), wpe = stored_name(h, "wpe.weight");
  check_size_against_tensor(h, path, "vocab_size", a.vocab_size, wte, 0);
  check_size_against_tensor(h, path, "n_embd", a.n_embd, wte, 1);
  check_size_against_tensor(h, path, "n_positions", a.n_positions, wpe, 0);
  check_layers_against_tensors(h, path, "n_layer", a.n_layer, {kPrefix + std::string("h."), "h."});
  if (a.n_embd % a.n_head != 0)
    arch_fail(path, "n_head", std::to_string(a.n_head),
              str_cat("a divisor of n_embd = ", a.n_embd));
}

// The gtron model.* keys a GPT-2 config.json fixes.
json gpt2_model_keys(const HfArch& a) {
  return {{"vocab_size", a.vocab_size}, {"context_length", a.n_positions},
          {"n_layer", a.n_layer},       {"n_head", a.n_head},
          {"n_embd", a.n_embd},         {"tied_embeddings", a.tied}};
}

// The gtron config of an import: the base config text, the overrides, then config.json's model.*
// keys (`model_keys`).
Config import_config(const HfImportOptions& o, const json& model_keys, const json& gtron) {
  json base = json::object();
  std::string source = "the defaults";
  if (!o.config_path.empty()) {
    base = parse_json_file(o.config_path, "config file");
    source = o.config_path;
  } else if (gtron.contains("config")) {
    base = gtron["config"];
    source = o.hf_dir + "/" + kGtronFile;
  }
  if (!base.is_object()) throw UserError("config '" + source + "' is not a JSON object");
  for (const auto& [key, value] : model_keys.items()) {
    // model.moe: the keys config.json fixes over the base's (which keeps aux_loss_weight).
    if (key == "moe" && base["model"].contains("moe") && base["model"]["moe"].is_object()) {
      base["model"]["moe"].update(value);
    } else {
      base["model"][key] = value;
    }
  }
  // A base that leaves the sequence length open trains on the model's whole context.
  if (!base.contains("train") || !base["train"].contains("seq_len"))
    base["train"]["seq_len"] = model_keys["context_length"];
  return config_from_json_text(base.dump(), o.sets,
                               source + " with the model shape of " + o.hf_dir + "/" + kHfConfig);
}

// The model weights by name (read_hf_weights: single-file or sharded, widened to f32); for GPT-2
// (`gpt2`) without "transformer.", mask buffers dropped. `source` gets the file messages name.
std::map<std::string, Tensor> read_hf_tensors(const std::string& dir, bool gpt2,
                                              std::string* source) {
  HfWeights weights = read_hf_weights(dir);
  *source = weights.source;
  std::map<std::string, Tensor> out;
  for (NamedTensor& nt : weights.tensors) {
    std::string name = nt.name;
    if (!gpt2) {
      out.emplace(name, nt.tensor);  // read_hf_weights' names are unique
      continue;
    }
    if (name.rfind(kPrefix, 0) == 0) name = name.substr(std::strlen(kPrefix));
    const bool mask = name.size() > 10 && (name.compare(name.size() - 10, 10, ".attn.bias") == 0 ||
                                           name.find(".attn.masked_bias") != std::string::npos);
    if (mask && name.rfind("h.", 0) == 0) continue;
    if (!out.emplace(name, nt.tensor).second)
      throw UserError(str_cat("'", weights.source, "' holds '", name, "' twice (with and ",
                              "without the \"transformer.\" prefix)"));
  }
  return out;
}

// Fills the mtp.* parameters from `mtp` (gtron names); those `mtp` lacks keep their fresh
// initialization. Returns the number of fresh MTP tensors.
int fill_mtp(GPT& model, const std::map<std::string, Tensor>& mtp, const std::string& dir) {
  std::set<std::string> used;
  int fresh = 0;
  for (Parameter* p : model.parameters()) {
    if (p->name.rfind("mtp.", 0) != 0) continue;
    if (mtp.count(p->name) == 0) {
      ++fresh;
      continue;
    }
    p->data.copy_from(checked_tensor(mtp, p->name, p->data.shape(), dir + "/" + kMtpFile));
    used.insert(p->name);
  }
  for (const auto& [name, t] : mtp) {
    if (used.count(name) == 0)
      throw UserError(str_cat("'", dir, "/", kMtpFile, "' has tensor '", name, "' ",
                              t.shape().str(), ", which the model has no place for; hint: set ",
                              "mtp.depth (--set mtp.depth=N) to the depths the file holds"));
  }
  return fresh;
}

// Fills every GPT-2 parameter but the MTP depths from `hf` (GPT-2 names, read from `file`).
void fill_gpt2_model(GPT& model, const std::map<std::string, Tensor>& hf, const std::string& file) {
  const int64_t V = model.config().vocab_size;
  std::set<std::string> used;
  for (Parameter* p : model.parameters()) {
    const Slot s = slot_of(p->name);
    if (s.mtp) continue;
    const Shape want = hf_shape(p->data.shape(), s.conv, V);
    from_hf(checked_tensor(hf, s.name, want, file), s.conv, p->data);
    used.insert(s.name);
  }
  for (const auto& [name, t] : hf) {
    if (used.count(name) == 0 && !(name == "lm_head.weight" && model.config().tied_embeddings))
      throw UserError(str_cat("safetensors file '", file, "' has tensor '", name, "' ",
                              t.shape().str(), ", which a GPT-2 of this config.json has no ",
                              "place for; hint: gtron imports GPT2LMHeadModel weights only"));
  }
}

}  // namespace

void export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
               const std::string& config_path, const std::vector<std::string>& sets) {
  require_new_folder(out_dir);
  verify_checkpoint_dir(checkpoint_dir);
  const TrainerState st = read_trainer_state(checkpoint_dir);
  const Config cfg = checkpoint_command_config("export", checkpoint_dir, config_path, sets);
  const bool moe = cfg.model.moe.num_experts > 0;
  if (moe) check_qwen3_moe_export(cfg, checkpoint_dir);
  GPT model(gpt_config(cfg), DType::kF32, Device::cpu(), cfg.train.seed);
  load_model_weights(checkpoint_dir, model);
  if (moe) check_qwen3_moe_bias(model, checkpoint_dir);
  const bool llama = cfg.model.arch == ModelArch::kLlama;
  std::vector<NamedTensor> hf, mtp;
  if (llama) hf = llama_hf_tensors(model, cfg.model.vocab_size);
  for (Parameter* p : model.parameters()) {
    if (p->name.rfind("mtp.", 0) == 0) {
      mtp.push_back({p->name, p->data});
    } else if (!llama) {
      const Slot s = slot_of(p->name);
      hf.push_back({file_name(s), to_hf(p->name, p->data, s.conv, cfg.model.vocab_size)});
    }
  }
  const json config = llama ? llama_hf_config(cfg) : hf_config(cfg);
  json gtron = {{"format", kGtronFormat},
                {"version", 1},
                {"step", st.step},
                {"seed", st.seed},
                {"config", json::parse(resolved_json(cfg))}};
  save_folder_as(out_dir, /*step=*/-1, [&](const std::string& tmp) {
    write_safetensors(tmp + "/" + kHfModel, hf, {{"format", "pt"}});
    if (!mtp.empty()) write_safetensors(tmp + "/" + kMtpFile, mtp, {{"format", "gtron"}});
    write_file_atomic_in_dir(tmp, kHfConfig, config.dump(2) + "\n");
    write_file_atomic_in_dir(tmp, kGtronFile, gtron.dump(2) + "\n");
    copy_file_if_present(checkpoint_dir, tmp, kTokenizer);
  });
}

std::string import_hf(const HfImportOptions& o) {
  require_new_folder(o.out_dir);
  std::error_code ec;
  if (!fs::is_directory(o.hf_dir, ec))
    throw UserError("--hf '" + o.hf_dir +
                    "' is not a directory; hint: pass the folder that "
                    "save_pretrained() or gtron export wrote");
  const std::string config_path = o.hf_dir + "/" + kHfConfig;
  if (!fs::is_regular_file(config_path, ec))
    throw UserError("Hugging Face directory '" + o.hf_dir + "' has no " + kHfConfig);
  const json hf_json = parse_json_file(config_path, "config");
  const bool llama =
      hf_json.is_object() && is_llama_model_type(hf_json.value("model_type", json()));
  const HfArch arch = llama ? HfArch{} : check_gpt2_config(hf_json, config_path);
  const json model_keys = llama ? llama_model_keys(hf_json, config_path) : gpt2_model_keys(arch);
  const std::string gtron_path = o.hf_dir + "/" + kGtronFile;
  json gtron = json::object();
  if (fs::is_regular_file(gtron_path, ec)) {
    gtron = parse_json_file(gtron_path, "gtron export state");
    if (!gtron.is_object() || gtron.value("format", "") != kGtronFormat ||
        !gtron.value("step", json()).is_number_unsigned())
      throw UserError("'" + gtron_path + "' is not a gtron export state file (format \"" +
                      kGtronFormat + "\" with a step); hint: delete it to import without it");
  }
  // Note [config.json sizes against the tensors]: before the model is built from them.
  const HfHeaders headers = read_hf_headers(o.hf_dir);
  if (llama) {
    check_llama_sizes(model_keys, headers, config_path);
  } else {
    check_gpt2_sizes(arch, headers, config_path);
  }
  const Config cfg = import_config(o, model_keys, gtron);
  // --set may still resize the model: refuse one this machine cannot hold, as eval does.
  check_cpu_memory(cfg, /*training=*/false, 0, "gtron import of " + o.hf_dir);
  GPT model(gpt_config(cfg), DType::kF32, Device::cpu(), cfg.train.seed);
  std::map<std::string, Tensor> mtp;
  if (fs::is_regular_file(o.hf_dir + "/" + kMtpFile, ec)) {
    for (NamedTensor& nt : read_safetensors_f32(o.hf_dir + "/" + kMtpFile).tensors)
      mtp[nt.name] = nt.tensor;
  }
  std::string source;
  const std::map<std::string, Tensor> hf = read_hf_tensors(o.hf_dir, !llama, &source);
  if (llama) {
    fill_llama_model(model, hf, source);
  } else {
    fill_gpt2_model(model, hf, source);
  }
  const int fresh = fill_mtp(model, mtp, o.hf_dir);
  std::vector<NamedTensor> params;
  for (Parameter* p : model.parameters()) params.push_back({p->name, p->data});
  // The MoE router biases (zero: Qwen3-MoE's router has none), after the parameters as train
  // writes them.
  for (const auto& [name, tensor] : model.buffers()) params.push_back({name, tensor});
  const int64_t step = gtron.contains("step") ? gtron["step"].get<int64_t>() : 0;
  const TrainerState st{step, 0, cfg.train.seed, resolved_json(cfg)};
  save_weights_checkpoint(o.out_dir, params, st, [&](const std::string& tmp) {
    copy_file_if_present(o.hf_dir, tmp, kTokenizer);
  });
  return str_cat(
      "imported ", o.hf_dir, " into ", o.out_dir, ": ", llama ? "llama" : "gpt2",
      " L=", cfg.model.n_layer, " C=", cfg.model.n_embd, " NH=", cfg.model.n_head,
      " V=", cfg.model.vocab_size, " Tmax=", cfg.model.context_length,
      cfg.model.tied_embeddings ? " tied" : " untied",
      cfg.model.moe.num_experts > 0
          ? str_cat(", MoE E=", cfg.model.moe.num_experts, " top_k=", cfg.model.moe.top_k,
                    " first_dense_layers=", cfg.model.moe.first_dense_layers)
          : std::string(),
      ", MTP D=", cfg.mtp.depth, " (", fresh, " MTP tensors freshly initialized)");
}

}  // namespace gtron
