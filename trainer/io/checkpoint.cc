#include "trainer/io/checkpoint.h"

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "trainer/io/checkpoint_io.h"

namespace gtron {

namespace {

constexpr char kModelFile[] = "model.safetensors";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kStateFile[] = "trainer_state.json";
constexpr char kTokenizerFile[] = "tokenizer.json";

std::map<std::string, Tensor> by_name(const SafetensorsFile& f) {
  std::map<std::string, Tensor> m;
  for (const NamedTensor& t : f.tensors) m[t.name] = t.tensor;
  return m;
}

// The files of a checkpoint directory except MANIFEST.json, written into `dir`.
void write_checkpoint_files(const std::string& dir, const std::vector<NamedTensor>& params,
                            const std::vector<NamedTensor>& moments, const TrainerState& state) {
  write_safetensors(dir + "/" + kModelFile, params,
                    {{"format", "gtron"}, {"step", std::to_string(state.step)}});
  if (!moments.empty()) {
    write_safetensors(dir + "/" + kOptimizerFile, moments,
                      {{"optimizer", "adamw"}, {"t", std::to_string(state.optimizer_steps)}});
  }
  nlohmann::json j;
  j["step"] = state.step;
  j["optimizer_steps"] = state.optimizer_steps;
  j["seed"] = state.seed;
  j["config"] = nlohmann::json::parse(state.config_json);
  write_file_atomic_in_dir(dir, kStateFile, j.dump(2) + "\n");
  if (!state.tokenizer_json.empty()) {
    write_file_atomic_in_dir(dir, kTokenizerFile, state.tokenizer_json);
  }
}

}  // namespace

std::string save_training_checkpoint(const std::string& root,
                                     const std::vector<NamedTensor>& params,
                                     const std::vector<NamedTensor>& moments,
                                     const TrainerState& state, int keep) {
  return save_checkpoint_dir(
      root, state.step,
      [&](const std::string& dir) { write_checkpoint_files(dir, params, moments, state); }, keep);
}

void save_weights_checkpoint(const std::string& dir, const std::vector<NamedTensor>& params,
                             const TrainerState& state,
                             const std::function<void(const std::string& tmp_dir)>& extra_files) {
  save_folder_as(dir, state.step, [&](const std::string& tmp) {
    write_checkpoint_files(tmp, params, {}, state);
    if (extra_files) extra_files(tmp);
  });
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
    if (s.step < 0 || s.optimizer_steps < 0)
      throw UserError("checkpoint state '" + path + "': step " + std::to_string(s.step) +
                      " and optimizer_steps " + std::to_string(s.optimizer_steps) +
                      " must be >= 0; hint: the file was edited or is not gtron's");
  } catch (const nlohmann::json::exception& e) {
    throw UserError("checkpoint state '" + path + "' is malformed: " + e.what());
  }
  return s;
}

std::optional<Tokenizer> read_checkpoint_tokenizer(const std::string& dir) {
  const std::string path = dir + "/" + kTokenizerFile;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  return Tokenizer::from_json_text(read_file(path), path);
}

CheckpointTensors read_checkpoint_tensors(const std::string& dir, bool with_optimizer) {
  CheckpointTensors c;
  c.params = by_name(read_safetensors(dir + "/" + kModelFile));
  if (!with_optimizer) return c;
  const std::string opt_path = dir + "/" + kOptimizerFile;
  SafetensorsFile f = read_safetensors(opt_path);
  c.moments = by_name(f);
  auto t = f.metadata.find("t");
  if (t == f.metadata.end()) throw UserError("checkpoint '" + opt_path + "' has no step count 't'");
  char* end = nullptr;
  errno = 0;
  c.optimizer_steps = std::strtoll(t->second.c_str(), &end, 10);
  if (t->second.empty() || *end != '\0' || errno != 0 || c.optimizer_steps < 0)
    throw UserError("checkpoint '" + opt_path + "': step count 't' = \"" + t->second +
                    "\" is not a non-negative integer");
  return c;
}

const Tensor& checked_tensor(const std::map<std::string, Tensor>& tensors, const std::string& name,
                             const Shape& shape, const std::string& file) {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    throw UserError(
        "checkpoint '" + file + "' has no tensor '" + name +
        "'. Hint: was it written by a model with another architecture (model.*, mtp.*)?");
  }
  if (it->second.shape() != shape || it->second.dtype() != DType::kF32) {
    throw UserError("checkpoint '" + file + "': tensor '" + name + "' is " +
                    it->second.shape().str() + " " + dtype_name(it->second.dtype()) +
                    ", the model expects " + shape.str() + " f32");
  }
  return it->second;
}

void load_model_weights(const std::string& dir, GPT& model) {
  CheckpointTensors c = read_checkpoint_tensors(dir, false);
  const std::string file = dir + "/" + kModelFile;
  for (Parameter* p : model.parameters()) {
    p->data.copy_from(checked_tensor(c.params, p->name, p->data.shape(), file));
  }
  for (auto& [name, tensor] : model.buffers()) {  // the MoE router biases
    tensor.copy_from(checked_tensor(c.params, name, tensor.shape(), file));
  }
}

}  // namespace gtron
