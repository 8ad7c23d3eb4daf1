#include "trainer/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "model/check.h"
#include "tests/trainer/config_test_util.h"

namespace gtron {
namespace {

using testing::expect_text_error;
using testing::expect_user_error;
using testing::from_text;

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = std::string(::testing::TempDir()) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ConfigDefaults, MatchTheSchema) {
  const Config c = default_config();
  EXPECT_EQ(c.model.vocab_size, 50257);
  EXPECT_EQ(c.model.padded_vocab(), 50304);
  EXPECT_EQ(c.model.context_length, 1024);
  EXPECT_EQ(c.model.n_layer, 12);
  EXPECT_EQ(c.model.n_head, 12);
  EXPECT_EQ(c.model.n_embd, 768);
  EXPECT_TRUE(c.model.tied_embeddings);
  EXPECT_DOUBLE_EQ(c.model.init_std, 0.02);
  EXPECT_EQ(c.mtp.depth, 0);
  EXPECT_DOUBLE_EQ(c.mtp.loss_weight, 0.3);
  EXPECT_EQ(c.data.train, "");
  EXPECT_EQ(c.data.synthetic.order, 2);
  EXPECT_EQ(c.data.synthetic.vocab, 64);
  EXPECT_DOUBLE_EQ(c.data.synthetic.alpha, 0.2);
  EXPECT_EQ(c.data.synthetic.tokens, 2000000);
  EXPECT_EQ(c.data.synthetic.val_tokens, 100000);
  EXPECT_EQ(c.data.synthetic.seed, 1234u);
  EXPECT_EQ(c.data.seed, -1);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 6e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.optimizer.grad_clip, 1.0);
  EXPECT_FALSE(c.optimizer.decay_embeddings);
  EXPECT_EQ(c.schedule.kind, ScheduleKind::kCosine);
  EXPECT_DOUBLE_EQ(c.schedule.min_lr_ratio, 0.1);
  EXPECT_DOUBLE_EQ(c.schedule.wsd_decay_fraction, 0.2);
  EXPECT_EQ(c.train.steps, 1000);
  EXPECT_EQ(c.train.global_batch, 8);
  EXPECT_EQ(c.train.micro_batch, 8);
  EXPECT_EQ(c.train.seq_len, 1024);
  EXPECT_EQ(c.train.seed, 1337u);
  EXPECT_EQ(c.train.device, DeviceChoice::kAuto);
  EXPECT_EQ(c.train.precision, PrecisionChoice::kAuto);
  EXPECT_EQ(c.train.eval_batches, 4);
  EXPECT_EQ(c.train.recompute, RecomputeChoice::kNone);
  EXPECT_EQ(c.train.transient_grads, TransientGradsChoice::kAuto);
  EXPECT_EQ(c.train.out_dir, "runs/default");
  EXPECT_EQ(c.parallel.gtp, 1);
  EXPECT_TRUE(c.parallel.distributed_optimizer);
  EXPECT_DOUBLE_EQ(c.parallel.bucket_mb, 25.0);
  EXPECT_TRUE(c.parallel.gtp_reuse_repeated_send_buffer);
  EXPECT_EQ(c.graphs.scope, GraphScope::kNone);
  EXPECT_EQ(c.graphs.warmup, 2);
  EXPECT_EQ(c.checkpoint.keep, 3);
  EXPECT_EQ(c.log.every, 1);
  EXPECT_EQ(c.log.metrics_file, "metrics.jsonl");
  EXPECT_EQ(checkpoint_dir(c), "runs/default/checkpoints");
  EXPECT_EQ(metrics_path(c), "runs/default/metrics.jsonl");
  validate(c, 1);
}

TEST(ConfigDefaults, EmptyObjectAndResolvedJsonRoundTrip) {
  const Config d = default_config();
  EXPECT_EQ(from_text("{}"), d);
  EXPECT_EQ(from_text(resolved_json(d)), d);
}

TEST(ConfigFiles, TinyLoadsAndValidates) {
  const Config c = load_config("configs/tiny.json");
  EXPECT_EQ(c.model.vocab_size, 16);
  EXPECT_EQ(c.data.synthetic.order, 2);
  EXPECT_EQ(c.data.synthetic.vocab, 16);
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.n_embd, 64);
  EXPECT_EQ(c.mtp.depth, 1);
  EXPECT_EQ(c.train.seq_len, 64);
  EXPECT_EQ(c.train.steps, 2000);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-3);
  EXPECT_EQ(c.schedule.warmup_steps, 50);
  EXPECT_EQ(c.log.every, 100);
  EXPECT_EQ(c.checkpoint.every, 500);
  validate(c, 1);
  validate(c, 2);
  EXPECT_EQ(grad_accum_steps(c, 1), 2);
  EXPECT_EQ(grad_accum_steps(c, 2), 1);
  expect_user_error([&] { validate(c, 4); }, {"train.global_batch = 16", "32"});
}

TEST(ConfigFiles, Gpt2LoadsAndValidates) {
  const Config c = load_config("configs/gpt2_124m.json");
  EXPECT_EQ(c.model.vocab_size, 50257);
  EXPECT_EQ(c.model.n_embd, 768);
  EXPECT_EQ(c.train.micro_batch, 16);
  EXPECT_EQ(c.schedule.warmup_steps, 700);
  EXPECT_EQ(c.train.device, DeviceChoice::kCuda);
  EXPECT_EQ(c.train.precision, PrecisionChoice::kBf16);
  validate(c, 1);
  EXPECT_EQ(resolve_device(c.train, true), DeviceChoice::kCuda);
  expect_user_error([&] { resolve_device(c.train, false); }, {"train.device = \"cuda\""});
}

TEST(ConfigFiles, LlamaShapesLoadAndValidate) {
  const Config tiny = load_config("configs/llama_tiny.json");
  EXPECT_EQ(tiny.model.arch, ModelArch::kLlama);
  EXPECT_EQ(tiny.model.n_kv_head, 2);
  EXPECT_EQ(tiny.model.intermediate_size, 160);
  validate(tiny, 1);
  const Config big = load_config("configs/llama3_1b.json");
  EXPECT_EQ(big.model.arch, ModelArch::kLlama);
  EXPECT_EQ(big.model.vocab_size, 128256);
  EXPECT_EQ(big.model.n_layer, 16);
  EXPECT_EQ(big.model.n_head, 32);
  EXPECT_EQ(big.model.n_kv_head, 8);
  EXPECT_EQ(big.model.head_dim, 64);
  EXPECT_EQ(big.model.intermediate_size, 8192);
  EXPECT_EQ(big.model.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(big.model.rope_scaling.factor, 32.0);
  EXPECT_TRUE(big.model.tied_embeddings);
  validate(big, 1);
  // Issue 50's benchmark shape (scripts/bench_moe.sh) as a config.
  const Config moe = load_config("configs/qwen3_moe.json");
  EXPECT_EQ(moe.model.moe.num_experts, 64);
  EXPECT_EQ(moe.model.moe.top_k, 8);
  EXPECT_EQ(moe.model.moe.expert_intermediate_size, 768);
  EXPECT_EQ(moe.model.head_dim, 128);
  EXPECT_TRUE(moe.model.qk_norm);
  EXPECT_TRUE(moe.train.packed_masters);
  EXPECT_EQ(moe.graphs.scope, GraphScope::kFull);
  validate(moe, 1);
}

TEST(ConfigFiles, EveryShippedConfigValidates) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator("configs")) {
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  }
  EXPECT_GE(files.size(), 6u);
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    EXPECT_NO_THROW(validate(load_config(f), 1));
  }
}

TEST(ConfigOverrides, NumbersBoolsStringsAndNestedKeys) {
  const Config c = load_config("configs/tiny.json", {
                                                        "train.steps=50",
                                                        "optimizer.lr=1e-3",
                                                        "model.tied_embeddings=false",
                                                        "train.device=cpu",
                                                        "schedule.kind=\"wsd\"",
                                                        "data.train=data/shard_*.bin",
                                                        "data.synthetic.seed=7",
                                                        "data.synthetic.tokens=3e5",
                                                        "train.out_dir=2024",
                                                        "graphs.scope=layers",
                                                        "train.recompute=selective",
                                                        "train.steps=70",
                                                    });
  EXPECT_EQ(c.train.steps, 70);  // the later override wins
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_FALSE(c.model.tied_embeddings);
  EXPECT_EQ(c.train.device, DeviceChoice::kCpu);
  EXPECT_EQ(c.schedule.kind, ScheduleKind::kWsd);
  EXPECT_EQ(c.data.train, "data/shard_*.bin");
  EXPECT_EQ(c.data.synthetic.seed, 7u);
  EXPECT_EQ(c.data.synthetic.tokens, 300000);
  EXPECT_EQ(c.train.out_dir, "2024");  // a string key keeps the raw text
  EXPECT_EQ(c.graphs.scope, GraphScope::kLayers);
  EXPECT_EQ(c.train.recompute, RecomputeChoice::kSelective);
  EXPECT_EQ(c.model.n_layer, 2);  // untouched keys keep the file's values
  // An override may name a section the file does not have.
  EXPECT_EQ(from_text("{}", {"checkpoint.keep=9"}).checkpoint.keep, 9);
}

TEST(ConfigRoundTrip, ResolvedJsonReparsesToTheSameConfig) {
  const Config c = load_config("configs/tiny.json",
                               {"parallel.gtp=2", "optimizer.eps=1.5e-7", "data.val=v/*.bin"});
  const std::string text = resolved_json(c);
  const Config back = from_text(text);
  EXPECT_EQ(back, c);
  EXPECT_EQ(resolved_json(back), text);
  for (const std::string& path : config_key_paths()) {
    const std::string leaf = path.substr(path.rfind('.') + 1);
    EXPECT_NE(text.find("\"" + leaf + "\""), std::string::npos) << path;
  }
  Config changed = back;
  changed.optimizer.beta1 = 0.8;
  EXPECT_NE(changed, c);
}

TEST(ConfigDocs, MarkdownTableListsEveryKey) {
  const std::string md = config_markdown_table();
  const std::vector<std::string> paths = config_key_paths();
  for (const std::string& path : paths) {
    EXPECT_NE(md.find("| `" + path + "` |"), std::string::npos) << path;
  }
  size_t rows = 0;
  for (char ch : md) rows += ch == '\n';
  EXPECT_EQ(rows, paths.size() + 2);  // header, separator, one row per key
  EXPECT_NE(md.find("| `schedule.kind` | enum | `\"cosine\"` | \"cosine\", \"linear\", "
                    "\"constant\", \"wsd\" |"),
            std::string::npos);
  EXPECT_NE(md.find("| `optimizer.beta2` | float | `0.95` | [0, 1) |"), std::string::npos);
}

TEST(ConfigErrors, UnknownKeys) {
  expect_text_error(R"({"optimiser": {"lr": 0.1}})",
                    {"optimiser = {\"lr\":0.1}", "unknown key in test.json", "optimizer"});
  expect_text_error(R"({"model": {"n_layers": 3}})",
                    {"model.n_layers = 3", "did you mean model.n_layer?"});
  expect_text_error(R"({"n_layer": 3})", {"n_layer = 3", "did you mean model.n_layer?"});
  expect_text_error(R"({"model": {"n_layer.x": 3}})", {"model.n_layer.x = 3", "plain names"});
  expect_text_error(R"({"model": 5})", {"model = 5", "must be a JSON object"});
  expect_text_error(R"({"zzz": 5})", {"zzz = 5", "the sections are model, mtp, data,"});
  expect_text_error(R"({"graphs": {"zzz": 5}})",
                    {"graphs.zzz = 5", "the keys of graphs are scope, warmup"});
}

TEST(ConfigErrors, WrongJsonTypes) {
  expect_text_error(R"({"model": {"n_layer": "12"}})",
                    {"model.n_layer = \"12\"", "expected an integer", "got a JSON string"});
  expect_text_error(R"({"model": {"n_layer": 1.5}})",
                    {"model.n_layer = 1.5", "non-integral number"});
  expect_text_error(R"({"model": {"n_layer": 1e30}})", {"model.n_layer = 1e+30", "beyond 64-bit"});
  expect_text_error(R"({"model": {"tied_embeddings": 1}})",
                    {"model.tied_embeddings = 1", "expected true or false"});
  expect_text_error(R"({"optimizer": {"lr": "fast"}})",
                    {"optimizer.lr = \"fast\"", "expected a number"});
  expect_text_error(R"({"data": {"train": 3}})", {"data.train = 3", "expected a string"});
  expect_text_error(R"({"train": {"seed": null}})", {"train.seed = null", "got a JSON null"});
  expect_text_error("[1, 2]", {"test.json", "top level must be a JSON object", "array"});
}

TEST(ConfigErrors, OutOfRangeAndBadEnums) {
  expect_text_error(R"({"optimizer": {"lr": -0.001}})", {"optimizer.lr = -0.001", "must be > 0"});
  expect_text_error(R"({"mtp": {"depth": -1}})", {"mtp.depth = -1", "must be in [0, 16]"});
  expect_text_error(R"({"checkpoint": {"keep": 0}})", {"checkpoint.keep = 0", "must be >= 1"});
  expect_text_error(R"({"log": {"every": 0}})", {"log.every = 0", "must be >= 1"});
  expect_text_error(R"({"optimizer": {"beta2": 1}})", {"optimizer.beta2 = 1", "[0, 1)"});
  expect_text_error(R"({"train": {"out_dir": ""}})", {"train.out_dir = \"\"", "not be empty"});
  expect_text_error(R"({"train": {"device": "tpu"}})",
                    {"train.device = \"tpu\"", "one of \"auto\", \"cpu\", \"cuda\""});
  expect_text_error(R"({"train": {"recompute": "fully"}})",
                    {"train.recompute = \"fully\"", "one of \"none\", \"selective\", \"full\""});
  expect_text_error(R"({"schedule": {"kind": "cosin"}})",
                    {"schedule.kind = \"cosin\"", "did you mean \"cosine\"?"});
}

TEST(ConfigErrors, InconsistentCombinations) {
  expect_text_error(R"({"model": {"n_embd": 64, "n_head": 5}})",
                    {"model.n_head = 5", "must divide model.n_embd (64)", "4 or 8"});
  expect_text_error(R"({"model": {"context_length": 64}, "train": {"seq_len": 128}})",
                    {"train.seq_len = 128", "model.context_length (64)"});
  expect_text_error(
      R"({"train": {"global_batch": 12, "micro_batch": 8}})",
      {"train.global_batch = 12", "train.micro_batch (8)", "set train.global_batch to 16"});
  expect_text_error(R"({"train": {"seq_len": 8}, "mtp": {"depth": 8}})",
                    {"mtp.depth = 8", "train.seq_len (8)"});
  expect_text_error(R"({"schedule": {"warmup_steps": 2000}})",
                    {"schedule.warmup_steps = 2000", "train.steps (1000)"});
  expect_text_error(R"({"train": {"device": "cpu", "precision": "bf16"}})",
                    {"train.precision = \"bf16\"", "train.device = \"cpu\""});
  // Note [packed masters]: bf16 on CUDA only.
  expect_text_error(R"({"train": {"device": "cpu", "packed_masters": true}})",
                    {"train.packed_masters = true", "train.device = \"cpu\""});
  expect_text_error(R"({"train": {"precision": "fp8", "packed_masters": true}})",
                    {"train.packed_masters = true", "train.precision = \"fp8\""});
  EXPECT_TRUE(from_text(R"({"train": {"packed_masters": true}})").train.packed_masters);
  EXPECT_FALSE(default_config().train.packed_masters);
  expect_text_error(R"({"model": {"vocab_size": 50}})",
                    {"data.synthetic.vocab = 64", "model.vocab_size (50)"});
  // Real token shards lift the limits on the synthetic source.
  from_text(R"({"model": {"vocab_size": 50}, "data": {"train": "t/*.bin"}})");
  from_text(R"({"data": {"train": "t/*.bin", "synthetic": {"tokens": 1, "val_tokens": 1}}})");
  expect_text_error(R"({"data": {"synthetic": {"val_tokens": 1024}}})",
                    {"data.synthetic.val_tokens = 1024", "1025"});
  expect_text_error(R"({"data": {"synthetic": {"tokens": 100}}})",
                    {"data.synthetic.tokens = 100", "1025"});
  // parallel.gtp ranks at least, so global_batch must already split over them.
  expect_text_error(R"({"parallel": {"gtp": 2}})",
                    {"train.global_batch = 8", "at least parallel.gtp = 2", "16"});
}

TEST(ConfigErrors, WorldSizeChecks) {
  const Config c = from_text(R"({"parallel": {"gtp": 2}, "train": {"global_batch": 48}})");
  validate(c, 2);
  validate(c, 6);
  expect_user_error([&] { validate(c, 3); }, {"parallel.gtp = 2", "world size (3)"});
  expect_user_error([&] { validate(c, 4); },
                    {"train.global_batch = 48", "data ranks (4, the world size) = 32"});
  Config hand = default_config();
  hand.optimizer.beta1 = 1.0;  // validate() re-checks every key of a hand-built Config
  expect_user_error([&] { validate(hand, 1); }, {"optimizer.beta1 = 1.0", "[0, 1)"});
}

TEST(ConfigErrors, BackendChecks) {
  EXPECT_EQ(default_config().parallel.backend, CommBackend::kAuto);
  EXPECT_EQ(default_config().parallel.ipc_timeout_s, 120.0);
  EXPECT_EQ(from_text(R"({"parallel": {"backend": "ipc"}})").parallel.backend, CommBackend::kIpc);
  EXPECT_EQ(from_text(R"({"parallel": {"backend": "gloo"}, "train": {"device": "cpu"}})")
                .parallel.backend,
            CommBackend::kGloo);
  expect_text_error(R"({"parallel": {"backend": "mpi"}})", {"parallel.backend", "ipc"});
  expect_text_error(R"({"parallel": {"backend": "gloo"}, "train": {"device": "cuda"}})",
                    {"parallel.backend = \"gloo\"", "train.device = \"cuda\""});
  expect_text_error(R"({"parallel": {"backend": "ipc"}, "train": {"device": "cpu"}})",
                    {"parallel.backend = \"ipc\"", "needs GPUs"});
  expect_text_error(R"({"parallel": {"backend": "nccl"}, "train": {"device": "cpu"}})",
                    {"parallel.backend = \"nccl\"", "needs GPUs"});
  expect_text_error(R"({"parallel": {"ipc_timeout_s": 0}})", {"parallel.ipc_timeout_s"});
}

// Note [full recompute] in model/gpt.cc: "full" composes with every layout and graph scope (GTP
// gathers the weights again for the second forward; a backward graph captures it).
TEST(ConfigDefaults, FullRecomputeWithGtpAndGraphs) {
  for (const char* scope : {"none", "layers", "full"}) {
    const Config c = from_text(str_cat(R"({"train": {"recompute": "full", "global_batch": 16},
        "parallel": {"gtp": 2}, "graphs": {"scope": ")",
                                       scope, R"("}})"));
    EXPECT_EQ(c.train.recompute, RecomputeChoice::kFull) << scope;
    validate(c, 2);
  }
  expect_text_error(R"({"train": {"recompute": "every"}})", {"train.recompute", "\"every\""});
}

TEST(ConfigErrors, TensorParallelChecks) {
  // parallel.tp splits heads, the MLP width, the MTP projection and the padded vocabulary.
  const char* model = R"("model": {"vocab_size": 64, "n_head": 4, "n_embd": 32})";
  const Config ok = from_text(str_cat("{", model, R"(, "parallel": {"tp": 4}})"));
  EXPECT_EQ(ok.parallel.tp, 4);
  EXPECT_EQ(default_config().parallel.tp, 1);
  expect_text_error(str_cat("{", model, R"(, "parallel": {"tp": 8}})"),
                    {"parallel.tp = 8", "model.n_head (4)", "parallel.tp = 4"});
  expect_text_error(
      R"({"model": {"vocab_size": 64, "n_head": 6, "n_embd": 48}, "parallel": {"tp": 3}})",
      {"parallel.tp = 3", "padded vocabulary", "(64)"});
  // TP > 1 trains on GPUs too (the device gradient norm sums split parameters over TP).
  EXPECT_EQ(
      from_text(str_cat("{", model, R"(, "parallel": {"tp": 2}, "train": {"device": "cuda"}})"))
          .parallel.tp,
      2);
  expect_text_error(str_cat("{", model, R"(, "parallel": {"tp": 0}})"), {"parallel.tp = 0"});
  // Sequence parallelism splits the sequence over TP.
  EXPECT_FALSE(ok.parallel.sequence_parallel);
  from_text(str_cat("{", model, R"(, "parallel": {"tp": 4, "sequence_parallel": true},
                                     "train": {"seq_len": 16}})"));
  expect_text_error(str_cat("{", model, R"(, "parallel": {"sequence_parallel": true}})"),
                    {"parallel.sequence_parallel = true", "parallel.tp > 1"});
  expect_text_error(str_cat("{", model, R"(, "parallel": {"tp": 4, "sequence_parallel": true},
                                             "train": {"seq_len": 18}})"),
                    {"parallel.sequence_parallel = true", "train.seq_len (18)", "20"});
  // World = DP x GTP x TP: gtp x tp divides the world; TP peers share micro-batches, so the batch
  // splits over world / tp data ranks.
  const Config c = from_text(
      str_cat("{", model, R"(, "parallel": {"tp": 2, "gtp": 2}, "train": {"global_batch": 8,
                                                                        "micro_batch": 2}})"));
  validate(c, 4);
  validate(c, 8);
  EXPECT_EQ(grad_accum_steps(c, 4), 2);
  EXPECT_EQ(grad_accum_steps(c, 8), 1);
  expect_user_error([&] { validate(c, 6); }, {"parallel.tp = 2", "(4)", "world size (6)"});
  expect_user_error([&] { validate(c, 16); },
                    {"train.global_batch = 8", "8 = world size / parallel.tp"});
}

TEST(ConfigErrors, LlamaTensorParallelKeyValueHeads) {
  // Llama: parallel.tp divides model.n_kv_head (NKV/TP heads a rank), or is a multiple of it (one
  // head a rank, replicated on TP/NKV ranks: Note [replicated key/value heads]).
  const auto llama = [](int n_head, int n_kv_head, int tp) {
    return str_cat(R"({"model": {"arch": "llama", "vocab_size": 64, "n_embd": 48, "n_head": )",
                   n_head, R"(, "head_dim": 8, "n_kv_head": )", n_kv_head,
                   R"(, "intermediate_size": 96}, "parallel": {"tp": )", tp, "}}");
  };
  for (auto [nh, nkv, tp] :
       {std::make_tuple(8, 4, 2), std::make_tuple(8, 2, 2), std::make_tuple(8, 2, 4),
        std::make_tuple(8, 2, 8), std::make_tuple(8, 1, 2), std::make_tuple(8, 1, 8),
        std::make_tuple(4, 2, 4)}) {
    const Config c = from_text(llama(nh, nkv, tp));
    EXPECT_EQ(c.parallel.tp, tp) << nh << " heads, " << nkv << " kv heads";
    EXPECT_EQ(c.model.n_kv_head, nkv);
  }
  // Neither a divisor nor a multiple of the key/value heads: exit 2 naming both keys.
  expect_text_error(llama(6, 2, 3), {"parallel.tp = 3", "model.n_kv_head = 2", "or be a multiple",
                                     "use parallel.tp = 2", "divides model.n_head (6)"});
  expect_text_error(llama(12, 4, 6), {"parallel.tp = 6", "model.n_kv_head = 4"});
  // A multiple of the key/value heads must still divide the query heads.
  expect_text_error(llama(4, 1, 8), {"parallel.tp = 8", "model.n_head (4)"});
}

TEST(ConfigErrors, FilesAndOverrides) {
  expect_user_error([] { load_config("no_such_config.json"); },
                    {"\"no_such_config.json\"", "No such file or directory"});
  const std::string bad = write_temp("malformed.json", "{\n  \"model\": {\"n_layer\": 2,}\n}\n");
  expect_user_error([&] { load_config(bad); }, {"cannot parse " + bad, "line 2"});
  expect_user_error([] { load_config(::testing::TempDir()); }, {"is a directory"});
  expect_text_error("{}", {"--set \"model.n_layer4\"", "expected key.path=value"},
                    {"model.n_layer4"});
  expect_text_error("{}", {"--set model.n_layers=4", "did you mean model.n_layer?"},
                    {"model.n_layers=4"});
  expect_text_error("{}", {"--set model=4", "is a section", "model.arch=..."}, {"model=4"});
  expect_text_error("{}", {"train.steps = \"abc\" (from --set)", "expected an integer"},
                    {"train.steps=abc"});
}

TEST(ConfigRuntime, DeviceAndPrecisionResolution) {
  TrainConfig t = default_config().train;
  EXPECT_EQ(resolve_device(t, true), DeviceChoice::kCuda);
  EXPECT_EQ(resolve_device(t, false), DeviceChoice::kCpu);
  EXPECT_EQ(resolve_precision(t, DeviceChoice::kCuda), PrecisionChoice::kBf16);
  EXPECT_EQ(resolve_precision(t, DeviceChoice::kCpu), PrecisionChoice::kFp32);
  t.precision = PrecisionChoice::kFp32;
  EXPECT_EQ(resolve_precision(t, DeviceChoice::kCuda), PrecisionChoice::kFp32);
  t.precision = PrecisionChoice::kBf16;  // device "auto" that found no GPU
  expect_user_error([&] { resolve_precision(t, DeviceChoice::kCpu); },
                    {"train.precision = \"bf16\"", "train.device = \"auto\""});
  EXPECT_STREQ(to_string(ScheduleKind::kWsd), "wsd");
  EXPECT_STREQ(to_string(GraphScope::kFull), "full");
  EXPECT_STREQ(to_string(PrecisionChoice::kFp32), "fp32");
}

TEST(ConfigRuntime, DataSeedFollowsTrainSeedUnlessSet) {
  Config c = default_config();
  c.train.seed = 5;
  EXPECT_EQ(data_seed(c), 5);
  c.data.seed = 0;
  EXPECT_EQ(data_seed(c), 0);
  c.data.seed = 9;
  EXPECT_EQ(data_seed(c), 9);
  expect_text_error(R"({"data": {"seed": -2}})", {"data.seed", "-2"});
}

TEST(ConfigRuntime, TransientGradsAutoTrueFalse) {
  // JSON booleans (the key's form before "auto", kept in old checkpoints), "auto", and --set.
  EXPECT_EQ(from_text(R"({"train": {"transient_grads": true}})").train.transient_grads,
            TransientGradsChoice::kOn);
  EXPECT_EQ(from_text(R"({"train": {"transient_grads": false}})").train.transient_grads,
            TransientGradsChoice::kOff);
  EXPECT_EQ(from_text(R"({"train": {"transient_grads": "auto"}})").train.transient_grads,
            TransientGradsChoice::kAuto);
  EXPECT_EQ(from_text("{}", {"train.transient_grads=true"}).train.transient_grads,
            TransientGradsChoice::kOn);
  EXPECT_EQ(from_text("{}", {"train.transient_grads=false"}).train.transient_grads,
            TransientGradsChoice::kOff);
  // Written back as a boolean, and read back the same.
  const Config on = from_text("{}", {"train.transient_grads=true"});
  EXPECT_NE(resolved_json(on).find("\"transient_grads\": true"), std::string::npos);
  EXPECT_EQ(from_text(resolved_json(on)), on);
  EXPECT_NE(resolved_json(default_config()).find("\"transient_grads\": \"auto\""),
            std::string::npos);
  expect_text_error(R"({"train": {"transient_grads": "yes"}})",
                    {"train.transient_grads", "\"auto\", false, true"});
  expect_text_error(R"({"train": {"transient_grads": 1}})", {"train.transient_grads"});

  // auto: on eagerly and under graphs full with one micro-batch a step, else off.
  Config c = default_config();
  EXPECT_TRUE(resolve_transient_grads(c, 1));
  c.graphs.scope = GraphScope::kFull;
  EXPECT_TRUE(resolve_transient_grads(c, 1));
  c.train.micro_batch = 4;  // two micro-batches a step
  EXPECT_FALSE(resolve_transient_grads(c, 1));
  c.train.global_batch = 16;  // one micro-batch of 8 on each of two data ranks
  c.train.micro_batch = 8;
  EXPECT_TRUE(resolve_transient_grads(c, 2));
  EXPECT_FALSE(resolve_transient_grads(c, 1));
  c.graphs.scope = GraphScope::kLayers;
  EXPECT_FALSE(resolve_transient_grads(c, 1));
  c.train.transient_grads = TransientGradsChoice::kOff;
  c.graphs.scope = GraphScope::kNone;
  EXPECT_FALSE(resolve_transient_grads(c, 1));
  c.train.transient_grads = TransientGradsChoice::kOn;
  EXPECT_TRUE(resolve_transient_grads(c, 1));
  // Explicit true where it cannot hold is refused; auto there is not.
  expect_text_error("{}", {"train.transient_grads = true", "graphs.scope"},
                    {"train.transient_grads=true", "graphs.scope=layers"});
  EXPECT_EQ(from_text("{}", {"graphs.scope=layers"}).graphs.scope, GraphScope::kLayers);
}

}  // namespace
}  // namespace gtron
