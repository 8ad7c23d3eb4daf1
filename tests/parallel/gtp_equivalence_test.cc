// End to end through the launcher (issue: GTP, acceptance 1): a tiny GPT with MTP D=2, 30 steps:
// 1 process vs GTP=2 vs GTP=4 vs DP=2 × GTP=2 give the same loss curve within 1e-4 relative (the
// gradient sums are reassociated: per-use wgrads are reduce-scattered across ranks), and the
// repeated-backward send-buffer reuse on vs off gives bit-identical losses.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/trainer/cli_util.h"

namespace gtron {
namespace {

using testing::metrics_loss_values;
using testing::metrics_losses;
using testing::run_gtron;
using testing::run_launcher;
using testing::temp_dir;
using testing::worst_relative;
using testing::write_text;

const char kConfig[] = R"({
  "model": {"vocab_size": 64, "context_length": 16, "n_layer": 2, "n_head": 2, "n_embd": 32},
  "mtp": {"depth": 2},
  "data": {"synthetic": {"tokens": 50000, "val_tokens": 5000}},
  "optimizer": {"lr": 3e-3},
  "schedule": {"warmup_steps": 5},
  "train": {"steps": 30, "global_batch": 8, "micro_batch": 2, "seq_len": 16, "device": "cpu"},
  "parallel": {"distributed_optimizer": true, "overlap_param_gather": true, "bucket_mb": 0.02},
  "log": {"every": 1}
})";

TEST(GtpEquivalence, LayoutsMatchOneProcess) {
  const std::string dir = temp_dir("gtp_equivalence");
  const std::string cfg = dir + "/c.json";
  write_text(cfg, kConfig);
  auto r = run_gtron({"train", "--config", cfg, "--out", dir + "/single"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> single = metrics_loss_values(dir + "/single/metrics.jsonl");
  ASSERT_EQ(single.size(), 30u);
  struct Layout {
    const char* name;
    int nproc;
    int gtp;
  };
  for (const Layout& l : {Layout{"gtp2", 2, 2}, Layout{"gtp4", 4, 4}, Layout{"dp2_gtp2", 4, 2}}) {
    const std::string out = dir + "/" + l.name;
    auto run = run_launcher(
        {"--standalone", "--nproc-per-node", std::to_string(l.nproc)},
        {"train", "--config", cfg, "--out", out, "--set", "parallel.gtp=" + std::to_string(l.gtp)});
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const std::vector<double> got = metrics_loss_values(out + "/metrics.jsonl");
    ASSERT_EQ(got.size(), 30u) << l.name;
    const double worst = worst_relative(single, got);
    std::printf("%s: worst relative difference over 30 steps %.3g\n", l.name, worst);
    EXPECT_LT(worst, 1e-4) << l.name;
  }
  // Reuse off: the same printed losses, digit for digit, as reuse on (gtp2 above).
  auto off =
      run_launcher({"--standalone", "--nproc-per-node", "2"},
                   {"train", "--config", cfg, "--out", dir + "/gtp2_noreuse", "--set",
                    "parallel.gtp=2", "--set", "parallel.gtp_reuse_repeated_send_buffer=false"});
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_EQ(metrics_losses(dir + "/gtp2/metrics.jsonl"),
            metrics_losses(dir + "/gtp2_noreuse/metrics.jsonl"));
}

TEST(GtpEquivalence, CheckpointsReshardAcrossGtpLayouts) {
  // A 1-process checkpoint resumed at GTP=2, and a GTP=2 checkpoint resumed by 1 process, continue
  // the same curve: checkpoints are unsharded and each layout takes its own rows.
  const std::string dir = temp_dir("gtp_reshard");
  const std::string cfg = dir + "/c.json";
  write_text(cfg, kConfig);
  const std::vector<std::string> every15 = {"--set", "checkpoint.every=15"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  ASSERT_EQ(run_gtron(with({"train", "--config", cfg, "--out", dir + "/one"}, every15)).exit_code,
            0);
  ASSERT_EQ(run_launcher(
                {"--standalone", "--nproc-per-node", "2"},
                with({"train", "--config", cfg, "--out", dir + "/two", "--set", "parallel.gtp=2"},
                     every15))
                .exit_code,
            0);
  const std::vector<double> one = metrics_loss_values(dir + "/one/metrics.jsonl");
  const std::vector<double> two = metrics_loss_values(dir + "/two/metrics.jsonl");
  ASSERT_EQ(one.size(), 30u);
  // Start each resumed run from the other layout's step-15 checkpoint only.
  for (const auto& [from, to] :
       {std::make_pair("one", "to_two"), std::make_pair("two", "to_one")}) {
    auto cp = testing::run_command("mkdir -p " + dir + "/" + to + "/checkpoints && cp -r " + dir +
                                   "/" + from + "/checkpoints/step_00000015 " + dir + "/" + to +
                                   "/checkpoints/ && cp -r " + dir + "/" + from + "/data " + dir +
                                   "/" + to + "/");
    ASSERT_EQ(cp.exit_code, 0) << cp.output;
  }
  auto r2 = run_launcher({"--standalone", "--nproc-per-node", "2"},
                         with({"train", "--config", cfg, "--out", dir + "/to_two", "--resume",
                               "--set", "parallel.gtp=2"},
                              every15));
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  auto r1 =
      run_gtron(with({"train", "--config", cfg, "--out", dir + "/to_one", "--resume"}, every15));
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  const std::vector<double> to_two = metrics_loss_values(dir + "/to_two/metrics.jsonl");
  const std::vector<double> to_one = metrics_loss_values(dir + "/to_one/metrics.jsonl");
  ASSERT_EQ(to_two.size(), 15u);
  ASSERT_EQ(to_one.size(), 15u);
  const std::vector<double> one_tail(one.begin() + 15, one.end());
  const std::vector<double> two_tail(two.begin() + 15, two.end());
  const double a = worst_relative(one_tail, to_two), b = worst_relative(two_tail, to_one);
  std::printf("1 process -> GTP=2: %.3g; GTP=2 -> 1 process: %.3g (steps 16..30)\n", a, b);
  EXPECT_LT(a, 1e-4);
  EXPECT_LT(b, 1e-4);
}

}  // namespace
}  // namespace gtron
