// gtron import --hf of what transformers writes beyond gtron's own fp32 single-file export, through
// the CLI: bf16 and f16 weights (alone and mixed with f32 in one file) are widened exactly, so the
// import equals the import of an fp32 file holding the same values; a sharded checkpoint
// (model.safetensors.index.json + shards) imports to the same bytes as the single file;
// transformers 5's rope_parameters gives the same checkpoint as rope_theta + rope_scaling. Both
// families (GPT-2 and llama). Every malformed input exits 2 naming the file, field or tensor, and
// leaves no output folder (nor a temporary one) behind.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "tests/trainer/cli_util.h"
#include "trainer/io/safetensors.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using testing::CmdResult;
using testing::expect_ok;
using testing::read_text;
using testing::run_command;
using testing::run_gtron;
using testing::temp_dir;
using testing::train_checkpoint;
using testing::write_text;

// V = 100 pads to Vp = 128. The llama model has llama3 RoPE scaling and an untied head.
const char kLlamaConfig[] = R"({
  "model": {"arch": "llama", "vocab_size": 100, "context_length": 16, "n_layer": 2, "n_head": 4,
            "n_kv_head": 2, "intermediate_size": 24, "n_embd": 16, "tied_embeddings": false,
            "rope_scaling": {"type": "llama3", "original_max_position_embeddings": 8}},
  "data": {"synthetic": {"vocab": 100, "tokens": 20000, "val_tokens": 2000}},
  "train": {"steps": 2, "global_batch": 4, "micro_batch": 2, "seq_len": 16, "device": "cpu",
            "eval_batches": 1},
  "log": {"every": 1}
})";
const char kGpt2Config[] = R"({
  "model": {"vocab_size": 100, "context_length": 16, "n_layer": 2, "n_head": 2, "n_embd": 16},
  "data": {"synthetic": {"vocab": 100, "tokens": 20000, "val_tokens": 2000}},
  "train": {"steps": 2, "global_batch": 4, "micro_batch": 2, "seq_len": 16, "device": "cpu",
            "eval_batches": 1},
  "log": {"every": 1}
})";

// A tensor as it goes into a hand-written safetensors file.
struct RawTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", ...
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A safetensors file as another tool writes it (no CRC), tensors back to back in `tensors`' order.
void write_raw(const std::string& path, const std::vector<RawTensor>& tensors) {
  json header = json::object();
  std::string data;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  const std::string text = header.dump();
  write_text(path, le64(text.size()) + text + data);
}

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// A half-precision pattern near x, by truncation (flushing below the normal range to zero): any
// half will do, since the expected file holds the value of the half chosen.
uint16_t to_half(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (x == 0) return sign;
  int e = 0;
  const double m = std::frexp(std::fabs(static_cast<double>(x)), &e);  // x = m * 2^e, m in [.5, 1)
  const int biased = e - 1 + 15;
  if (biased < 1) return sign;
  if (biased > 30) return sign | 0x7bff;
  const int man = static_cast<int>((2 * m - 1) * 1024);
  return static_cast<uint16_t>(sign | (biased << 10) | man);
}

// The value of a normal or zero half, from the format's definition.
float half_value(uint16_t h) {
  const int biased = (h >> 10) & 0x1f, man = h & 0x3ff;
  const float v = biased == 0 ? 0.0f : std::ldexp(1.0f + man / 1024.0f, biased - 15);
  return (h & 0x8000) ? -v : v;
}

enum class Narrow { kKeep, kBf16, kF16 };

// Rewrites the fp32 file `path` with every tensor narrowed as `how(index)` says: written as
// `narrow_path` (a foreign file with BF16/F16/F32 tensors), and as `expect_path` (fp32, each value
// the one the narrowed file holds). Returns how many values the narrowing changed.
int64_t narrow_file(const std::string& path, const std::function<Narrow(size_t)>& how,
                    const std::string& narrow_path, const std::string& expect_path) {
  const SafetensorsFile in = read_safetensors(path);
  std::vector<RawTensor> narrow;
  std::vector<NamedTensor> expect;
  int64_t changed = 0;
  for (size_t i = 0; i < in.tensors.size(); ++i) {
    const Tensor& t = in.tensors[i].tensor;
    const float* x = t.data<float>();
    Tensor widened = Tensor::empty(t.shape(), DType::kF32);
    float* w = widened.data<float>();
    std::vector<uint16_t> bits(t.numel());
    const Narrow n = how(i);
    for (int64_t k = 0; k < t.numel(); ++k) {
      if (n == Narrow::kBf16) {
        bits[k] = float_to_bf16(x[k]).bits;  // round to nearest even
        w[k] = bf16_to_float(BF16{bits[k]});
      } else if (n == Narrow::kF16) {
        bits[k] = to_half(x[k]);
        w[k] = half_value(bits[k]);
      } else {
        w[k] = x[k];
      }
      changed += w[k] != x[k];
    }
    const std::string& name = in.tensors[i].name;
    if (n == Narrow::kKeep) {
      narrow.push_back({name, "F32", t.shape().vec(),
                        std::string(static_cast<const char*>(t.raw()), t.nbytes())});
    } else {
      narrow.push_back(
          {name, n == Narrow::kBf16 ? "BF16" : "F16", t.shape().vec(), bytes_of(bits)});
    }
    expect.push_back({name, widened});
  }
  write_raw(narrow_path, narrow);
  write_safetensors(expect_path, expect, in.metadata);
  return changed;
}

// Splits DIR/model.safetensors into `n` shards (tensor i into shard i % n) plus the index, and
// removes the single file. Returns the weight_map written.
json shard(const std::string& dir, int n) {
  const SafetensorsFile in = read_safetensors(dir + "/model.safetensors");
  std::vector<std::vector<NamedTensor>> shards(n);
  json map = json::object();
  int64_t total = 0;
  for (size_t i = 0; i < in.tensors.size(); ++i) {
    const std::string file =
        "model-0000" + std::to_string(i % n + 1) + "-of-0000" + std::to_string(n) + ".safetensors";
    shards[i % n].push_back(in.tensors[i]);
    map[in.tensors[i].name] = file;
    total += in.tensors[i].tensor.nbytes();
  }
  for (int s = 0; s < n; ++s) {
    write_safetensors(dir + "/model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(n) +
                          ".safetensors",
                      shards[s], in.metadata);
  }
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  write_text(dir + "/model.safetensors.index.json", index.dump(2));
  fs::remove(dir + "/model.safetensors");
  return map;
}

void edit_json(const std::string& path, const std::function<void(json&)>& edit) {
  json j = json::parse(read_text(path));
  edit(j);
  write_text(path, j.dump(2));
}

// Rewrites the header of safetensors file `path` through `edit`, keeping its data bytes.
void edit_header(const std::string& path, const std::function<void(json&)>& edit) {
  const std::string bytes = read_text(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  json header = json::parse(bytes.substr(8, n));
  header["__metadata__"].erase("gtron.crc32");
  edit(header);
  const std::string text = header.dump();
  write_text(path, le64(text.size()) + text + bytes.substr(8 + n));
}

class HfImport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(temp_dir("hf_import"));
    for (const auto& [name, config] :
         {std::pair<std::string, const char*>{"llama", kLlamaConfig}, {"gpt2", kGpt2Config}}) {
      fs::create_directories(*dir_ + "/" + name);
      const std::string ckpt = train_checkpoint(config, *dir_ + "/" + name, "run", {}, 2);
      const std::string hf = *dir_ + "/" + name + "/hf";
      ASSERT_EQ(run_gtron({"export", "--checkpoint", ckpt, "--hf", hf}).exit_code, 0);
      ASSERT_EQ(run_gtron({"import", "--hf", hf, "--out", hf + "_ref"}).exit_code, 0);
    }
  }
  // A fresh copy of family `family`'s export to change.
  static std::string copy(const std::string& family, const std::string& name) {
    const std::string from = *dir_ + "/" + family + "/hf", to = *dir_ + "/" + family + "/" + name;
    run_command("rm -rf '" + to + "' '" + to + "_ckpt' && cp -r '" + from + "' '" + to + "'");
    return to;
  }
  static std::string reference(const std::string& family) {
    return *dir_ + "/" + family + "/hf_ref";
  }
  // Imports `hf` into hf + "_ckpt", EXPECTing success; returns the checkpoint folder.
  static std::string import_ok(const std::string& hf) {
    expect_ok({"import", "--hf", hf, "--out", hf + "_ckpt"});
    return hf + "_ckpt";
  }
  // The two checkpoints hold the same weights and the same trainer state (step, seed, config).
  static void expect_same_checkpoint(const std::string& a, const std::string& b) {
    const std::string weights = read_text(a + "/model.safetensors");
    ASSERT_GT(weights.size(), 1000u) << a;
    EXPECT_TRUE(weights == read_text(b + "/model.safetensors")) << a << " and " << b << " differ";
    EXPECT_EQ(read_text(a + "/trainer_state.json"), read_text(b + "/trainer_state.json"));
  }
  static void expect_import_error(const std::string& hf, const std::string& needle) {
    const std::string out = hf + "_ckpt";
    const CmdResult r = run_gtron({"import", "--hf", hf, "--out", out});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in\n"
                                                        << r.output;
    EXPECT_FALSE(fs::exists(out)) << "a failed import left " << out;
    for (const auto& e : fs::directory_iterator(fs::path(out).parent_path()))
      EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << "left " << e.path();
  }
  static std::string* dir_;
};
std::string* HfImport::dir_ = nullptr;

// Every tensor bf16 (rounded to nearest even), both families: the import equals that of an fp32
// file holding the rounded values, so the widening is exact.
TEST_F(HfImport, Bf16EqualsTheFp32ImportOfTheRoundedValues) {
  for (const std::string family : {"llama", "gpt2"}) {
    SCOPED_TRACE(family);
    const std::string bf16 = copy(family, "bf16"), rounded = copy(family, "rounded");
    const int64_t changed = narrow_file(
        bf16 + "/model.safetensors", [](size_t) { return Narrow::kBf16; },
        bf16 + "/model.safetensors", rounded + "/model.safetensors");
    EXPECT_GT(changed, 1000) << "rounding to bf16 changed almost nothing: the test proves little";
    EXPECT_EQ(read_safetensors(bf16 + "/model.safetensors").tensors[0].tensor.dtype(),
              DType::kBF16);
    const std::string from_bf16 = import_ok(bf16);
    expect_same_checkpoint(from_bf16, import_ok(rounded));
    EXPECT_FALSE(read_text(from_bf16 + "/model.safetensors") ==
                 read_text(reference(family) + "/model.safetensors"));
  }
}

// BF16, F16 and F32 tensors in one file (and MTP-free llama): each is widened on its own.
TEST_F(HfImport, MixedDtypesInOneFileWidenEachTensor) {
  const std::string mixed = copy("llama", "mixed"), expect = copy("llama", "mixed_expect");
  const int64_t changed = narrow_file(
      mixed + "/model.safetensors", [](size_t i) { return static_cast<Narrow>(i % 3); },
      mixed + "/model.safetensors", expect + "/model.safetensors");
  EXPECT_GT(changed, 100);
  std::set<DType> seen;
  for (const NamedTensor& nt : read_safetensors_f32(mixed + "/model.safetensors").tensors)
    seen.insert(nt.tensor.dtype());
  EXPECT_EQ(seen, std::set<DType>{DType::kF32});
  expect_same_checkpoint(import_ok(mixed), import_ok(expect));
}

TEST_F(HfImport, ShardedEqualsSingleFile) {
  for (const auto& [family, n] : {std::pair<std::string, int>{"llama", 3}, {"gpt2", 2}}) {
    SCOPED_TRACE(family);
    const std::string hf = copy(family, "sharded");
    const json map = shard(hf, n);
    EXPECT_FALSE(fs::exists(hf + "/model.safetensors"));
    EXPECT_EQ(map.size(),
              read_safetensors(*dir_ + "/" + family + "/hf/model.safetensors").tensors.size());
    expect_same_checkpoint(import_ok(hf), reference(family));
  }
  // Sharded and bf16 at once.
  const std::string hf = copy("llama", "sharded_bf16"), rounded = copy("llama", "sharded_rounded");
  narrow_file(
      hf + "/model.safetensors", [](size_t) { return Narrow::kBf16; }, hf + "/model.safetensors",
      rounded + "/model.safetensors");
  shard(hf, 2);
  expect_same_checkpoint(import_ok(hf), import_ok(rounded));
}

// transformers 5's rope_parameters in place of rope_theta + rope_scaling.
TEST_F(HfImport, RopeParametersEqualsRopeScaling) {
  const json llama3 = json::parse(R"({"rope_type": "llama3", "rope_theta": 500000.0,
      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8})");
  std::string hf = copy("llama", "rope_parameters");
  edit_json(hf + "/config.json", [&](json& c) {
    EXPECT_EQ(c["rope_scaling"]["rope_type"], "llama3");
    c.erase("rope_theta");
    c.erase("rope_scaling");
    c["rope_parameters"] = llama3;
  });
  expect_same_checkpoint(import_ok(hf), reference("llama"));

  hf = copy("llama", "rope_both");  // both forms, agreeing; theta from the top level only
  edit_json(hf + "/config.json", [&](json& c) {
    c["rope_parameters"] = llama3;
    c["rope_parameters"].erase("rope_theta");
  });
  expect_same_checkpoint(import_ok(hf), reference("llama"));

  // No scaling: rope_type "default" equals a null rope_scaling (and differs from llama3).
  const std::string null_scaling = copy("llama", "rope_null");
  edit_json(null_scaling + "/config.json", [](json& c) { c["rope_scaling"] = nullptr; });
  hf = copy("llama", "rope_default");
  edit_json(hf + "/config.json", [](json& c) {
    c.erase("rope_scaling");
    c.erase("rope_theta");
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  });
  const std::string from_default = import_ok(hf);
  expect_same_checkpoint(from_default, import_ok(null_scaling));
  EXPECT_NE(read_text(from_default + "/trainer_state.json"),
            read_text(reference("llama") + "/trainer_state.json"));
}

TEST_F(HfImport, BadRopeParametersAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0})",
       "field 'rope_parameters.rope_type' is \"yarn\""},
      {R"({"rope_theta": 500000.0})", "field 'rope_parameters.rope_type' is missing"},
      {R"({"rope_type": "llama3", "rope_theta": 500000.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8})",
       "field 'rope_parameters.factor' is missing"},
      {R"({"rope_type": "llama3", "rope_theta": 500000.0, "factor": -8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8})",
       "field 'rope_parameters.factor' is -8.0"},
      {R"({"rope_type": "default", "rope_theta": 0})", "field 'rope_parameters.rope_theta' is 0"},
      {R"({"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5})",
       "field 'rope_parameters.partial_rotary_factor' is 0.5"},
      {R"([1, 2])", "field 'rope_parameters' is [1,2]"},
      // Disagreements with the older fields, which the export writes too.
      {R"({"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8})",
       "fields 'rope_theta' and 'rope_parameters.rope_theta' disagree"},
      {R"({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 4.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8})",
       "fields 'rope_scaling' and 'rope_parameters' disagree"},
      {R"({"rope_type": "default", "rope_theta": 500000.0})",
       "fields 'rope_scaling' and 'rope_parameters' disagree"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].first);
    const std::string hf = copy("llama", "rope_bad" + std::to_string(i));
    edit_json(hf + "/config.json",
              [&](json& c) { c["rope_parameters"] = json::parse(cases[i].first); });
    expect_import_error(hf, cases[i].second);
  }
}

TEST_F(HfImport, CorruptSafetensorsAreNamed) {
  const std::string file = "model.safetensors";
  std::string hf = copy("llama", "header_too_long");
  std::string bytes = read_text(hf + "/" + file);
  write_text(hf + "/" + file, le64(bytes.size()) + bytes.substr(8));
  expect_import_error(hf, file + "': bad header length");

  hf = copy("llama", "data_short");
  write_text(hf + "/" + file, bytes.substr(0, bytes.size() - 64));
  expect_import_error(hf, file + "': tensor 'lm_head.weight' ends at data offset");

  hf = copy("llama", "bad_header_json");
  bytes[9] = '#';
  write_text(hf + "/" + file, bytes);
  expect_import_error(hf, file + "': the header is not valid JSON");

  hf = copy("llama", "overlap");
  edit_header(hf + "/" + file, [](json& h) {
    json& o = h["model.norm.weight"]["data_offsets"];
    o = {o[0].get<int64_t>() - 4, o[1].get<int64_t>() - 4};
  });
  expect_import_error(hf, "tensor 'model.norm.weight' overlaps the previous tensor");

  hf = copy("llama", "out_of_range");  // the last tensor one row longer than the data
  edit_header(hf + "/" + file, [](json& h) {
    json& t = h["lm_head.weight"];
    t["shape"][0] = t["shape"][0].get<int64_t>() + 1;
    t["data_offsets"][1] = t["data_offsets"][1].get<int64_t>() + 16 * 4;
  });
  expect_import_error(hf, "tensor 'lm_head.weight' ends at data offset");

  for (const char* dtype : {"F64", "I8"}) {  // not widened exactly (or not a weight at all)
    hf = copy("llama", std::string("dtype_") + dtype);
    SafetensorsFile f = read_safetensors(hf + "/" + file);
    std::vector<RawTensor> raw;
    for (const NamedTensor& nt : f.tensors) {
      const std::string b(static_cast<const char*>(nt.tensor.raw()), nt.tensor.nbytes());
      if (nt.name == "model.norm.weight") {  // [16] f32 -> 64 bytes: 8 F64 or 64 I8 values
        raw.push_back({nt.name, dtype, {std::string(dtype) == "F64" ? 8 : 64}, b});
      } else {
        raw.push_back({nt.name, "F32", nt.tensor.shape().vec(), b});
      }
    }
    write_raw(hf + "/" + file, raw);
    expect_import_error(hf, str_cat("tensor 'model.norm.weight' has dtype \"", dtype, "\""));
  }

  hf = copy("llama", "bf16_shape");  // a bf16 tensor of the wrong shape: named after widening
  narrow_file(
      hf + "/" + file, [](size_t) { return Narrow::kBf16; }, hf + "/" + file, hf + "/ignored");
  edit_header(hf + "/" + file, [](json& h) {
    h["model.layers.0.mlp.down_proj.weight"]["shape"] = {24, 16};  // [C, F] = [16, 24]
  });
  expect_import_error(hf,
                      "tensor 'model.layers.0.mlp.down_proj.weight' is [24, 16] f32, the "
                      "model expects [16, 24] f32");
}

TEST_F(HfImport, InconsistentShardsAreNamed) {
  const std::string index = "model.safetensors.index.json";
  const std::string s1 = "model-00001-of-00002.safetensors",
                    s2 = "model-00002-of-00002.safetensors";
  // A sharded copy whose index or shards `edit` then spoils.
  auto sharded = [&](const std::string& name) {
    const std::string hf = copy("llama", name);
    shard(hf, 2);
    return hf;
  };
  const std::string first = "model.embed_tokens.weight";               // tensor 0: in shard 1
  const std::string second = "model.layers.0.input_layernorm.weight";  // tensor 1: in shard 2

  std::string hf = sharded("shard_missing");
  fs::remove(hf + "/" + s2);
  expect_import_error(hf, index + "': shard '" + s2 + "'");
  expect_import_error(hf, "is missing");

  hf = sharded("tensor_not_in_shard");  // the map sends `first` to shard 2
  edit_json(hf + "/" + index, [&](json& j) { j["weight_map"][first] = s2; });
  expect_import_error(hf, "shard '" + s1 + "' holds tensor '" + first +
                              "', which weight_map does not map to that shard");

  hf = sharded("tensor_absent");  // mapped, but no shard holds it
  edit_json(hf + "/" + index, [&](json& j) { j["weight_map"]["model.extra.weight"] = s1; });
  expect_import_error(hf, "weight_map maps tensor 'model.extra.weight' to shard '" + s1 +
                              "', which does not hold it");

  hf = sharded("tensor_unmapped");  // in a shard, not in the map
  edit_json(hf + "/" + index, [&](json& j) { j["weight_map"].erase(second); });
  expect_import_error(hf, "shard '" + s2 + "' holds tensor '" + second + "'");

  hf = sharded("tensor_missing");  // in neither: the model's own check names it
  edit_json(hf + "/" + index, [&](json& j) { j["weight_map"].erase(second); });
  SafetensorsFile f = read_safetensors(hf + "/" + s2);
  std::vector<NamedTensor> kept;
  for (NamedTensor& nt : f.tensors)
    if (nt.name != second) kept.push_back(nt);
  write_safetensors(hf + "/" + s2, kept, f.metadata);
  expect_import_error(hf, "has no tensor '" + second + "'");

  hf = sharded("both_files");
  fs::copy_file(*dir_ + "/llama/hf/model.safetensors", hf + "/model.safetensors");
  expect_import_error(hf, "has both model.safetensors and " + index);

  hf = sharded("index_not_json");
  write_text(hf + "/" + index, "{\"weight_map\": {");
  expect_import_error(hf, index + "': not valid JSON");

  hf = sharded("no_weight_map");
  write_text(hf + "/" + index, "{\"metadata\": {}}");
  expect_import_error(hf, index + "': field 'weight_map' is missing");

  for (const std::string& bad :
       std::vector<std::string>{"../" + s1, "sub/" + s1, "sub\\" + s1, "..", ""}) {
    SCOPED_TRACE(bad);
    hf = sharded("separator");
    edit_json(hf + "/" + index, [&](json& j) { j["weight_map"][first] = bad; });
    expect_import_error(hf, "is shard file name \"" + bad + "\"");
  }

  hf = sharded("bad_shard_bytes");  // a corrupt shard is named like a corrupt single file
  const std::string bytes = read_text(hf + "/" + s1);
  write_text(hf + "/" + s1, bytes.substr(0, bytes.size() - 8));
  expect_import_error(hf, s1 + "': tensor ");
}

}  // namespace
}  // namespace gtron
