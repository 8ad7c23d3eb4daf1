#include "trainer/checkpoint.h"

#include <map>
#include <nlohmann/json.hpp>

#include "trainer/checkpoint_io.h"
#include "trainer/safetensors.h"

namespace gtron {

namespace {

constexpr char kModelFile[] = "model.safetensors";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kStateFile[] = "trainer_state.json";

// Host copies (parameters may live on a GPU).
Tensor host(const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); }

std::map<std::string, Tensor> by_name(const SafetensorsFile& f) {
  std::map<std::string, Tensor> m;
  for (const NamedTensor& t : f.tensors) m[t.name] = t.tensor;
  return m;
}

void load_into(const std::map<std::string, Tensor>& src, const std::string& name, Tensor& dst,
               const std::string& file) {
  auto it = src.find(name);
  if (it == src.end()) {
    throw UserError(
        "checkpoint '" + file + "' has no tensor '" + name +
        "'. Hint: was it written by a model with another architecture (model.*, mtp.*)?");
  }
  if (it->second.shape() != dst.shape() || it->second.dtype() != dst.dtype()) {
    throw UserError("checkpoint '" + file + "': tensor '" + name + "' is " +
                    it->second.shape().str() + " " + dtype_name(it->second.dtype()) +
                    ", the model expects " + dst.shape().str() + " " + dtype_name(dst.dtype()));
  }
  dst.copy_from(it->second);
}

// The view of parameter p's moments inside a full flat state tensor.
Tensor state_view(const Tensor& flat, const FullOptimizerState& opt, const Parameter* p) {
  const int64_t off = opt.layout->flat_offset(p);
  return flat.rows(off, off + p->data.numel()).view(p->data.shape());
}

}  // namespace

std::string save_training_checkpoint(const std::string& root, const GPT& model,
                                     const FullOptimizerState* opt, const TrainerState& state,
                                     int keep) {
  return save_checkpoint_dir(
      root, state.step,
      [&](const std::string& dir) {
        std::vector<NamedTensor> params;
        for (const Parameter* p : model.parameters()) params.push_back({p->name, host(p->data)});
        write_safetensors(dir + "/" + kModelFile, params,
                          {{"format", "gtron"}, {"step", std::to_string(state.step)}});
        if (opt != nullptr) {
          std::vector<NamedTensor> moments;
          for (const Parameter* p : model.parameters()) {
            moments.push_back({"m." + p->name, host(state_view(opt->m, *opt, p))});
          }
          for (const Parameter* p : model.parameters()) {
            moments.push_back({"v." + p->name, host(state_view(opt->v, *opt, p))});
          }
          write_safetensors(dir + "/" + kOptimizerFile, moments,
                            {{"optimizer", "adamw"}, {"t", std::to_string(state.optimizer_steps)}});
        }
        nlohmann::json j;
        j["step"] = state.step;
        j["optimizer_steps"] = state.optimizer_steps;
        j["seed"] = state.seed;
        j["config"] = nlohmann::json::parse(state.config_json);
        write_file_atomic_in_dir(dir, kStateFile, j.dump(2) + "\n");
      },
      keep);
}

TrainerState read_trainer_state(const std::string& dir) {
  const std::string path = dir + "/" + kStateFile;
  TrainerState s;
  try {
    nlohmann::json j = nlohmann::json::parse(read_file(path));
    s.step = j.at("step").get<int64_t>();
    s.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
    s.seed = j.at("seed").get<uint64_t>();
    s.config_json = j.at("config").dump();
  } catch (const nlohmann::json::exception& e) {
    throw UserError("checkpoint state '" + path + "' is malformed: " + e.what());
  }
  return s;
}

int64_t load_training_checkpoint(const std::string& dir, GPT& model, FullOptimizerState* opt) {
  const std::string model_path = dir + "/" + kModelFile;
  auto params = by_name(read_safetensors(model_path));
  for (Parameter* p : model.parameters()) load_into(params, p->name, p->data, model_path);
  if (opt == nullptr) return 0;
  const std::string opt_path = dir + "/" + kOptimizerFile;
  SafetensorsFile f = read_safetensors(opt_path);
  auto moments = by_name(f);
  for (const Parameter* p : model.parameters()) {
    Tensor m = state_view(opt->m, *opt, p);
    Tensor v = state_view(opt->v, *opt, p);
    load_into(moments, "m." + p->name, m, opt_path);
    load_into(moments, "v." + p->name, v, opt_path);
  }
  auto t = f.metadata.find("t");
  if (t == f.metadata.end()) throw UserError("checkpoint '" + opt_path + "' has no step count 't'");
  return std::stoll(t->second);
}

}  // namespace gtron
