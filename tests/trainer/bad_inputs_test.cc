// No input makes gtron abort: a table of bad flags, config values, shards, checkpoint files,
// sampling parameters, tokenizer.json ids, Hugging Face config.json sizes and safetensors headers,
// each fed to the real binary, must exit with code 2 and a message naming the input (for a file:
// the file and the field), and write nothing (the test folder's listing is unchanged, no output
// appears). Every case runs under an address-space limit (kMemoryLimitKiB), so one that allocates
// in proportion to a bad number fails here (std::bad_alloc, exit 1) instead of passing because
// the machine had the memory.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "tests/trainer/cli_util.h"
#include "trainer/data/shards.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using testing::CmdResult;
using testing::read_text;
using testing::run_command;
using testing::run_gtron;
using testing::temp_dir;
using testing::write_text;

// RLIMIT_AS of every case's gtron (ulimit -v in its shell, before exec): room for the binary, its
// shared libraries and a tiny model, far below what a bad number would ask for.
constexpr int64_t kMemoryLimitKiB = int64_t{4} << 20;  // 4 GiB

CmdResult run_gtron_limited(const std::vector<std::string>& args) {
  std::string cmd = "ulimit -v " + std::to_string(kMemoryLimitKiB) + " && exec trainer/gtron";
  for (const std::string& a : args) cmd += " '" + a + "'";
  return run_command(cmd);
}

const char kConfig[] = R"({
  "model": {"vocab_size": 64, "context_length": 16, "n_layer": 1, "n_head": 2, "n_embd": 16},
  "mtp": {"depth": 1},
  "data": {"synthetic": {"tokens": 20000, "val_tokens": 2000}},
  "train": {"steps": 2, "global_batch": 4, "micro_batch": 2, "seq_len": 16, "device": "cpu"},
  "log": {"every": 1}
})";

// A byte-level BPE tokenizer.json listing five tokens (four in model.vocab, <|endoftext|> also in
// added_tokens and the template's leading id); @B@, @EOT@ and @TPL@ stand for the ids of "b", of
// the added token and of the template's special token (1, 3, 3 in a good file).
const char kTokenizer[] = R"({"version": "1.0",
  "added_tokens": [{"id": @EOT@, "content": "<|endoftext|>", "special": true, "normalized": false}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": true},
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
               {"Sequence": {"id": "A", "type_id": 0}}],
    "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [@TPL@],
                                         "tokens": ["<|endoftext|>"]}}},
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "vocab": {"a": 0, "b": @B@, "ab": 2, "<|endoftext|>": 3},
            "merges": ["a b"]}})";

std::string tokenizer_json(const std::string& b, const std::string& eot, const std::string& tpl) {
  std::string t = kTokenizer;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"@B@", b}, {"@EOT@", eot}, {"@TPL@", tpl}}) {
    t.replace(t.find(key), key.size(), value);
  }
  return t;
}

// Rewrites the JSON header of safetensors file `path` through `edit`; the data stay as they are.
void edit_header(const std::string& path, const std::function<void(json&)>& edit) {
  const std::string bytes = read_text(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  json header = json::parse(bytes.substr(8, n));
  edit(header);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(text.size() >> (8 * i));
  write_text(path, len + text + bytes.substr(8 + n));
}

// Overwrites the little-endian u64 or u32 at byte `at` of file `path` with `value`.
void patch_le(const std::string& path, size_t at, uint64_t value, int bytes) {
  std::string data = read_text(path);
  for (int i = 0; i < bytes; ++i) data[at + i] = static_cast<char>(value >> (8 * i));
  write_text(path, data);
}

std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    out.insert(e.path().string() +
               (e.is_regular_file() ? ":" + std::to_string(e.file_size()) : ""));
  }
  return out;
}

struct Case {
  std::string name;
  std::vector<std::string> args;  // {"@train", ...} = train --config C --out DIR/out_<name> ...;
                                  // an argument "@out" becomes DIR/out_<name>
  std::string expect;             // a substring of the message: the input it names
  std::string expect_too = "";    // another (a file's case: the file, and the field above)
};

class BadInputs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(temp_dir("bad_inputs"));
    write_text(*dir_ + "/c.json", kConfig);
    auto r = run_gtron({"train", "--config", *dir_ + "/c.json", "--out", *dir_ + "/run"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  void run_table(const std::vector<Case>& cases) {
    for (const Case& c : cases) {
      std::vector<std::string> args = c.args;
      const std::string out = *dir_ + "/out_" + c.name;
      if (!args.empty() && args[0] == "@train") {
        args.erase(args.begin());
        args.insert(args.begin(), {"train", "--config", *dir_ + "/c.json", "--out", out});
      }
      for (std::string& a : args)
        if (a == "@out") a = out;
      const std::set<std::string> before = listing(*dir_);
      auto r = run_gtron_limited(args);
      EXPECT_EQ(r.exit_code, 2) << c.name << "\n" << r.output;
      for (const std::string& want : {c.expect, c.expect_too}) {
        EXPECT_NE(r.output.find(want), std::string::npos)
            << c.name << ": expected '" << want << "' in:\n"
            << r.output;
      }
      EXPECT_EQ(r.output.find("fatal"), std::string::npos) << c.name << "\n" << r.output;
      EXPECT_FALSE(fs::exists(out)) << c.name << ": created " << out;
      EXPECT_EQ(listing(*dir_), before) << c.name << ": wrote or changed files";
    }
  }
  // A copy of the Hugging Face directory `from` as DIR/`name`, its config.json's `field` set to
  // the JSON `value`.
  static std::string hf_with(const std::string& from, const std::string& name,
                             const std::string& field, const std::string& value) {
    const std::string to = *dir_ + "/" + name;
    run_command("rm -rf '" + to + "' && cp -r '" + from + "' '" + to + "'");
    json config = json::parse(read_text(to + "/config.json"));
    config[field] = json::parse(value);
    write_text(to + "/config.json", config.dump(2));
    return to;
  }
  // DIR/hf_<arch>: the export of a run of kConfig as `arch` (gpt2: V 64, C 16, Tmax 16, L 1,
  // NH 2; llama: the same with NKV 1, HS 8, F 24). It imports under the memory limit.
  static std::string hf_export(const std::string& arch) {
    const std::string hf = *dir_ + "/hf_" + arch;
    if (fs::exists(hf)) return hf;
    std::string ckpt = *dir_ + "/run/checkpoints/step_00000002";
    if (arch == "llama") {
      auto r = run_gtron({"train", "--config", *dir_ + "/c.json", "--out", *dir_ + "/run_llama",
                          "--set", "model.arch=llama", "--set", "model.n_kv_head=1", "--set",
                          "model.intermediate_size=24"});
      EXPECT_EQ(r.exit_code, 0) << r.output;
      ckpt = *dir_ + "/run_llama/checkpoints/step_00000002";
    }
    auto r = run_gtron({"export", "--checkpoint", ckpt, "--hf", hf});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    r = run_gtron_limited({"import", "--hf", hf, "--out", hf + "_imported"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return hf;
  }
  static std::string* dir_;
};
std::string* BadInputs::dir_ = nullptr;

TEST_F(BadInputs, ConfigValuesAndSizes) {
  write_text(*dir_ + "/inf.json", R"({"optimizer": {"lr": 1e999}})");
  run_table({
      {"inf_in_file", {"train", "--config", *dir_ + "/inf.json"}, "inf.json"},
      {"inf_set", {"@train", "--set", "optimizer.lr=1e999"}, "optimizer.lr"},
      {"nan_set", {"@train", "--set", "optimizer.lr=nan"}, "optimizer.lr"},
      {"negative_steps", {"@train", "--set", "train.steps=-3"}, "train.steps"},
      {"huge_embd",
       {"@train", "--set", "model.n_embd=1000000", "--set", "model.n_head=1"},
       "model.n_embd 1000000"},
      {"huge_vocab", {"@train", "--set", "model.vocab_size=100000000000"}, "model.vocab_size"},
      {"huge_layers", {"@train", "--set", "model.n_layer=9223372036854775807"}, "model.n_layer"},
      {"huge_context",
       {"@train", "--set", "model.context_length=9223372036854775807"},
       "model.context_length"},
      {"huge_micro_batch",
       {"@train", "--set", "train.micro_batch=100000000", "--set", "train.global_batch=100000000"},
       "train.micro_batch"},
      {"huge_synthetic",
       {"@train", "--set", "data.synthetic.tokens=3000000000"},
       "data.synthetic.tokens"},
      {"markov_table", {"@train", "--set", "data.synthetic.order=8"}, "data.synthetic.order"},
      {"metrics_folder",
       {"@train", "--set", "log.metrics_file=/proc/gtron_no/m.jsonl"},
       "log.metrics_file"},
      {"empty_out",
       {"train", "--config", *dir_ + "/c.json", "--set", "train.out_dir="},
       "train.out_dir"},
  });
}

TEST_F(BadInputs, FlagsShardsAndCheckpoints) {
  std::vector<uint32_t> tokens(400, 3);
  write_shard(*dir_ + "/ok.bin", tokens, kShardVersionU16);
  tokens[10] = 64;  // == vocab_size
  write_shard(*dir_ + "/vocab.bin", tokens, kShardVersionU16);
  write_text(*dir_ + "/empty.bin", "");
  const std::string ckpt = *dir_ + "/run/checkpoints/step_00000002";
  run_table({
      {"resume_overwrite", {"@train", "--resume", "--overwrite"}, "--overwrite"},
      {"init_missing", {"@train", "--init", *dir_ + "/no_ckpt"}, "no_ckpt"},
      {"init_mismatch",
       {"@train", "--init", ckpt, "--set", "model.n_layer=2"},
       "model.n_layer: checkpoint 1, config 2"},
      {"train_vocab", {"@train", "--set", "data.train=" + *dir_ + "/vocab.bin"}, "vocab.bin"},
      {"train_empty", {"@train", "--set", "data.train=" + *dir_ + "/empty.bin"}, "empty.bin"},
      {"val_vocab",
       {"@train", "--set", "data.train=" + *dir_ + "/ok.bin", "--set",
        "data.val=" + *dir_ + "/vocab.bin"},
       "data.val"},
      {"earlier_run",
       {"train", "--config", *dir_ + "/c.json", "--out", *dir_ + "/run"},
       "holds an earlier run"},
      {"eval_mismatch",
       {"eval", "--checkpoint", ckpt, "--set", "model.n_embd=32"},
       "model.n_embd: checkpoint 16, config 32"},
      {"eval_val",
       {"eval", "--checkpoint", ckpt, "--set", "data.val=" + *dir_ + "/vocab.bin"},
       "vocab.bin"},
      {"logits_id",
       {"logits", "--checkpoint", ckpt, "--tokens", "1,64", "--out", *dir_ + "/l"},
       "'64' is not a token id"},
      {"logits_long",
       {"logits", "--checkpoint", ckpt, "--tokens", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17",
        "--out", *dir_ + "/l"},
       "model.context_length = 16"},
  });
}

TEST_F(BadInputs, SamplingParameters) {
  const std::string ckpt = *dir_ + "/run/checkpoints/step_00000002";
  const std::vector<std::string> s = {"sample",      "--checkpoint", ckpt,
                                      "--print-ids", "--tokens",     "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = s;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  run_table({
      {"temperature_nan", with({"--prompt-ids", "1", "--temperature", "nan"}), "--temperature"},
      {"temperature_neg", with({"--prompt-ids", "1", "--temperature", "-1"}), "--temperature"},
      {"top_p_nan", with({"--prompt-ids", "1", "--top-p", "nan"}), "--top-p"},
      {"top_p_zero", with({"--prompt-ids", "1", "--top-p", "0"}), "--top-p"},
      {"top_k_negative", with({"--prompt-ids", "1", "--top-k", "-1"}), "--top-k"},
      {"tokens_zero", with({"--prompt-ids", "1", "--tokens", "0"}), "--tokens"},
      {"tokens_huge", with({"--prompt-ids", "1", "--tokens", "99999999999"}), "--tokens"},
      {"batch_huge", with({"--prompt-ids", "1", "--batch", "100000000"}), "--batch"},
      {"id_range", with({"--prompt-ids", "1,99"}), "--prompt-ids"},
      {"id_overflow", with({"--prompt-ids", "99999999999999999999"}), "--prompt-ids"},
      {"id_syntax", with({"--prompt-ids", "1,,2"}), "--prompt-ids"},
      {"prompt_long", with({"--prompt-ids", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16"}),
       "at most 15 tokens"},
      {"text_prompt", with({"--prompt", "hello"}), "vocab_size"},
      {"speculative_recompute", with({"--prompt-ids", "1", "--speculative", "--recompute"}),
       "--recompute"},
      {"device", with({"--prompt-ids", "1", "--device", "tpu"}), "--device"},
  });
}

// Ids in tokenizer.json: beyond the tokens the file lists, at 2^31 and 2^40 (which an int32 cast
// would wrap), negative; in model.vocab, added_tokens and the template. `tokenizer encode` and
// `prepare` read the file through one reader.
TEST_F(BadInputs, TokenizerIds) {
  const std::string text = *dir_ + "/ab.txt";
  write_text(text, "abab");
  const auto tokenizer = [&](const std::string& name, const std::string& b, const std::string& eot,
                             const std::string& tpl) {
    const std::string path = *dir_ + "/tokenizer_" + name + ".json";
    write_text(path, tokenizer_json(b, eot, tpl));
    return path;
  };
  const std::string good = tokenizer("good", "1", "3", "3");
  const CmdResult ok = run_gtron_limited(
      {"tokenizer", "encode", "--tokenizer", good, "--text", text, "--ids-out", *dir_ + "/ids"});
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(read_text(*dir_ + "/ids"), "3 2 2\n");
  struct Bad {
    std::string name, b, eot, tpl, field;
  };
  const std::string tpl_field = "post_processor.special_tokens[\"<|endoftext|>\"].ids[0] is ";
  const std::vector<Bad> bad = {
      {"vocab_1e9", "1000000000", "3", "3", "model.vocab[\"b\"] is 1000000000"},
      {"vocab_2p31", "2147483648", "3", "3", "model.vocab[\"b\"] is 2147483648"},
      {"vocab_2p40", "1099511627776", "3", "3", "model.vocab[\"b\"] is 1099511627776"},
      {"vocab_negative", "-1", "3", "3", "model.vocab[\"b\"] is -1"},
      {"vocab_beyond", "1048581", "3", "3", "model.vocab[\"b\"] is 1048581"},  // 5 + 2^20
      {"added_1e9", "1", "1000000000", "3", "added_tokens[0].id is 1000000000"},
      {"added_2p31", "1", "2147483648", "3", "added_tokens[0].id is 2147483648"},
      {"added_2p40", "1", "1099511627776", "3", "added_tokens[0].id is 1099511627776"},
      {"added_negative", "1", "-5", "3", "added_tokens[0].id is -5"},
      {"template_2p32", "1", "3", "4294967296", tpl_field + "4294967296"},  // int32: 0
      {"template_negative", "1", "3", "-1", tpl_field + "-1"},
  };
  std::vector<Case> cases;
  for (const Bad& c : bad) {
    const std::string path = tokenizer(c.name, c.b, c.eot, c.tpl);
    cases.push_back(
        {"encode_" + c.name,
         {"tokenizer", "encode", "--tokenizer", path, "--text", text, "--ids-out", "@out"},
         "tokenizer '" + path + "'",
         c.field});
    cases.push_back({"prepare_" + c.name,
                     {"prepare", "--text", text, "--tokenizer", path, "--out", "@out"},
                     "tokenizer '" + path + "'",
                     c.field});
  }
  run_table(cases);
}

// The token count of an llm.c shard header (an int32: 2^40 does not fit) against the file's size.
TEST_F(BadInputs, ShardTokenCounts) {
  std::vector<Case> cases;
  for (const auto& [name, count] :
       std::vector<std::pair<std::string, int64_t>>{{"int32_max", 2147483647},
                                                    {"minus_one", -1},
                                                    {"int32_min", -2147483648LL},
                                                    {"one_more", 401}}) {
    const std::string path = *dir_ + "/count_" + name + ".bin";
    write_shard(path, std::vector<uint32_t>(400, 3), kShardVersionU16);
    patch_le(path, 8, static_cast<uint32_t>(count), 4);
    cases.push_back({"count_" + name,
                     {"@train", "--set", "data.train=" + path},
                     "data shard '" + path + "'",
                     "header says " + std::to_string(count) + " tokens"});
  }
  run_table(cases);
}

// Sizes in a GPT-2 config.json: above the bound (10^12 was the reported case), negative, and
// larger than the tensors they describe.
TEST_F(BadInputs, HuggingFaceGpt2ConfigSizes) {
  const std::string hf = hf_export("gpt2");
  std::vector<Case> cases;
  for (const auto& [field, value, message] : std::vector<std::array<std::string, 3>>{
           {"vocab_size", "1000000000000",
            "is 1000000000000, expected a positive integer at most 2147483647"},
           {"vocab_size", "2147483648", "is 2147483648"},
           {"n_embd", "1099511627776", "is 1099511627776"},
           {"n_layer", "-1", "is -1"},
           {"vocab_size", "65", "is 65, larger than the tensor it sizes: 'transformer.wte.weight'"},
           {"n_embd", "32", "is 32, larger than the tensor"},
           {"n_positions", "17",
            "is 17, larger than the tensor it sizes: 'transformer.wpe.weight'"},
           {"n_layer", "2", "is 2, more layers than"},
           {"n_head", "3", "is 3"}}) {
    const std::string name = "gpt2_" + field + "_" + value;
    const std::string dir = hf_with(hf, name, field, value);
    cases.push_back({name,
                     {"import", "--hf", dir, "--out", "@out"},
                     "Hugging Face config '" + dir + "/config.json'",
                     "field '" + field + "' " + message});
  }
  run_table(cases);
}

// The same for a llama-family config.json, where head counts and head size size the projections.
TEST_F(BadInputs, HuggingFaceLlamaConfigSizes) {
  const std::string hf = hf_export("llama");
  std::vector<Case> cases;
  for (const auto& [field, value, message] : std::vector<std::array<std::string, 3>>{
           {"vocab_size", "1000000000000",
            "'vocab_size' is 1000000000000, expected a positive integer at most 2147483647"},
           {"hidden_size", "2147483648", "'hidden_size' is 2147483648"},
           {"intermediate_size", "1099511627776", "'intermediate_size' is 1099511627776"},
           {"max_position_embeddings", "1099511627776",
            "'max_position_embeddings' is 1099511627776"},
           {"num_attention_heads", "-1", "'num_attention_heads' is -1"},
           {"num_hidden_layers", "1000000000", "'num_hidden_layers' is 1000000000, more layers"},
           {"head_dim", "2147483646",
            "'num_attention_heads × head_dim' is 4294967292, larger than the tensor it sizes: "
            "'model.layers.0.self_attn.q_proj.weight'"},
           {"num_key_value_heads", "2",
            "'num_key_value_heads × head_dim' is 16, larger than the tensor it sizes: "
            "'model.layers.0.self_attn.k_proj.weight'"},
           {"intermediate_size", "25", "'intermediate_size' is 25, larger than the tensor"},
           {"vocab_size", "65",
            "'vocab_size' is 65, larger than the tensor it sizes: 'model.embed_tokens.weight'"}}) {
    const std::string name = "llama_" + field + "_" + value;
    const std::string dir = hf_with(hf, name, field, value);
    cases.push_back({name,
                     {"import", "--hf", dir, "--out", "@out"},
                     "Hugging Face config '" + dir + "/config.json'",
                     "field " + message});
  }
  run_table(cases);
}

// Shapes, offsets and the header length of model.safetensors: nothing is allocated from them
// before they are checked against the file.
TEST_F(BadInputs, SafetensorsHeaders) {
  const std::string hf = hf_export("gpt2");
  const auto spoiled = [&](const std::string& name, const std::function<void(json&)>& edit) {
    const std::string dir = *dir_ + "/st_" + name;
    run_command("rm -rf '" + dir + "' && cp -r '" + hf + "' '" + dir + "'");
    if (edit) edit_header(dir + "/model.safetensors", edit);
    return dir;
  };
  const char* wte = "transformer.wte.weight";
  std::vector<std::pair<std::string, std::string>> edits;  // (dir, message)
  edits.emplace_back(spoiled("rows_2p40",
                             [&](json& h) {
                               h[wte]["shape"] = {1ULL << 40, 16};
                             }),
                     "tensor 'transformer.wte.weight' spans 4096 bytes");
  edits.emplace_back(
      spoiled("zero_and_2p63",
              [](json& h) {
                h["transformer.extra"] = {
                    {"dtype", "F32"}, {"shape", {0, 1ULL << 63}}, {"data_offsets", {0, 0}}};
              }),
      "tensor 'transformer.extra' has shape [0,9223372036854775808], too many elements");
  edits.emplace_back(spoiled("rank_5",
                             [&](json& h) {
                               h[wte]["shape"] = {1, 1, 1, 64, 16};
                             }),
                     "tensor 'transformer.wte.weight' has shape [1,1,1,64,16], expected an array "
                     "of at most 4 dimensions");
  edits.emplace_back(spoiled("negative_dim",
                             [&](json& h) {
                               h[wte]["shape"] = {-64, 16};
                             }),
                     "tensor 'transformer.wte.weight' has shape [-64,16], expected non-negative");
  edits.emplace_back(spoiled("past_the_end",
                             [](json& h) {  // the last tensor, grown to 2^40 bytes
                               std::string last;
                               uint64_t end = 0;
                               for (const auto& [name, e] : h.items()) {
                                 if (name != "__metadata__" && e["data_offsets"][1] >= end) {
                                   last = name;
                                   end = e["data_offsets"][1];
                                 }
                               }
                               const uint64_t begin = h[last]["data_offsets"][0];
                               h[last]["shape"] = {1ULL << 38};
                               h[last]["data_offsets"] = {begin, begin + (1ULL << 40)};
                             }),
                     "out of bounds");
  const std::string length = spoiled("length_2p40", nullptr);
  patch_le(length + "/model.safetensors", 0, 1ULL << 40, 8);
  edits.emplace_back(length, "bad header length 1099511627776");
  std::vector<Case> cases;
  for (const auto& [dir, message] : edits) {
    cases.push_back({"import_" + fs::path(dir).filename().string(),
                     {"import", "--hf", dir, "--out", "@out"},
                     "safetensors file '" + dir + "/model.safetensors'",
                     message});
  }
  run_table(cases);
}

}  // namespace
}  // namespace gtron
