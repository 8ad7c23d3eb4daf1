// End to end through the CLI and the launcher (issue: graphs, acceptances 1 and 2): graphs.scope
// layers and full give the same printed losses, digit for digit, as none — for 1 process and for
// GTP=2 with MTP D=2 and overlap_param_gather, a mixture of experts too; and with DP=2 x GTP=2,
// skipping the ready callbacks before replays (the tests' switch) changes the losses, while the
// normal run does not.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/trainer/cli_util.h"

namespace gtron {
namespace {

using testing::metrics_losses;
using testing::run_gtron;
using testing::run_launcher;
using testing::temp_dir;
using testing::write_text;

// Tiny, 2 micro-batches per step on one process (1 on four): the graphs replay within a step and
// across steps. Small buckets: each DP bucket holds about one weight, so a stale read shows.
const char kConfig[] = R"({
  "model": {"vocab_size": 64, "context_length": 16, "n_layer": 4, "n_head": 2, "n_embd": 32},
  "mtp": {"depth": 2},
  "data": {"synthetic": {"tokens": 50000, "val_tokens": 5000}},
  "optimizer": {"lr": 3e-3},
  "schedule": {"warmup_steps": 3},
  "train": {"steps": 10, "global_batch": 8, "micro_batch": 2, "seq_len": 16, "device": "cpu"},
  "parallel": {"distributed_optimizer": true, "overlap_param_gather": true, "bucket_mb": 0.004},
  "log": {"every": 1}
})";

class Graphs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir("graphs");
    cfg_ = dir_ + "/c.json";
    write_text(cfg_, kConfig);
  }
  // Trains with `nproc` processes (1: without the launcher) and returns the printed losses.
  std::vector<std::string> train(const std::string& name, int nproc,
                                 const std::vector<std::string>& sets) {
    std::vector<std::string> args = {"train", "--config", cfg_, "--out", dir_ + "/" + name};
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    auto r = nproc == 1
                 ? run_gtron(args)
                 : run_launcher({"--standalone", "--nproc-per-node", std::to_string(nproc)}, args);
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    std::vector<std::string> losses = metrics_losses(dir_ + "/" + name + "/metrics.jsonl");
    EXPECT_EQ(losses.size(), 10u) << name;
    return losses;
  }
  std::string dir_, cfg_;
};

TEST_F(Graphs, OneProcessLayersAndFullMatchEager) {
  const auto none = train("none", 1, {});
  EXPECT_EQ(train("layers", 1, {"graphs.scope=layers"}), none);
  EXPECT_EQ(train("full", 1, {"graphs.scope=full"}), none);
  EXPECT_EQ(train("layers_warm3", 1, {"graphs.scope=layers", "graphs.warmup=3"}), none);
}

TEST_F(Graphs, GtpTwoWithMtpAndOverlapMatchesEager) {
  const auto none = train("gtp2_none", 2, {"parallel.gtp=2"});
  EXPECT_EQ(train("gtp2_layers", 2, {"parallel.gtp=2", "graphs.scope=layers"}), none);
  EXPECT_EQ(train("gtp2_full", 2, {"parallel.gtp=2", "graphs.scope=full"}), none);
}

// A mixture of experts without a balance loss (the sigmoid router's bias balances it, updated
// between steps from the load the replays counted), in main blocks 2 and 3 and both MTP depths,
// with a shared expert: its routing, plan and grouped experts replay as they ran.
TEST_F(Graphs, MixtureOfExpertsMatchesEager) {
  const std::vector<std::string> moe = {"model.arch=llama",
                                        "model.moe.num_experts=4",
                                        "model.moe.router=sigmoid",
                                        "model.moe.bias_update_rate=0.01",
                                        "model.moe.num_shared_experts=1",
                                        "model.moe.first_dense_layers=2",
                                        "mtp.moe=true"};
  auto with = [&moe](std::vector<std::string> more) {
    more.insert(more.begin(), moe.begin(), moe.end());
    return more;
  };
  const auto none = train("moe_none", 1, moe);
  EXPECT_EQ(train("moe_layers", 1, with({"graphs.scope=layers"})), none);
  EXPECT_EQ(train("moe_full", 1, with({"graphs.scope=full"})), none);
  const auto gtp_none = train("moe_gtp2_none", 2, with({"parallel.gtp=2"}));
  EXPECT_EQ(train("moe_gtp2_layers", 2, with({"parallel.gtp=2", "graphs.scope=layers"})), gtp_none);
}

TEST_F(Graphs, StaleParametersWithoutPreReplayReadiness) {
  const std::vector<std::string> layout = {"parallel.gtp=2", "graphs.scope=layers"};
  const auto eager = train("dp2gtp2_none", 4, {"parallel.gtp=2"});
  const auto ready = train("dp2gtp2_layers", 4, layout);
  EXPECT_EQ(ready, eager);
  ASSERT_EQ(setenv("GTRON_TEST_SKIP_PRE_REPLAY_READINESS", "1", 1), 0);
  const auto stale = train("dp2gtp2_stale", 4, layout);
  unsetenv("GTRON_TEST_SKIP_PRE_REPLAY_READINESS");
  ASSERT_EQ(stale.size(), eager.size());
  // Warmups (steps 1-2) and the capture step (3) run the ready callbacks; replays after the
  // next optimizer step read last step's shards.
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(stale[i], eager[i]) << "step " << i + 1;
  EXPECT_NE(std::vector<std::string>(stale.begin() + 3, stale.end()),
            std::vector<std::string>(eager.begin() + 3, eager.end()));
}

}  // namespace
}  // namespace gtron
