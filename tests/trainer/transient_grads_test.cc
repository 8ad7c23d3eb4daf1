// train.transient_grads (Note [transient gradients] in parallel/ddp.h) through the CLI: the same
// printed losses as the persistent gradient buffer for GPT-2 with MTP and a llama member, eager
// and under graphs.scope "full", at one process, DP = 2, GTP = 2 and TP = 2; a lower peak by the
// gradients' bytes, since they are no longer held beside the activations at the end of the
// forward; layouts it cannot serve exit 2 naming the key.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/trainer/cli_util.h"

namespace gtron {
namespace {

using testing::CmdResult;
using testing::metrics_losses;
using testing::read_text;
using testing::run_gtron;
using testing::run_launcher;
using testing::temp_dir;
using testing::write_text;

// Long sequences and a narrow model, so the activations outweigh the gradients; small buckets,
// so a bucket is a small part of them (a real model's 25 MiB buckets are).
const char kGpt2[] = R"({
  "model": {"vocab_size": 256, "context_length": 256, "n_layer": 4, "n_head": 2, "n_embd": 32},
  "mtp": {"depth": 2},
  "data": {"synthetic": {"tokens": 50000, "val_tokens": 5000}},
  "optimizer": {"lr": 3e-3},
  "schedule": {"warmup_steps": 2},
  "train": {"steps": 5, "global_batch": 8, "micro_batch": 8, "seq_len": 256, "device": "cpu"},
  "parallel": {"bucket_mb": 0.02},
  "log": {"every": 1}
})";

const char kLlama[] = R"({
  "model": {"arch": "llama", "vocab_size": 64, "context_length": 64, "n_layer": 2, "n_head": 4,
            "n_kv_head": 2, "n_embd": 32, "intermediate_size": 48, "qk_norm": true},
  "mtp": {"depth": 1},
  "data": {"synthetic": {"tokens": 50000, "val_tokens": 5000}},
  "optimizer": {"lr": 3e-3},
  "train": {"steps": 5, "global_batch": 4, "micro_batch": 4, "seq_len": 64, "device": "cpu"},
  "parallel": {"bucket_mb": 0.01},
  "log": {"every": 1}
})";

struct Trained {
  std::vector<std::string> losses;
  double peak_gib = 0;  // the last record's peak_mem_gib
  double params = 0;    // from the header line
  std::string output;
};

class TransientGrads : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = temp_dir("transient_grads"); }

  Trained train(const char* config, const std::string& name, const std::vector<std::string>& sets,
                int nproc = 1) {
    const std::string cfg = dir_ + "/" + name + ".json";
    write_text(cfg, config);
    std::vector<std::string> args = {"train", "--config", cfg, "--out", dir_ + "/" + name};
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    const CmdResult r =
        nproc == 1
            ? run_gtron(args)
            : run_launcher({"--standalone", "--nproc-per-node", std::to_string(nproc)}, args);
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    Trained t;
    t.output = r.output;
    t.losses = metrics_losses(dir_ + "/" + name + "/metrics.jsonl");
    EXPECT_EQ(t.losses.size(), 5u) << name;
    const std::string metrics = read_text(dir_ + "/" + name + "/metrics.jsonl");
    const size_t at = metrics.rfind("\"peak_mem_gib\": ");
    if (at != std::string::npos) t.peak_gib = std::atof(metrics.c_str() + at + 16);
    const size_t head = r.output.find("gtron train: ");
    if (head != std::string::npos) t.params = std::atof(r.output.c_str() + head + 13);
    return t;
  }

  // `sets` trained three times as name_kept, name_eager (transient) and name_full (transient,
  // graphs full); EXPECTs the two transient runs to print the kept run's losses.
  struct Three {
    Trained kept, eager, full;
  };
  Three expect_same_losses(const char* config, const std::string& name,
                           const std::vector<std::string>& sets, int nproc = 1) {
    std::vector<std::string> transient = sets, kept = sets;
    transient.push_back("train.transient_grads=true");
    kept.push_back("train.transient_grads=false");
    Three t;
    t.kept = train(config, name + "_kept", kept, nproc);
    t.eager = train(config, name + "_eager", transient, nproc);
    transient.push_back("graphs.scope=full");
    t.full = train(config, name + "_full", transient, nproc);
    EXPECT_EQ(t.eager.losses, t.kept.losses) << name << " eager";
    EXPECT_EQ(t.full.losses, t.kept.losses) << name << " graphs full";
    return t;
  }

  std::string dir_;
};

TEST_F(TransientGrads, Gpt2SameLossesLowerPeak) {
  const Three t = expect_same_losses(kGpt2, "gpt2", {});
  const Trained &kept = t.kept, &eager = t.eager, &full = t.full;
  // The start-up header says which it is.
  EXPECT_NE(kept.output.find("fp32 gradients"), std::string::npos) << kept.output;
  EXPECT_NE(kept.output.find("held for the run"), std::string::npos) << kept.output;
  EXPECT_NE(eager.output.find("transient (from each step's first write to the update)"),
            std::string::npos)
      << eager.output;
  // The peak is the end of the forward: the persistent run holds every gradient there (4 bytes a
  // parameter), the transient one none but a bucket or so.
  ASSERT_GT(kept.params, 0);
  const double grad_gib = 4.0 * kept.params / (1 << 30);
  EXPECT_GT(kept.peak_gib - eager.peak_gib, 0.8 * grad_gib)
      << kept.peak_gib << " GiB against " << eager.peak_gib;
  const Trained kept_full =
      train(kGpt2, "kept_full", {"graphs.scope=full", "train.transient_grads=false"});
  EXPECT_EQ(kept_full.losses, kept.losses);
  EXPECT_GT(kept_full.peak_gib - full.peak_gib, 0.8 * grad_gib)
      << kept_full.peak_gib << " GiB against " << full.peak_gib;
}

TEST_F(TransientGrads, TwoMicroBatchesEagerSameLosses) {
  // Eager, a bucket is zeroed at the step's first write and the second micro-batch adds to it.
  const std::vector<std::string> two = {"train.micro_batch=4"};
  std::vector<std::string> transient = two, kept = two;
  transient.push_back("train.transient_grads=true");
  kept.push_back("train.transient_grads=false");
  EXPECT_EQ(train(kGpt2, "accum_eager", transient).losses, train(kGpt2, "accum_kept", kept).losses);
}

TEST_F(TransientGrads, AutoIsOnWhereItCanServe) {
  // The default, "auto": transient eagerly and under graphs full with one micro-batch a step; held
  // under graphs layers and under full with two micro-batches, where true is refused.
  const char* kTransient = "transient (from each step's first write to the update)";
  const char* kHeldAuto = "held for the run (transient_grads auto";
  const Trained eager = train(kGpt2, "auto_eager", {});
  EXPECT_NE(eager.output.find(kTransient), std::string::npos) << eager.output;
  const Trained full = train(kGpt2, "auto_full", {"graphs.scope=full"});
  EXPECT_NE(full.output.find(kTransient), std::string::npos) << full.output;
  EXPECT_EQ(full.losses, eager.losses);
  const Trained layers = train(kGpt2, "auto_layers", {"graphs.scope=layers"});
  EXPECT_NE(layers.output.find(kHeldAuto), std::string::npos) << layers.output;
  EXPECT_EQ(layers.losses, eager.losses);
  const Trained accum = train(kGpt2, "auto_accum", {"graphs.scope=full", "train.micro_batch=4"});
  EXPECT_NE(accum.output.find(kHeldAuto), std::string::npos) << accum.output;
  // An explicit false holds them, without the auto note.
  const Trained off = train(kGpt2, "off", {"train.transient_grads=false"});
  EXPECT_NE(off.output.find("held for the run |"), std::string::npos) << off.output;
  EXPECT_EQ(off.losses, eager.losses);
}

TEST_F(TransientGrads, LlamaSameLosses) { expect_same_losses(kLlama, "llama", {}); }

TEST_F(TransientGrads, TwoDataRanksSameLosses) {
  // Gloo, the distributed optimizer: the buckets reduce-scatter from their transient memory.
  expect_same_losses(kGpt2, "dp2", {"train.global_batch=16", "parallel.distributed_optimizer=true"},
                     2);
}

TEST_F(TransientGrads, GtpAndTpSameLosses) {
  // GTP = 2 with MTP D = 2 (the head's repeated backwards finalize into one shard) and DP = 2 ×
  // GTP = 2 with overlapped gathers; TP = 2 above the llama member's one key/value head (the
  // replicated rows' gradients summed over TP after the reduction).
  expect_same_losses(kGpt2, "gtp2", {"parallel.gtp=2", "train.global_batch=16"}, 2);
  expect_same_losses(kGpt2, "dp2gtp2",
                     {"parallel.gtp=2", "train.global_batch=16", "train.micro_batch=4",
                      "parallel.distributed_optimizer=true", "parallel.overlap_param_gather=true"},
                     4);
  expect_same_losses(kLlama, "tp2", {"parallel.tp=2", "model.n_kv_head=1"}, 2);
}

TEST_F(TransientGrads, LayoutsItCannotServeExitTwo) {
  const std::string cfg = dir_ + "/bad.json";
  write_text(cfg, kGpt2);
  const std::vector<std::vector<std::string>> bad = {
      {"train.transient_grads=true", "graphs.scope=layers"},
      // Two micro-batches a step under one captured graph: the replay would zero the first sum.
      {"train.transient_grads=true", "graphs.scope=full", "train.micro_batch=4"},
  };
  for (const std::vector<std::string>& sets : bad) {
    const std::string out = dir_ + "/bad_out";
    std::vector<std::string> args = {"train", "--config", cfg, "--out", out};
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    const CmdResult r = run_gtron(args);
    EXPECT_EQ(r.exit_code, 2) << sets.back() << "\n" << r.output;
    EXPECT_NE(r.output.find("train.transient_grads"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(sets.back().substr(0, sets.back().find('='))), std::string::npos)
        << r.output;
    EXPECT_TRUE(read_text(out + "/metrics.jsonl").empty()) << "nothing trained";
  }
}

}  // namespace
}  // namespace gtron
