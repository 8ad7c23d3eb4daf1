// model.moe's config: the shipped MoE config, and the checks of model.moe and parallel.ep against
// the rest of the config (trainer/config_moe.cc).
#include <gtest/gtest.h>

#include <string>

#include "tests/trainer/config_test_util.h"
#include "trainer/config.h"

namespace gtron {
namespace {

using testing::expect_text_error;
using testing::expect_user_error;
using testing::from_text;

TEST(ConfigFiles, MoeTinyLoadsAndValidates) {
  const Config c = load_config("configs/moe_tiny.json");
  const MoeConfig& moe = c.model.moe;
  EXPECT_EQ(c.model.arch, ModelArch::kLlama);
  EXPECT_EQ(moe.num_experts, 8);
  EXPECT_EQ(moe.top_k, 2);
  EXPECT_EQ(moe.num_shared_experts, 1);
  EXPECT_EQ(moe.expert_intermediate_size, 64);
  EXPECT_EQ(moe.first_dense_layers, 1);
  EXPECT_EQ(moe.router, MoeRouterChoice::kSigmoid);
  EXPECT_TRUE(moe.norm_topk_prob);
  EXPECT_DOUBLE_EQ(moe.bias_update_rate, 0.01);
  EXPECT_DOUBLE_EQ(moe.aux_loss_weight, 0.001);
  validate(c, 1);
  // The defaults: dense.
  const MoeConfig d = default_config().model.moe;
  EXPECT_EQ(d.num_experts, 0);
  EXPECT_EQ(d.top_k, 2);
  EXPECT_EQ(d.router, MoeRouterChoice::kSoftmax);
  EXPECT_EQ(d.expert_intermediate_size, 0);
  EXPECT_DOUBLE_EQ(d.aux_loss_weight, 0);
}

// model.moe: the llama family's, on the CPU with data, expert, GTP and TP parallelism; each
// refusal names the key.
TEST(ConfigErrors, MoeChecks) {
  const std::string llama = R"("arch": "llama", "n_layer": 2, "n_head": 4, "n_embd": 64)";
  auto moe = [&](const std::string& moe_keys, const std::string& rest = "") {
    return R"({"model": {)" + llama + R"(, "moe": {)" + moe_keys + "}}" + rest + "}";
  };
  from_text(moe(R"("num_experts": 4, "top_k": 2, "router": "sigmoid", "bias_update_rate": 0.01)"));
  // Set keys do nothing at num_experts = 0, the default (a dense llama or GPT-2 model).
  from_text(R"({"model": {"moe": {"top_k": 9, "first_dense_layers": 99}}})");
  expect_text_error(R"({"model": {"moe": {"num_experts": 4}}})",
                    {"model.moe.num_experts = 4", "model.arch = \"gpt2\"", "llama"});
  expect_text_error(moe(R"("num_experts": 4, "top_k": 5)"),
                    {"model.moe.top_k = 5", "model.moe.num_experts (4)"});
  expect_text_error(moe(R"("num_experts": 4, "top_k": 0)"), {"model.moe.top_k", ">= 1"});
  expect_text_error(moe(R"("num_experts": 4, "first_dense_layers": 2)"),
                    {"model.moe.first_dense_layers = 2", "model.n_layer (2)"});
  expect_text_error(moe(R"("num_experts": 4, "bias_update_rate": 0.001)"),
                    {"model.moe.bias_update_rate = 0.001", "sigmoid"});
  expect_text_error(moe(R"("num_experts": 4, "router": "top1")"),
                    {"model.moe.router", "softmax", "sigmoid"});
  expect_text_error(moe(R"("num_experts": 4, "aux_loss_weight": -1)"),
                    {"model.moe.aux_loss_weight"});
  // CUDA (Note [MoE on CUDA] in model/moe.h): expert parallelism without graphs, no FP8, at most
  // 512 experts.
  validate(from_text(moe(R"("num_experts": 4)", R"(, "train": {"device": "cuda"})")), 1);
  validate(from_text(moe(R"("num_experts": 4)", R"(, "train": {"device": "cuda", "global_batch": )"
                                                R"(16}, "parallel": {"ep": 2, "backend": "ipc"})")),
           2);
  expect_text_error(moe(R"("num_experts": 4)", R"(, "train": {"device": "cuda", "global_batch": )"
                                               R"(16}, "parallel": {"ep": 2}, "graphs": )"
                                               R"({"scope": "layers"})"),
                    {"graphs.scope = \"layers\"", "parallel.ep = 2", "on the host"});
  expect_text_error(
      moe(R"("num_experts": 4)", R"(, "train": {"device": "cuda", "precision": "fp8"})"),
      {"model.moe on CUDA", "train.precision = \"fp8\""});
  expect_text_error(moe(R"("num_experts": 513, "top_k": 2)", R"(, "train": {"device": "cuda"})"),
                    {"model.moe on CUDA", "model.moe.num_experts = 513", "at most 512"});
  // Graphs capture the MoE layer, but not a balance loss beside a block's output.
  validate(from_text(moe(R"("num_experts": 4)", R"(, "graphs": {"scope": "layers"})")), 1);
  expect_text_error(
      moe(R"("num_experts": 4, "aux_loss_weight": 0.01)", R"(, "graphs": {"scope": "layers"})"),
      {"graphs.scope = \"layers\"", "model.moe.aux_loss_weight = 0.01", "balance loss"});
  expect_text_error(moe(R"("num_experts": 4)", R"(, "train": {"recompute": "full"})"),
                    {"train.recompute = \"full\"", "model.moe"});
  // TP runs the MoE layer whole on every TP rank: not with sequence parallelism.
  expect_text_error(
      moe(R"("num_experts": 4)", R"(, "parallel": {"tp": 2, "sequence_parallel": true}, "train": )"
                                 R"({"global_batch": 16})"),
      {"parallel.sequence_parallel", "model.moe"});
  validate(from_text(moe(R"("num_experts": 4)",
                         R"(, "parallel": {"tp": 2}, "train": {"global_batch": 16})")),
           4);
  validate(from_text(moe(R"("num_experts": 4)",
                         R"(, "parallel": {"gtp": 2}, "train": {"global_batch": 16})")),
           2);
  // Expert parallelism (parallel.ep) and MoE MTP depths (mtp.moe) need experts; ep divides the
  // experts and the data ranks.
  validate(from_text(moe(R"("num_experts": 4)", R"(, "mtp": {"depth": 1, "moe": true})")), 1);
  expect_text_error(R"({"mtp": {"depth": 1, "moe": true}})",
                    {"mtp.moe = true", "model.moe.num_experts = 0"});
  expect_text_error(R"({"parallel": {"ep": 2}})",
                    {"parallel.ep = 2", "model.moe.num_experts = 0", "parallel.ep = 1"});
  expect_text_error(
      moe(R"("num_experts": 6)", R"(, "parallel": {"ep": 4})"),
      {"parallel.ep = 4: must divide model.moe.num_experts (6)", "use parallel.ep = 1, 2, 3 or 6"});
  const Config ep2 = from_text(
      moe(R"("num_experts": 4)", R"(, "parallel": {"ep": 2}, "train": {"global_batch": 32})"));
  validate(ep2, 2);
  validate(ep2, 4);
  expect_user_error([&] { validate(ep2, 3); },
                    {"parallel.ep = 2: must divide the data ranks (3", "use parallel.ep = 1 or 3"});
  const Config tp_ep =
      from_text(moe(R"("num_experts": 4)", R"(, "parallel": {"ep": 2, "tp": 2}, "train": )"
                                           R"({"global_batch": 16})"));
  validate(tp_ep, 4);
  expect_user_error([&] { validate(tp_ep, 2); },
                    {"parallel.ep = 2: must divide the data ranks (1 = world size 2 / parallel.tp "
                     "2)"});
  validate(from_text(moe(R"("num_experts": 4)", R"(, "train": {"global_batch": 16})")), 2);
}

// Every shipped config parses and validates at one process: a key that leaves the schema, or a
// combination validate() starts refusing, shows up here rather than in a user's first run.

}  // namespace
}  // namespace gtron
