// The llama family end to end on the CPU, through the real gtron binary: training (MTP, GQA,
// Qwen3's q/k norms and head size, the llama3 RoPE rewrite) is deterministic and learns; the
// logits agree with a second implementation (tests/trainer/llama_reference.py, numpy float64,
// written from docs/models.md's description of the family); GTP=2 on two processes gives one
// process's curve; TP above n_kv_head (key/value heads replicated: MQA at TP=2, TP=2 × GTP=2
// with sequence parallelism, NKV=2 at TP=4 with the qkv bias) gives one process's curve, and its
// checkpoints resume at one process and back; bad llama keys exit 2 naming the key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/trainer/cli_util.h"

namespace gtron {
namespace {

using testing::CmdResult;
using testing::metrics_loss_values;
using testing::metrics_losses;
using testing::run_command;
using testing::run_gtron;
using testing::run_launcher;
using testing::temp_dir;
using testing::worst_relative;
using testing::write_text;

// A small llama over the synthetic Markov source; `model` adds keys to the model section.
std::string config(const std::string& model, int depth) {
  return R"({
  "model": {"arch": "llama", "vocab_size": 32, "context_length": 16, "n_layer": 2, "n_head": 4,
            "n_embd": 32, "intermediate_size": 48)" +
         model + R"(},
  "mtp": {"depth": )" +
         std::to_string(depth) + R"(},
  "data": {"synthetic": {"vocab": 32, "tokens": 20000, "val_tokens": 2000}},
  "optimizer": {"lr": 3e-3},
  "schedule": {"warmup_steps": 5},
  "train": {"steps": 20, "global_batch": 8, "micro_batch": 4, "seq_len": 16, "device": "cpu"},
  "checkpoint": {"every": 0},
  "log": {"every": 1}
})";
}

struct Variant {
  const char* name;
  std::string model;  // extra model keys
  int depth;
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> all = {
      // Llama-3 style: GQA (2 K/V heads for 4 query heads), the llama3 frequency rewrite, tied.
      {"llama3", R"(, "n_kv_head": 2, "rope_theta": 10000,
        "rope_scaling": {"type": "llama3", "factor": 4, "low_freq_factor": 1,
                         "high_freq_factor": 4, "original_max_position_embeddings": 8})",
       1},
      // Qwen3 style: q/k norms, a head size that is not n_embd / n_head, MQA, untied head.
      {"qwen3", R"(, "n_kv_head": 1, "head_dim": 12, "qk_norm": true, "tied_embeddings": false)",
       2},
      // Qwen2 style: q/k/v biases, full multi-head attention.
      {"qwen2", R"(, "qkv_bias": true, "rope_scaling": null)", 0},
  };
  return all;
}

std::string train(const std::string& dir, const Variant& v, const std::string& out,
                  const std::vector<std::string>& more = {}) {
  write_text(dir + "/c.json", config(v.model, v.depth));
  std::vector<std::string> args = {"train", "--config", dir + "/c.json", "--out", dir + "/" + out};
  for (const std::string& s : more) {
    args.push_back("--set");
    args.push_back(s);
  }
  const CmdResult r = run_gtron(args);
  EXPECT_EQ(r.exit_code, 0) << v.name << "\n" << r.output;
  return dir + "/" + out;
}

TEST(Llama, TrainsDeterministicallyAndMatchesTheReference) {
  for (const Variant& v : variants()) {
    const std::string dir = temp_dir(std::string("llama_") + v.name);
    const std::string a = train(dir, v, "a");
    const std::string b = train(dir, v, "b");
    const std::vector<std::string> la = metrics_losses(a + "/metrics.jsonl");
    ASSERT_EQ(la.size(), 20u) << v.name;
    EXPECT_EQ(la, metrics_losses(b + "/metrics.jsonl")) << v.name << ": two runs differ";
    const std::vector<double> loss = metrics_loss_values(a + "/metrics.jsonl");
    EXPECT_LT(loss.back(), loss.front() - 0.15) << v.name << ": the loss did not fall";

    const std::string ckpt = a + "/checkpoints/step_00000020";
    const CmdResult lg = run_gtron(
        {"logits", "--checkpoint", ckpt, "--tokens", "1,2,3,31,0,7,7,7,20,9,4,4,12,30,2,5",
         "--tokens", "8,6,7,5,3,0,9,1,1,2,2,3,3,4,4,5", "--out", dir + "/logits.safetensors"});
    ASSERT_EQ(lg.exit_code, 0) << lg.output;
    const CmdResult ref = run_command("/usr/bin/python3 tests/trainer/llama_reference.py '" + ckpt +
                                      "' '" + dir + "/logits.safetensors' --tolerance 1e-5");
    EXPECT_EQ(ref.exit_code, 0) << v.name << ": " << ref.output;
    EXPECT_NE(ref.output.find("\"shape\": [2, 16, 32]"), std::string::npos) << ref.output;
    std::printf("%s: 20 steps, loss %.4f -> %.4f; reference %s", v.name, loss.front(), loss.back(),
                ref.output.c_str());
  }
}

// Graphs layers and full give eager's losses bit for bit, also with train.recompute = "full";
// 10 steps + --resume give 20 straight.
TEST(Llama, GraphsAndResumeAreBitExact) {
  const Variant& v = variants()[1];  // qwen3 style: MTP D=2, q/k norms, untied head
  const std::string dir = temp_dir("llama_exact");
  const std::vector<std::string> eager = metrics_losses(train(dir, v, "eager") + "/metrics.jsonl");
  ASSERT_EQ(eager.size(), 20u);
  for (const char* scope : {"layers", "full"}) {
    const std::string run = train(dir, v, scope, {std::string("graphs.scope=") + scope});
    EXPECT_EQ(metrics_losses(run + "/metrics.jsonl"), eager) << "graphs " << scope;
    // Note [full recompute]: the backward graph runs each block's forward again.
    const std::string full = train(dir, v, std::string(scope) + "_recompute",
                                   {std::string("graphs.scope=") + scope, "train.recompute=full"});
    EXPECT_EQ(metrics_losses(full + "/metrics.jsonl"), eager) << "graphs " << scope << ", full";
  }
  // Stopped at step 10 (only that checkpoint kept), then resumed to 20.
  const std::string run = train(dir, v, "resumed", {"checkpoint.every=10"});
  ASSERT_EQ(std::system(("rm -rf '" + run + "/checkpoints/step_00000020'").c_str()), 0);
  write_text(dir + "/c.json", config(v.model, v.depth));
  const CmdResult r = run_gtron({"train", "--config", dir + "/c.json", "--out", run, "--set",
                                 "checkpoint.every=10", "--resume"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_EQ(metrics_losses(run + "/metrics.jsonl"), eager) << "resumed";
}

// Every parallel layout over processes (Gloo) against one process: DP, GTP (graphs none, layers,
// full), TP (the q/k norms' partial gradients summed over TP), TP × GTP with sequence parallelism,
// and train.recompute = "full" (Note [full recompute]: bit for bit in one process; with DP, with
// TP + sequence parallelism, whose collectives the recomputed forward runs again, and with GTP,
// whose weights the recomputed forward gathers again).
TEST(Llama, EveryLayoutMatchesOneProcess) {
  const std::string dir = temp_dir("llama_layouts");
  // Qwen3 style (MTP D=2, untied head, q/k norms) with two key/value heads: one per TP rank.
  const Variant gqa{"qwen3_gqa", R"(, "n_kv_head": 2, "head_dim": 12, "qk_norm": true,
        "tied_embeddings": false)",
                    2};
  const std::string one = train(dir, gqa, "one", {"train.steps=10"});
  const std::string full = train(dir, gqa, "one_full", {"train.steps=10", "train.recompute=full"});
  EXPECT_EQ(metrics_losses(full + "/metrics.jsonl"), metrics_losses(one + "/metrics.jsonl"));
  struct Layout {
    const char* name;
    int nproc;
    std::vector<std::string> sets;
    double bound;
  };
  const std::vector<Layout> layouts = {
      {"dp2", 2, {}, 1e-5},
      {"gtp2", 2, {"parallel.gtp=2"}, 1e-5},
      {"gtp2_layers", 2, {"parallel.gtp=2", "graphs.scope=layers"}, 1e-5},
      {"gtp2_full", 2, {"parallel.gtp=2", "graphs.scope=full"}, 1e-5},
      {"tp2", 2, {"parallel.tp=2"}, 1e-6},
      {"tp2_gtp2_sp",
       4,
       {"parallel.tp=2", "parallel.gtp=2", "parallel.sequence_parallel=true"},
       1e-6},
      {"dp2_recompute_full", 2, {"train.recompute=full"}, 1e-5},
      {"tp2_sp_recompute_full",
       2,
       {"parallel.tp=2", "parallel.sequence_parallel=true", "train.recompute=full"},
       1e-6},
      {"gtp2_recompute_full", 2, {"parallel.gtp=2", "train.recompute=full"}, 1e-5},
      {"gtp2_layers_recompute_full",
       2,
       {"parallel.gtp=2", "graphs.scope=layers", "train.recompute=full"},
       1e-5},
      {"tp2_gtp2_sp_full_recompute_full",
       4,
       {"parallel.tp=2", "parallel.gtp=2", "parallel.sequence_parallel=true", "graphs.scope=full",
        "train.recompute=full"},
       1e-6},
  };
  for (const Layout& l : layouts) {
    const std::string out = dir + "/" + l.name;
    std::vector<std::string> args = {"train", "--config", dir + "/c.json", "--out",
                                     out,     "--set",    "train.steps=10"};
    for (const std::string& s : l.sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    const CmdResult r =
        run_launcher({"--standalone", "--nproc-per-node", std::to_string(l.nproc)}, args);
    ASSERT_EQ(r.exit_code, 0) << l.name << "\n" << r.output;
    const double worst = worst_relative(metrics_loss_values(one + "/metrics.jsonl"),
                                        metrics_loss_values(out + "/metrics.jsonl"));
    EXPECT_LT(worst, l.bound) << l.name;
    std::printf("%s: worst relative loss difference to one process %.3g over 10 steps\n", l.name,
                worst);
  }
}

// Note [replicated key/value heads]: TP a multiple of n_kv_head, each rank holding one key/value
// head shared with the TP/NKV ranks whose query heads read it.
TEST(Llama, ReplicatedKeyValueHeadsMatchOneProcess) {
  const std::string dir = temp_dir("llama_kv_replicated");
  const auto launch = [&](const std::string& cfg, const std::string& out, int nproc,
                          const std::vector<std::string>& sets, bool resume = false) {
    std::vector<std::string> args = {"train", "--config", cfg, "--out", out};
    if (resume) args.push_back("--resume");
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    if (nproc == 1) return run_gtron(args);
    return run_launcher({"--standalone", "--nproc-per-node", std::to_string(nproc)}, args);
  };
  struct Layout {
    const char* name;
    int nproc;
    std::vector<std::string> sets;
  };
  struct Case {
    const char* name;
    Variant variant;
    std::vector<Layout> layouts;
  };
  const std::vector<Case> cases = {
      // Qwen3 style with multi-query attention: the one key/value head on every TP rank.
      {"mqa",
       {"qwen3_mqa", R"(, "n_kv_head": 1, "head_dim": 12, "qk_norm": true,
        "tied_embeddings": false)",
        2},
       {{"tp2", 2, {"parallel.tp=2"}},
        {"tp2_gtp2_sp",
         4,
         {"parallel.tp=2", "parallel.gtp=2", "parallel.sequence_parallel=true"}}}},
      // Two key/value heads over four ranks (ranks 0, 1 hold head 0; 2, 3 head 1), Qwen2's qkv
      // bias and Qwen3's q/k norms: one query head a rank.
      {"gqa",
       {"qwen_gqa", R"(, "n_kv_head": 2, "head_dim": 12, "qk_norm": true, "qkv_bias": true)", 1},
       {{"tp4", 4, {"parallel.tp=4"}}}},
  };
  double worst_all = 0;
  for (const Case& c : cases) {
    const std::string cdir = dir + "/" + c.name;
    ASSERT_EQ(std::system(("mkdir -p '" + cdir + "'").c_str()), 0);
    const std::string one = train(cdir, c.variant, "one", {"train.steps=10"});
    const std::vector<double> want = metrics_loss_values(one + "/metrics.jsonl");
    ASSERT_EQ(want.size(), 10u) << c.name;
    for (const Layout& l : c.layouts) {
      const std::string out = cdir + "/" + l.name;
      std::vector<std::string> sets = l.sets;
      sets.push_back("train.steps=10");
      const CmdResult r = launch(cdir + "/c.json", out, l.nproc, sets);
      ASSERT_EQ(r.exit_code, 0) << c.name << " " << l.name << "\n" << r.output;
      const double worst = worst_relative(want, metrics_loss_values(out + "/metrics.jsonl"));
      worst_all = std::max(worst_all, worst);
      EXPECT_LT(worst, 1e-6) << c.name << " " << l.name;
      std::printf("%s %s: worst relative loss difference to one process %.3g over 10 steps\n",
                  c.name, l.name, worst);
    }
  }
  std::printf("worst of all replicated layouts: %.3g\n", worst_all);

  // Checkpoints hold each key/value head once: a TP=2 (MQA, replicated) step-5 checkpoint
  // continues its curve at one process, and a one-process one continues its curve at TP=2.
  const std::string cdir = dir + "/resume";
  ASSERT_EQ(std::system(("mkdir -p '" + cdir + "'").c_str()), 0);
  const std::vector<std::string> every5 = {"train.steps=10", "checkpoint.every=5"};
  const std::string one = train(cdir, cases[0].variant, "one", every5);
  const std::string cfg = cdir + "/c.json";
  std::vector<std::string> tp2 = every5;
  tp2.push_back("parallel.tp=2");
  const CmdResult rt = launch(cfg, cdir + "/tp2", 2, tp2);
  ASSERT_EQ(rt.exit_code, 0) << rt.output;
  struct Resume {
    const char* from;
    const char* to;
    int nproc;
    std::vector<std::string> sets;
  };
  for (const Resume& m :
       {Resume{"tp2", "tp2_to_one", 1, every5}, Resume{"one", "one_to_tp2", 2, tp2}}) {
    const std::string from = cdir + "/" + m.from, to = cdir + "/" + m.to;
    const CmdResult cp = run_command("mkdir -p '" + to + "/checkpoints' && cp -r '" + from +
                                     "/checkpoints/step_00000005' '" + to +
                                     "/checkpoints/' && cp -r '" + from + "/data' '" + to + "/'");
    ASSERT_EQ(cp.exit_code, 0) << cp.output;
    const CmdResult r = launch(cfg, to, m.nproc, m.sets, /*resume=*/true);
    ASSERT_EQ(r.exit_code, 0) << m.to << "\n" << r.output;
    const std::vector<double> full = metrics_loss_values(from + "/metrics.jsonl");
    ASSERT_EQ(full.size(), 10u) << m.from;
    const std::vector<double> got = metrics_loss_values(to + "/metrics.jsonl");
    ASSERT_EQ(got.size(), 5u) << m.to;
    const double worst = worst_relative(std::vector<double>(full.begin() + 5, full.end()), got);
    EXPECT_LT(worst, 1e-6) << m.to;
    std::printf("%s -> %s: worst relative loss difference over steps 6..10 %.3g\n", m.from, m.to,
                worst);
  }
}

TEST(Llama, BadKeysExitTwoNamingTheKey) {
  const std::string dir = temp_dir("llama_bad");
  write_text(dir + "/c.json", config("", 0));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.n_kv_head=3", "model.n_kv_head"},
      {"model.head_dim=7", "model.head_dim"},
      {"model.rope_scaling.type=llama2", "model.rope_scaling.type"},
      {"model.rope_theta=0.5", "model.rope_theta"},
      {"parallel.tp=3", "parallel.tp"},
      {"parallel.tp=8", "parallel.tp"},  // a multiple of n_kv_head, but not a divisor of n_head
  };
  for (const auto& [set, key] : cases) {
    const CmdResult r =
        run_gtron({"train", "--config", dir + "/c.json", "--out", dir + "/run", "--set", set});
    EXPECT_EQ(r.exit_code, 2) << set << "\n" << r.output;
    EXPECT_NE(r.output.find(key), std::string::npos) << set << "\n" << r.output;
  }
  // TP neither a divisor nor a multiple of the key/value heads (6 query heads, 2 key/value heads,
  // TP 3): exit 2 naming both keys.
  const CmdResult kv = run_gtron({"train", "--config", dir + "/c.json", "--out", dir + "/run3",
                                  "--set", "model.n_head=6", "--set", "model.head_dim=8", "--set",
                                  "model.n_kv_head=2", "--set", "parallel.tp=3"});
  EXPECT_EQ(kv.exit_code, 2) << kv.output;
  EXPECT_NE(kv.output.find("parallel.tp = 3"), std::string::npos) << kv.output;
  EXPECT_NE(kv.output.find("model.n_kv_head = 2"), std::string::npos) << kv.output;
  // A llama-only key on the GPT-2 family.
  write_text(dir + "/g.json", R"({"model": {"vocab_size": 32, "n_layer": 1, "n_head": 2,
    "n_embd": 16, "context_length": 16, "qk_norm": true}, "train": {"seq_len": 16}})");
  const CmdResult r = run_gtron({"train", "--config", dir + "/g.json", "--out", dir + "/run2"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("model.qk_norm"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace gtron
