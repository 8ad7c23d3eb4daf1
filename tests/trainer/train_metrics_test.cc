// What a run logs, through the CLI: step 1 is the first train record, validation records (main
// and every MTP depth) follow their step in metrics.jsonl, the console names the objective, and
// log.tensorboard writes the same scalars as a TensorBoard event file (read back by the tests'
// own reader, tests/trainer/tfevents_reader.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "tests/trainer/cli_util.h"
#include "tests/trainer/tfevents_reader.h"

namespace gtron {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::run_gtron;
using testing::temp_dir;
using testing::write_text;

// MTP D=2, λ = 0.3; log every 5 steps of 12, evaluate every 4.
const char kConfig[] = R"({
  "model": {"vocab_size": 64, "context_length": 16, "n_layer": 2, "n_head": 2, "n_embd": 32},
  "mtp": {"depth": 2, "loss_weight": 0.3},
  "data": {"synthetic": {"tokens": 50000, "val_tokens": 5000}},
  "train": {"steps": 12, "global_batch": 8, "micro_batch": 4, "seq_len": 16, "device": "cpu",
            "eval_every": 4, "eval_batches": 2},
  "log": {"every": 5}
})";

std::vector<json> records(const std::string& path) {
  std::vector<json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) out.push_back(json::parse(line));
  return out;
}

class TrainMetrics : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("OMP_NUM_THREADS", "1", 1);
    dir_ = temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    write_text(dir_ + "/c.json", kConfig);
  }
  testing::CmdResult train(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"train", "--config", dir_ + "/c.json", "--out", dir_ + "/r"};
    args.insert(args.end(), extra.begin(), extra.end());
    testing::CmdResult r = run_gtron(args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r;
  }
  std::string dir_;
};

TEST_F(TrainMetrics, StepOneValidationRecordsAndTheObjective) {
  const testing::CmdResult r = train();
  const std::vector<json> rs = records(dir_ + "/r/metrics.jsonl");
  std::vector<std::pair<std::string, int64_t>> order;
  for (const json& j : rs) order.emplace_back(j.at("split"), j.at("step"));
  // Train records at step 1 (always), the log.every multiples and the last step; val records after
  // the train record of their step (or after the step, when it is not logged), the last one the
  // final evaluation.
  const std::vector<std::pair<std::string, int64_t>> want = {
      {"train", 1},  {"val", 4},    {"train", 5}, {"val", 8},
      {"train", 10}, {"train", 12}, {"val", 12}};
  EXPECT_EQ(order, want);
  for (const json& j : rs) {
    if (j["split"] == "train") {
      ASSERT_EQ(j.at("mtp_losses").size(), 2u) << j;
      // Note [allocation kinds]: the peak split by kind is an object of GiB that adds up to the
      // peak (%.6g digits each), with the weights in it.
      const json& kinds = j.at("peak_gib_by_kind");
      ASSERT_TRUE(kinds.is_object()) << j;
      double sum = 0;
      for (const auto& [name, gib] : kinds.items()) sum += gib.get<double>();
      EXPECT_NEAR(sum, j.at("peak_mem_gib").get<double>(), 1e-5 * kinds.size()) << j;
      EXPECT_GT(kinds.at("weights").get<double>(), 0) << j;
      const double objective =
          j["main_loss"].get<double>() +
          0.3 / 2 * (j["mtp_losses"][0].get<double>() + j["mtp_losses"][1].get<double>());
      EXPECT_NEAR(j["loss"].get<double>(), objective, 1e-5) << j;
      continue;
    }
    ASSERT_EQ(j.at("val_mtp_losses").size(), 2u) << j;
    const double main = j.at("val_main_loss"), m1 = j["val_mtp_losses"][0],
                 m2 = j["val_mtp_losses"][1];
    EXPECT_GT(main, 0) << j;
    EXPECT_LT(main, std::log(64.0) + 1) << j;
    EXPECT_NEAR(j.at("val_loss").get<double>(), main + 0.3 / 2 * (m1 + m2), 1e-6) << j;
    EXPECT_EQ(j.at("val_tokens"), 2 * 4 * 16) << j;  // eval_batches x micro_batch x seq_len
  }
  // The final val record is the final line's loss.
  char final_line[64];
  std::snprintf(final_line, sizeof final_line, "final: val main loss %.4f",
                rs.back()["val_main_loss"].get<double>());
  EXPECT_NE(r.output.find(final_line), std::string::npos) << r.output;
  // The console: the legend once, "objective" beside "main", the eval lines.
  EXPECT_NE(r.output.find("columns: objective = main + 0.3/2 x sum(mtp), the loss minimized"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("step     1/12 | objective "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("eval step 4 | val objective "), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ + "/r/tensorboard")) << "log.tensorboard is off by default";
}

TEST_F(TrainMetrics, TensorBoardHoldsTheSameScalars) {
  train({"--set", "log.tensorboard=true"});
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir_ + "/r/tensorboard")) {
    files.push_back(e.path().string());
  }
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(fs::path(files[0]).filename().string().rfind("events.out.tfevents.", 0), 0u);
  const std::vector<testing::Event> events = testing::read_event_file(files[0]);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");

  // (step, tag) -> value, from the event file and from metrics.jsonl.
  std::map<std::pair<int64_t, std::string>, float> got;
  for (size_t i = 1; i < events.size(); ++i) {
    for (const auto& [tag, value] : events[i].values) {
      EXPECT_TRUE(got.emplace(std::make_pair(events[i].step, tag), value).second)
          << "step " << events[i].step << " tag " << tag << " twice";
    }
  }
  std::map<std::pair<int64_t, std::string>, double> want;
  for (const json& j : records(dir_ + "/r/metrics.jsonl")) {
    const int64_t s = j["step"];
    if (j["split"] == "train") {
      want[{s, "train/loss"}] = j["loss"];
      want[{s, "train/main_loss"}] = j["main_loss"];
      want[{s, "train/mtp_loss_1"}] = j["mtp_losses"][0];
      want[{s, "train/mtp_loss_2"}] = j["mtp_losses"][1];
      want[{s, "train/lr"}] = j["lr"];
      want[{s, "train/grad_norm"}] = j["grad_norm"];
      want[{s, "train/tokens_per_s"}] = j["tokens_per_s"];
    } else {
      want[{s, "val/loss"}] = j["val_loss"];
      want[{s, "val/main_loss"}] = j["val_main_loss"];
      want[{s, "val/mtp_loss_1"}] = j["val_mtp_losses"][0];
      want[{s, "val/mtp_loss_2"}] = j["val_mtp_losses"][1];
    }
  }
  ASSERT_EQ(want.size(), 4u * 7 + 3u * 4);  // 4 train steps x 7 tags, 3 evaluations x 4 tags
  std::vector<std::pair<int64_t, std::string>> got_keys, want_keys;
  for (const auto& kv : got) got_keys.push_back(kv.first);
  for (const auto& kv : want) want_keys.push_back(kv.first);
  ASSERT_EQ(got_keys, want_keys);
  for (const auto& [key, value] : want) {
    // metrics.jsonl prints 6 to 9 significant digits; the event holds the float.
    EXPECT_NEAR(got[key], value, 1e-5 * std::abs(value)) << key.first << " " << key.second;
  }
}

}  // namespace
}  // namespace gtron
