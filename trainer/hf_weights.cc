#include "trainer/hf_weights.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "model/check.h"
#include "trainer/io/checkpoint_io.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr char kModelFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

[[noreturn]] void index_fail(const std::string& index, const std::string& problem,
                             const std::string& hint) {
  throw UserError(str_cat("sharded checkpoint index '", index, "': ", problem, "; hint: ", hint));
}

constexpr char kResave[] =
    "re-create the directory with save_pretrained(), or repair the index so that it names every "
    "tensor of every shard exactly once";

// The weight_map of `index`, grouped by shard: shard file name -> tensor names.
std::map<std::string, std::set<std::string>> shard_names(const std::string& index) {
  json j;
  try {
    j = json::parse(read_file(index));
  } catch (const json::exception& e) {
    index_fail(index, str_cat("not valid JSON: ", e.what()), kResave);
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object() ||
      j["weight_map"].empty())
    index_fail(index, "field 'weight_map' is missing or not a non-empty object", kResave);
  std::map<std::string, std::set<std::string>> shards;
  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    if (!shard.is_string())
      index_fail(index,
                 str_cat("weight_map[\"", tensor, "\"] is ", shard.dump(), ", not a file name"),
                 kResave);
    const std::string file = shard.get<std::string>();
    if (file.empty() || file == "." || file == ".." ||
        file.find_first_of("/\\") != std::string::npos)
      index_fail(index,
                 str_cat("weight_map[\"", tensor, "\"] is shard file name \"", file,
                         "\"; a shard must be a plain file name in the index's directory"),
                 "shards live beside the index; remove any directory part from the name");
    shards[file].insert(tensor);
  }
  return shards;
}

// Refuses shard `file` of `index` unless the tensors it holds (`got`, each with a .name) are
// exactly those the index maps to it (`names`).
template <typename Named>
void check_shard(const std::string& index, const std::string& file,
                 const std::set<std::string>& names, const std::vector<Named>& got) {
  std::set<std::string> found;
  for (const Named& nt : got) {
    if (names.count(nt.name) == 0)
      index_fail(index,
                 str_cat("shard '", file, "' holds tensor '", nt.name,
                         "', which weight_map does not map to that shard"),
                 kResave);
    found.insert(nt.name);
  }
  for (const std::string& name : names) {
    if (found.count(name) == 0)
      index_fail(index,
                 str_cat("weight_map maps tensor '", name, "' to shard '", file,
                         "', which does not hold it"),
                 kResave);
  }
}

// The file or files of `dir`'s weights (Note [sharded Hugging Face checkpoints]), each with the
// tensor names the index maps to it (none for a single file); source: the file messages name.
struct WeightFiles {
  std::string source;
  std::vector<std::pair<std::string, std::set<std::string>>> files;  // (path, names)
  bool sharded = false;
};

WeightFiles weight_files(const std::string& dir) {
  const std::string single = dir + "/" + kModelFile;
  const std::string index = dir + "/" + kIndexFile;
  std::error_code ec;
  const bool has_single = fs::exists(single, ec);
  const bool has_index = fs::exists(index, ec);
  if (has_single && has_index)
    throw UserError(str_cat("Hugging Face directory '", dir, "' has both ", kModelFile, " and ",
                            kIndexFile,
                            " (a sharded checkpoint); hint: save_pretrained writes one ",
                            "or the other, so one is left over from an earlier save: remove it"));
  if (!has_index && !has_single)
    throw UserError(str_cat("Hugging Face directory '", dir, "' has no ", kModelFile, " (nor ",
                            kIndexFile, "); hint: save it with save_pretrained(..., ",
                            "safe_serialization=True)"));
  if (!has_index) return {single, {{single, {}}}, false};
  WeightFiles out{index, {}, true};
  for (auto& [file, names] : shard_names(index)) {
    const std::string path = dir + "/" + file;
    if (!fs::is_regular_file(path, ec))
      index_fail(
          index,
          str_cat("shard '", file, "' (holding '", *names.begin(), "', ...) is missing from ", dir),
          "copy every shard the index names into the directory");
    out.files.emplace_back(path, std::move(names));
  }
  return out;
}

// The file name of shard `path` (messages name the shard as the index does).
std::string base_name(const std::string& path) { return fs::path(path).filename().string(); }

}  // namespace

HfWeights read_hf_weights(const std::string& dir) {
  const WeightFiles w = weight_files(dir);
  HfWeights out{{}, w.source};
  for (const auto& [path, names] : w.files) {
    SafetensorsFile f = read_safetensors_f32(path);
    if (w.sharded) check_shard(w.source, base_name(path), names, f.tensors);
    for (NamedTensor& nt : f.tensors) out.tensors.push_back(std::move(nt));
  }
  return out;
}

HfHeaders read_hf_headers(const std::string& dir) {
  const WeightFiles w = weight_files(dir);
  HfHeaders out{{}, w.source};
  for (const auto& [path, names] : w.files) {
    const std::vector<SafetensorsEntry> entries = read_safetensors_f32_header(path);
    if (w.sharded) check_shard(w.source, base_name(path), names, entries);
    for (const SafetensorsEntry& e : entries) out.shapes.emplace(e.name, e.shape);
  }
  return out;
}

namespace {

constexpr char kSameModel[] =
    "config.json and the weights must come from one save_pretrained(); fix the field, or use the "
    "config.json of these weights";

}  // namespace

int64_t hf_config_size(const json& j, const std::string& path, const char* field) {
  const json* v = j.contains(field) ? &j[field] : nullptr;
  if (v != nullptr && v->is_number_integer() && v->get<int64_t>() > 0 &&
      v->get<int64_t>() <= kMaxHfConfigSize)
    return v->get<int64_t>();
  throw UserError(str_cat("Hugging Face config '", path, "': field '", field, "' is ",
                          v != nullptr ? v->dump() : "missing", ", expected a positive integer at ",
                          "most ", kMaxHfConfigSize, "; hint: config.json holds the sizes ",
                          "save_pretrained() wrote for these weights: restore it from the model's ",
                          "source"));
}

void check_size_against_tensor(const HfHeaders& h, const std::string& config,
                               const std::string& field, int64_t value, const std::string& tensor,
                               int dim) {
  auto it = h.shapes.find(tensor);
  if (it == h.shapes.end())
    throw UserError(str_cat("Hugging Face config '", config, "': field '", field, "' (", value,
                            ") sizes tensor '", tensor, "', which '", h.source,
                            "' does not hold; hint: ", kSameModel));
  const Shape& shape = it->second;
  if (dim >= shape.rank() || value > shape[dim])
    throw UserError(str_cat("Hugging Face config '", config, "': field '", field, "' is ", value,
                            ", larger than the tensor it sizes: '", tensor, "' in '", h.source,
                            "' is ", shape.str(), " (dimension ", dim, "); hint: ", kSameModel));
}

void check_layers_against_tensors(const HfHeaders& h, const std::string& config,
                                  const std::string& field, int64_t value,
                                  const std::vector<std::string>& prefixes) {
  std::set<std::string> layers;  // i as written
  for (const auto& [name, shape] : h.shapes) {
    for (const std::string& prefix : prefixes) {
      if (name.rfind(prefix, 0) != 0) continue;
      const size_t dot = name.find('.', prefix.size());
      const std::string i = name.substr(prefix.size(), dot - prefix.size());
      if (dot != std::string::npos && !i.empty() &&
          i.find_first_not_of("0123456789") == std::string::npos)
        layers.insert(i);
    }
  }
  if (value > static_cast<int64_t>(layers.size()))
    throw UserError(str_cat("Hugging Face config '", config, "': field '", field, "' is ", value,
                            ", more layers than '", h.source, "' holds (", layers.size(),
                            ": tensors named ", prefixes[0], "<i>.*); hint: ", kSameModel));
}

}  // namespace gtron
