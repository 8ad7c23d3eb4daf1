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

HfWeights read_sharded(const std::string& dir, const std::string& index) {
  HfWeights out{{}, index};
  for (const auto& [file, names] : shard_names(index)) {
    const std::string path = dir + "/" + file;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      index_fail(
          index,
          str_cat("shard '", file, "' (holding '", *names.begin(), "', ...) is missing from ", dir),
          "copy every shard the index names into the directory");
    std::set<std::string> found;
    for (NamedTensor& nt : read_safetensors_f32(path).tensors) {
      if (names.count(nt.name) == 0)
        index_fail(index,
                   str_cat("shard '", file, "' holds tensor '", nt.name,
                           "', which weight_map does not map to that shard"),
                   kResave);
      found.insert(nt.name);
      out.tensors.push_back(std::move(nt));
    }
    for (const std::string& name : names) {
      if (found.count(name) == 0)
        index_fail(index,
                   str_cat("weight_map maps tensor '", name, "' to shard '", file,
                           "', which does not hold it"),
                   kResave);
    }
  }
  return out;
}

}  // namespace

HfWeights read_hf_weights(const std::string& dir) {
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
  if (has_index) return read_sharded(dir, index);
  if (!has_single)
    throw UserError(str_cat("Hugging Face directory '", dir, "' has no ", kModelFile, " (nor ",
                            kIndexFile, "); hint: save it with save_pretrained(..., ",
                            "safe_serialization=True)"));
  return {read_safetensors_f32(single).tensors, single};
}

}  // namespace gtron
